// Package supervise runs child processes that announce themselves with a
// ready line (internal/readyline): it starts each and waits for its
// address, restarts the ones that die, and stops them all in stages at
// shutdown. Processes come from a Starter, so tests drive the supervisor
// with fake children in-process; Exec is the real one.
package supervise

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/prism-serve/prism/internal/readyline"
)

// Child is one supervised process, restarted in place when it dies. The
// caller fills the exported fields before Start and leaves them alone
// afterwards.
type Child struct {
	// Name tags the child's output lines ("[name] ...") and messages.
	Name string
	Args []string
	// Env is added to the supervisor's own environment.
	Env []string
	// Ready is the line announcing the child's address on stdout.
	Ready readyline.Line
	// Stage orders shutdown: every child of a stage has exited before
	// the next stage (a higher number) is signalled.
	Stage int

	// Guarded by Supervisor.mu.
	proc Process
	// done is closed once the current process has exited; err is then
	// its exit status. One goroutine per process calls Wait.
	done chan struct{}
	err  error
}

// Process is one running child process.
type Process interface {
	Signal(os.Signal) error
	// Wait waits for the exit; the supervisor calls it once, after the
	// process's stdout has ended.
	Wait() error
}

// Starter starts processes.
type Starter interface {
	// Start starts one process of c; the supervisor reads stdout to its end.
	Start(c *Child) (p Process, stdout io.Reader, err error)
}

// Options configure a Supervisor.
type Options struct {
	Starter Starter
	// Stdout receives the children's stdout lines, tagged "[name] "
	// (default os.Stdout).
	Stdout io.Writer
	// Logf reports restarts and children killed at shutdown (default:
	// discarded).
	Logf func(format string, args ...any)
	// Grace is how long a child has to exit after SIGTERM at shutdown
	// before it is killed (default 15s).
	Grace time.Duration
	// Force, once closed, ends the grace of every child Shutdown is
	// stopping or is yet to stop: they are killed at once (a second
	// Ctrl-C from a user who will not wait for the drain). Nil: never.
	Force <-chan struct{}
	// RestartDelay is the pause before a dead child is started again
	// (default 1s), so a child that cannot start does not spin.
	RestartDelay time.Duration
	// MaxRestartDelay caps the pause (default 30s): it doubles from
	// RestartDelay with each restart that fails or whose process dies
	// within MaxRestartDelay of its start, and is RestartDelay again
	// after a process that lived longer.
	MaxRestartDelay time.Duration
}

// EnsureDefaults fills unset fields.
func (o *Options) EnsureDefaults() {
	if o.Stdout == nil {
		o.Stdout = os.Stdout
	}
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
	if o.Grace <= 0 {
		o.Grace = 15 * time.Second
	}
	if o.RestartDelay <= 0 {
		o.RestartDelay = time.Second
	}
	if o.MaxRestartDelay <= 0 {
		o.MaxRestartDelay = 30 * time.Second
	}
	o.MaxRestartDelay = max(o.MaxRestartDelay, o.RestartDelay)
}

// Supervisor owns its children's processes from Start to Shutdown.
type Supervisor struct {
	o     Options
	outMu sync.Mutex // one echoed line at a time on o.Stdout
	// mu guards the children's process state, the list and stopping: a
	// process registered after stopping is set is stopped at once.
	mu       sync.Mutex
	children []*Child
	stopping bool
	halt     chan struct{} // closed with stopping
	// starting counts the processes being started (from the check of
	// stopping to their registration in the child): Shutdown waits for
	// them, so none is left running unwaited.
	starting sync.WaitGroup
}

// ErrStopping: Start was called after Shutdown began.
var ErrStopping = errors.New("supervisor is shutting down")

// New returns a supervisor with no children.
func New(o Options) *Supervisor {
	o.EnsureDefaults()
	return &Supervisor{o: o, halt: make(chan struct{})}
}

// Start starts c's process and returns the address of its ready line,
// waiting up to timeout. A child that exits before it is ready, or is
// not ready in time (it is then killed), is an error; so is ctx ending
// (the process is then left to Shutdown). c stays the supervisor's from
// here on: Shutdown stops it even when Start failed.
func (s *Supervisor) Start(ctx context.Context, c *Child, timeout time.Duration) (string, error) {
	s.mu.Lock()
	if s.stopping {
		s.mu.Unlock()
		return "", fmt.Errorf("start %s: %w", c.Name, ErrStopping)
	}
	if !slices.Contains(s.children, c) {
		s.children = append(s.children, c)
	}
	s.starting.Add(1)
	s.mu.Unlock()
	p, stdout, err := s.o.Starter.Start(c)
	if err != nil {
		s.starting.Done()
		return "", err
	}
	done := make(chan struct{})
	s.mu.Lock()
	c.proc, c.done = p, done
	s.mu.Unlock()
	// Registered: a Shutdown that began meanwhile stops this process.
	s.starting.Done()
	w := readyline.Start(stdout, c.Ready, readyline.WatchOptions{Echo: func(line string) {
		s.outMu.Lock()
		fmt.Fprintf(s.o.Stdout, "[%s] %s\n", c.Name, line)
		s.outMu.Unlock()
	}})
	go func() {
		<-w.Done()
		err := p.Wait()
		s.mu.Lock()
		c.err = err
		s.mu.Unlock()
		close(done)
	}()
	addr, err := w.Await(ctx, timeout)
	switch {
	case errors.Is(err, readyline.ErrExited):
		<-done
		// Its exit status too: a child killed outright (the kernel's
		// OOM killer, a SIGKILL) leaves no log line that says so.
		s.mu.Lock()
		status := c.err
		s.mu.Unlock()
		if status == nil {
			return "", fmt.Errorf("%s exited before it was ready (see its log above)", c.Name)
		}
		return "", fmt.Errorf("%s exited before it was ready: %v (see its log above)", c.Name, status)
	case errors.Is(err, readyline.ErrTimeout):
		_ = p.Signal(os.Kill)
		<-done
		return "", fmt.Errorf("%s not ready after %s", c.Name, timeout)
	case err != nil:
		return "", fmt.Errorf("%s: %w", c.Name, err)
	case addr == "":
		// Nobody could dial it; workers told to announce to "" would
		// never register.
		return "", fmt.Errorf("%s printed its ready line without an address", c.Name)
	}
	return addr, nil
}

// Supervise restarts c, once started, whenever its process exits, until
// Shutdown begins or ctx ends; each restart waits up to timeout for the
// ready line, and a child that keeps dying is restarted ever less often
// (Options.MaxRestartDelay). It returns at once.
func (s *Supervisor) Supervise(ctx context.Context, c *Child, timeout time.Duration) {
	go func() {
		delay, started, failed := s.o.RestartDelay, time.Now(), false
		for {
			err := s.wait(c)
			if s.halted() || ctx.Err() != nil {
				return
			}
			if !failed && time.Since(started) >= s.o.MaxRestartDelay {
				delay = s.o.RestartDelay
			}
			if failed {
				s.o.Logf("restarting %s in %s", c.Name, delay)
			} else {
				s.o.Logf("%s exited (%v); restarting in %s", c.Name, err, delay)
			}
			select {
			case <-ctx.Done():
				return
			case <-s.halt:
				return
			case <-time.After(delay):
			}
			delay = min(2*delay, s.o.MaxRestartDelay)
			_, err = s.Start(ctx, c, timeout)
			started, failed = time.Now(), err != nil
			if err != nil && !s.halted() && ctx.Err() == nil {
				s.o.Logf("restarting %s: %v", c.Name, err)
			}
		}
	}()
}

// Shutdown stops every child, stage by stage (the children of one stage
// in parallel): SIGTERM, then SIGKILL after Grace. No child is started
// or restarted once it has begun; a start already under way is waited
// for and then stopped with the rest. It returns when all have exited.
func (s *Supervisor) Shutdown() {
	s.mu.Lock()
	if !s.stopping {
		s.stopping = true
		close(s.halt)
	}
	s.mu.Unlock()
	s.starting.Wait()
	s.mu.Lock()
	children := slices.Clone(s.children)
	s.mu.Unlock()
	var stages []int
	for _, c := range children {
		if !slices.Contains(stages, c.Stage) {
			stages = append(stages, c.Stage)
		}
	}
	slices.Sort(stages)
	for _, stage := range stages {
		var wg sync.WaitGroup
		for _, c := range children {
			if c.Stage == stage {
				wg.Add(1)
				go func() { defer wg.Done(); s.stop(c) }()
			}
		}
		wg.Wait()
	}
}

func (s *Supervisor) halted() bool {
	select {
	case <-s.halt:
		return true
	default:
		return false
	}
}

func (s *Supervisor) signal(c *Child, sig os.Signal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c.proc != nil {
		_ = c.proc.Signal(sig)
	}
}

// wait blocks until c's current process exits (at once if none started).
func (s *Supervisor) wait(c *Child) error {
	s.mu.Lock()
	done := c.done
	s.mu.Unlock()
	if done == nil {
		return nil
	}
	<-done
	s.mu.Lock()
	defer s.mu.Unlock()
	return c.err
}

// stop sends SIGTERM and waits up to Grace for the exit (or until
// Force is closed), then kills, saying so: a shutdown that took the
// whole grace said nothing of the child it waited for.
func (s *Supervisor) stop(c *Child) {
	s.signal(c, syscall.SIGTERM)
	exited := make(chan struct{})
	go func() { s.wait(c); close(exited) }()
	grace := time.NewTimer(s.o.Grace)
	defer grace.Stop()
	select {
	case <-exited:
		return
	case <-s.o.Force:
		select {
		case <-exited:
			return
		default:
		}
		s.o.Logf("killing %s: stop forced", c.Name)
	case <-grace.C:
		s.o.Logf("%s still running %s after SIGTERM: killed", c.Name, s.o.Grace)
	}
	s.signal(c, os.Kill)
	<-exited
}
