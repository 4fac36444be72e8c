// Package readyline is the start-up handshake between Prism's processes:
// once a tier listens it prints one line to stdout naming its address,
// and whoever started it (prism up, the tests, scripts/demo.sh and
// scripts/bench-serve.sh through sed) reads the address from that line.
// The lines' text is a contract: the scripts match it byte for byte.
package readyline

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
)

// Line is one kind of ready line: a fixed prefix, then the address as
// the first word after it.
type Line struct{ prefix string }

// The lines Prism's processes print.
var (
	// Router: "router listening on ADDR (metrics MADDR)", followed by
	// " (http HADDR)" when it serves HTTP/JSON (RouterHTTP).
	Router = Line{"router listening on "}
	// Embedding: "embedding tier listening on ADDR".
	Embedding = Line{"embedding tier listening on "}
	// Dense: "dense tier listening on ADDR".
	Dense = Line{"dense tier listening on "}
	// Up: "Prism is up: Recommend at ADDR (models ...; N dense, M embedding workers). Ctrl-C stops it."
	Up = Line{"Prism is up: Recommend at "}
)

// New is a ready line with its own prefix, for processes outside the
// serving tiers (test children).
func New(prefix string) Line { return Line{prefix} }

// Prefix is the text before the address.
func (l Line) Prefix() string { return l.prefix }

// Parse reports whether line is l's ready line and returns the address
// ("" when the line ends at the prefix).
func (l Line) Parse(line string) (addr string, ok bool) {
	rest, ok := strings.CutPrefix(line, l.prefix)
	if !ok {
		return "", false
	}
	if f := strings.Fields(rest); len(f) > 0 {
		return f[0], true
	}
	return "", true
}

// Find is Parse for a line that may carry text before the prefix (a
// supervisor's "[name] " tag, a log's timestamp).
func (l Line) Find(line string) (addr string, ok bool) {
	i := strings.Index(line, l.prefix)
	if i < 0 {
		return "", false
	}
	return l.Parse(line[i:])
}

// Write prints l's line for addr; rest, when given, follows the address
// after a space.
func (l Line) Write(w io.Writer, addr string, rest ...string) error {
	s := l.prefix + addr
	if len(rest) > 0 {
		s += " " + strings.Join(rest, " ")
	}
	_, err := fmt.Fprintln(w, s)
	return err
}

// WriteRouter prints the router's line; httpAddr, when not "", is its
// HTTP/JSON address, after the metrics one (the line without it is
// unchanged, byte for byte).
func WriteRouter(w io.Writer, addr, metricsAddr, httpAddr string) error {
	rest := []string{"(metrics " + metricsAddr + ")"}
	if httpAddr != "" {
		rest = append(rest, httpPrefix+httpAddr+")")
	}
	return Router.Write(w, addr, rest...)
}

const httpPrefix = "(http "

// RouterHTTP is the HTTP/JSON address a router's ready line names (a
// line of Router, anywhere in line), "" when it names none.
func RouterHTTP(line string) string {
	if _, ok := Router.Find(line); !ok {
		return ""
	}
	_, rest, ok := strings.Cut(line, httpPrefix)
	if !ok {
		return ""
	}
	a, _, ok := strings.Cut(rest, ")")
	if !ok {
		return ""
	}
	return a
}

// WriteEmbedding prints the embedding tier's line.
func WriteEmbedding(w io.Writer, addr string) error { return Embedding.Write(w, addr) }

// WriteDense prints the dense tier's line.
func WriteDense(w io.Writer, addr string) error { return Dense.Write(w, addr) }

// WriteUp prints prism up's line once every tier has registered.
func WriteUp(w io.Writer, addr string, models []string, dense, embedding int) error {
	return Up.Write(w, addr, fmt.Sprintf("(models %s; %d dense, %d embedding workers). Ctrl-C stops it.", strings.Join(models, ", "), dense, embedding))
}

// Errors of Watch.Await.
var (
	// ErrExited: the output ended (the process exited) before the ready line.
	ErrExited = errors.New("exited before it was ready")
	// ErrTimeout: no ready line in time.
	ErrTimeout = errors.New("not ready in time")
)

// Watch reads a process's stdout until it ends, looking for a ready line.
type Watch struct {
	addr chan string
	done chan struct{}
}

// WatchOptions configure Watch.
type WatchOptions struct {
	// Echo, when set, receives every line (the ready line included),
	// in order, on the reading goroutine.
	Echo func(line string)
	// Anywhere matches the prefix anywhere in a line (Line.Find), for
	// output that tags its lines; otherwise only at the start.
	Anywhere bool
}

// Start reads r to its end on a goroutine of its own. The caller owns r
// and must not read it; Done says when it is drained (for exec.Cmd, call
// Wait only after that).
func Start(r io.Reader, l Line, o WatchOptions) *Watch {
	w := &Watch{addr: make(chan string, 1), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		sent := false
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			if o.Echo != nil {
				o.Echo(line)
			}
			if sent {
				continue
			}
			parse := l.Parse
			if o.Anywhere {
				parse = l.Find
			}
			if a, ok := parse(line); ok {
				w.addr <- a
				sent = true
			}
		}
		// A line too long for the scanner ends scanning; keep draining so
		// the process never blocks on a full pipe.
		_, _ = io.Copy(io.Discard, r)
		if !sent {
			close(w.addr)
		}
	}()
	return w
}

// Ready receives the address once, or is closed when the output ended
// without a ready line.
func (w *Watch) Ready() <-chan string { return w.addr }

// Done is closed once the output has ended and been read.
func (w *Watch) Done() <-chan struct{} { return w.done }

// Await waits up to timeout (0: no limit) or until ctx ends for the
// ready line and returns its address; ErrExited when the output ended
// first, ErrTimeout after timeout.
func (w *Watch) Await(ctx context.Context, timeout time.Duration) (string, error) {
	var expire <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		expire = t.C
	}
	select {
	case a, ok := <-w.addr:
		if !ok {
			return "", ErrExited
		}
		return a, nil
	case <-expire:
		return "", fmt.Errorf("%w (%s)", ErrTimeout, timeout)
	case <-ctx.Done():
		return "", ctx.Err()
	}
}
