package supervise

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"syscall"
)

// Exec starts children as processes of the executable Path.
type Exec struct {
	Path string
	// Stderr receives the children's stderr lines, tagged "[name] "
	// (default os.Stderr).
	Stderr io.Writer
}

var _ Starter = (*Exec)(nil)

// Start runs e.Path with c's arguments and environment.
func (e *Exec) Start(c *Child) (Process, io.Reader, error) {
	cmd := exec.Command(e.Path, c.Args...)
	cmd.Env = append(os.Environ(), c.Env...)
	// Its own process group: a Ctrl-C at the terminal reaches the
	// supervisor alone, which then stops the children in order.
	// Pdeathsig: if the supervisor dies without stopping them, the
	// children get SIGTERM instead of living on (an orphaned embedding
	// worker would keep the store's lock).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	stderr := e.Stderr
	if stderr == nil {
		stderr = os.Stderr
	}
	pw := prefixWriter(stderr, "["+c.Name+"] ")
	cmd.Stderr = pw
	out, err := cmd.StdoutPipe()
	if err != nil {
		pw.Close()
		return nil, nil, fmt.Errorf("start %s: %w", c.Name, err)
	}
	if err := cmd.Start(); err != nil {
		pw.Close()
		return nil, nil, fmt.Errorf("start %s: %w", c.Name, err)
	}
	return &execProcess{cmd: cmd, stderr: pw}, out, nil
}

type execProcess struct {
	cmd    *exec.Cmd
	stderr io.Closer
}

var _ Process = (*execProcess)(nil)

func (p *execProcess) Signal(sig os.Signal) error { return p.cmd.Process.Signal(sig) }

func (p *execProcess) Wait() error {
	err := p.cmd.Wait()
	// Wait has copied all of stderr: end the tagging goroutine.
	p.stderr.Close()
	return err
}

// prefixWriter prefixes every line written to it before writing it to w;
// Close flushes the last line and returns once every line is written
// (up may exit right after its children: their last words are kept).
func prefixWriter(w io.Writer, prefix string) io.WriteCloser {
	pr, pw := io.Pipe()
	p := &prefixed{pw: pw, done: make(chan struct{})}
	go func() {
		defer close(p.done)
		br := bufio.NewReaderSize(pr, 64<<10)
		var line []byte
		start := true // the next byte starts a line
		for {
			chunk, err := br.ReadSlice('\n')
			if len(chunk) > 0 {
				// A line is one write, its prefix included, so that the
				// children's lines do not interleave; one longer than the
				// buffer goes out in pieces, each whole piece as it comes
				// (a long line once ended the tagging, and every later
				// line of the child was dropped).
				line = line[:0]
				if start {
					line = append(line, prefix...)
				}
				line = append(line, chunk...)
				start = chunk[len(chunk)-1] == '\n'
				if err != nil && err != bufio.ErrBufferFull && !start {
					line, start = append(line, '\n'), true // the last line, unended
				}
				_, _ = w.Write(line)
			}
			if err != nil && err != bufio.ErrBufferFull {
				// The pipe's end: drain anything left so the child
				// never blocks.
				_, _ = io.Copy(io.Discard, pr)
				return
			}
		}
	}()
	return p
}

type prefixed struct {
	pw   *io.PipeWriter
	done chan struct{}
}

func (p *prefixed) Write(b []byte) (int, error) { return p.pw.Write(b) }

func (p *prefixed) Close() error {
	err := p.pw.Close()
	<-p.done
	return err
}
