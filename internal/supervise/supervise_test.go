package supervise

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prism-serve/prism/internal/readyline"
)

// fakes starts in-process fake children and records what happens to them.
type fakes struct {
	mu     sync.Mutex
	events []string // "start NAME", "term NAME", "kill NAME", "exit NAME"
	procs  map[string][]*fakeProc
	// behave says how the next process of a child acts: "ready" (the
	// default), "silent" (never ready), "noaddr" (a ready line without
	// an address), "die" (exits before ready),
	// "stubborn" (ready, ignores SIGTERM).
	behave map[string]string
	// gate, when set, holds Start until it is closed; entered then
	// receives a value as Start reaches it.
	gate    chan struct{}
	entered chan struct{}
}

func newFakes() *fakes { return &fakes{procs: map[string][]*fakeProc{}, behave: map[string]string{}} }

var _ Starter = (*fakes)(nil)

func (f *fakes) Start(c *Child) (Process, io.Reader, error) {
	f.mu.Lock()
	gate, entered := f.gate, f.entered
	f.mu.Unlock()
	if gate != nil {
		entered <- struct{}{}
		<-gate
	}
	pr, pw := io.Pipe()
	p := &fakeProc{f: f, name: c.Name, out: pw, exited: make(chan struct{}), at: time.Now()}
	f.mu.Lock()
	n := len(f.procs[c.Name])
	f.procs[c.Name] = append(f.procs[c.Name], p)
	how := f.behave[c.Name]
	p.stubborn = how == "stubborn"
	f.events = append(f.events, "start "+c.Name)
	f.mu.Unlock()
	go func() {
		fmt.Fprintln(pw, "starting")
		switch how {
		case "die":
			p.exit(fmt.Errorf("exit status 2"))
		case "silent":
		case "noaddr":
			fmt.Fprintln(pw, c.Ready.Prefix())
		default:
			c.Ready.Write(pw, fmt.Sprintf("127.0.0.1:%d", 1000+n))
		}
	}()
	return p, pr, nil
}

func (f *fakes) record(ev string) {
	f.mu.Lock()
	f.events = append(f.events, ev)
	f.mu.Unlock()
}

func (f *fakes) log() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.events...)
}

func (f *fakes) started(name string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.procs[name])
}

func (f *fakes) proc(name string, i int) *fakeProc {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.procs[name][i]
}

type fakeProc struct {
	at       time.Time // started
	f        *fakes
	name     string
	out      *io.PipeWriter
	stubborn bool
	once     sync.Once
	exited   chan struct{}
	err      error
	mu       sync.Mutex
	sigs     []os.Signal
}

var _ Process = (*fakeProc)(nil)

func (p *fakeProc) Signal(sig os.Signal) error {
	p.mu.Lock()
	p.sigs = append(p.sigs, sig)
	p.mu.Unlock()
	select {
	case <-p.exited:
		return os.ErrProcessDone
	default:
	}
	switch {
	case sig == os.Kill:
		p.f.record("kill " + p.name)
		p.exit(fmt.Errorf("signal: killed"))
	case !p.stubborn:
		p.f.record("term " + p.name)
		// A tier takes a moment to drain: the next stage must wait for it.
		go func() { time.Sleep(20 * time.Millisecond); p.exit(nil) }()
	}
	return nil
}

func (p *fakeProc) signals() []os.Signal {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]os.Signal(nil), p.sigs...)
}

// exit ends the process: its stdout closes, Wait returns err.
func (p *fakeProc) exit(err error) {
	p.once.Do(func() {
		p.err = err
		p.f.record("exit " + p.name)
		p.out.Close()
		close(p.exited)
	})
}

func (p *fakeProc) Wait() error { <-p.exited; return p.err }

type logs struct {
	mu    sync.Mutex
	lines []string
}

func (l *logs) logf(format string, args ...any) {
	l.mu.Lock()
	l.lines = append(l.lines, fmt.Sprintf(format, args...))
	l.mu.Unlock()
}

func (l *logs) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}

func newSup(f *fakes, l *logs) *Supervisor {
	return New(Options{Starter: f, Stdout: io.Discard, Logf: l.logf, Grace: 200 * time.Millisecond, RestartDelay: 10 * time.Millisecond})
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("never: %s", what)
}

func TestStartReturnsAddress(t *testing.T) {
	f := newFakes()
	s := newSup(f, &logs{})
	defer s.Shutdown()
	addr, err := s.Start(context.Background(), &Child{Name: "dense0", Ready: readyline.Dense}, time.Second)
	if err != nil || addr != "127.0.0.1:1000" {
		t.Fatalf("Start = %q, %v", addr, err)
	}
}

func TestRestartAfterCrash(t *testing.T) {
	f := newFakes()
	l := &logs{}
	s := newSup(f, l)
	defer s.Shutdown()
	c := &Child{Name: "embedding0", Ready: readyline.Embedding}
	if _, err := s.Start(context.Background(), c, time.Second); err != nil {
		t.Fatal(err)
	}
	s.Supervise(context.Background(), c, time.Second)
	f.proc("embedding0", 0).exit(fmt.Errorf("signal: killed"))
	eventually(t, "a second process", func() bool { return f.started("embedding0") == 2 })
	// And again: the restarted process is supervised too.
	eventually(t, "the second ready", func() bool { return strings.Count(strings.Join(f.log(), "|"), "start embedding0") == 2 })
	f.proc("embedding0", 1).exit(fmt.Errorf("exit status 1"))
	eventually(t, "a third process", func() bool { return f.started("embedding0") == 3 })
	if !strings.Contains(l.String(), "embedding0 exited (signal: killed); restarting") {
		t.Errorf("log lacks the restart note:\n%s", l)
	}
}

func TestRestartRetriesAChildThatCannotStart(t *testing.T) {
	f := newFakes()
	l := &logs{}
	s := newSup(f, l)
	defer s.Shutdown()
	c := &Child{Name: "dense0", Ready: readyline.Dense}
	if _, err := s.Start(context.Background(), c, time.Second); err != nil {
		t.Fatal(err)
	}
	s.Supervise(context.Background(), c, time.Second)
	f.mu.Lock()
	f.behave["dense0"] = "die"
	f.mu.Unlock()
	f.proc("dense0", 0).exit(nil)
	eventually(t, "repeated restarts", func() bool { return f.started("dense0") >= 3 })
	if !strings.Contains(l.String(), "restarting dense0: dense0 exited before it was ready") {
		t.Errorf("log lacks the failed restart:\n%s", l)
	}
}

// TestShutdownInStages: each stage has exited before the next is signalled.
func TestShutdownInStages(t *testing.T) {
	f := newFakes()
	s := newSup(f, &logs{})
	children := []*Child{
		{Name: "router", Ready: readyline.Router, Stage: 0},
		{Name: "dense0", Ready: readyline.Dense, Stage: 2},
		{Name: "dense1", Ready: readyline.Dense, Stage: 2},
		{Name: "embedding0", Ready: readyline.Embedding, Stage: 1},
		{Name: "embedding1", Ready: readyline.Embedding, Stage: 1},
	}
	stage := map[string]int{}
	for _, c := range children {
		stage[c.Name] = c.Stage
		if _, err := s.Start(context.Background(), c, time.Second); err != nil {
			t.Fatal(err)
		}
	}
	s.Shutdown()
	ev := f.log()
	lastExit := map[int]int{}
	firstTerm := map[int]int{}
	for i, e := range ev {
		kind, name, _ := strings.Cut(e, " ")
		st := stage[name]
		switch kind {
		case "exit":
			lastExit[st] = i
		case "term":
			if _, ok := firstTerm[st]; !ok {
				firstTerm[st] = i
			}
		case "kill":
			t.Errorf("%s was killed; it exits on SIGTERM", name)
		}
	}
	for st := range 2 {
		if lastExit[st] > firstTerm[st+1] {
			t.Errorf("stage %d signalled before stage %d had exited: %v", st+1, st, ev)
		}
	}
	if n := strings.Count(strings.Join(ev, "|"), "exit "); n != len(children) {
		t.Errorf("%d exits, want %d: %v", n, len(children), ev)
	}
}

func TestNoRestartAfterShutdown(t *testing.T) {
	f := newFakes()
	s := newSup(f, &logs{})
	c := &Child{Name: "dense0", Ready: readyline.Dense, Stage: 2}
	if _, err := s.Start(context.Background(), c, time.Second); err != nil {
		t.Fatal(err)
	}
	s.Supervise(context.Background(), c, time.Second)
	s.Shutdown()
	time.Sleep(100 * time.Millisecond) // ten restart delays
	if n := f.started("dense0"); n != 1 {
		t.Fatalf("%d processes started, want 1 (no restart once shutdown began)", n)
	}
}

// TestRestartRacingShutdown: a restart under way when shutdown begins
// has its process stopped, and Shutdown returns only after it exited.
func TestRestartRacingShutdown(t *testing.T) {
	f := newFakes()
	s := newSup(f, &logs{})
	c := &Child{Name: "embedding0", Ready: readyline.Embedding, Stage: 1}
	if _, err := s.Start(context.Background(), c, time.Second); err != nil {
		t.Fatal(err)
	}
	gate, entered := make(chan struct{}), make(chan struct{}, 1)
	f.mu.Lock()
	f.gate, f.entered = gate, entered
	f.mu.Unlock()
	s.Supervise(context.Background(), c, time.Second)
	f.proc("embedding0", 0).exit(fmt.Errorf("signal: killed"))
	<-entered // the restart is under way, held at the gate
	stopped := make(chan struct{})
	go func() { s.Shutdown(); close(stopped) }()
	select {
	case <-stopped:
		t.Fatal("Shutdown returned while a start was under way")
	case <-time.After(50 * time.Millisecond):
	}
	close(gate)
	<-stopped // Shutdown waited for the late process and stopped it
	if n := f.started("embedding0"); n != 2 {
		t.Fatalf("%d processes started, want 2", n)
	}
	late := f.proc("embedding0", 1)
	select {
	case <-late.exited:
	default:
		t.Fatal("Shutdown returned with the late process still running")
	}
	if sigs := late.signals(); len(sigs) == 0 || sigs[0] != syscall.SIGTERM {
		t.Errorf("late process got %v, want SIGTERM first", sigs)
	}
}

func TestReadyTimeout(t *testing.T) {
	f := newFakes()
	f.behave["embedding0"] = "silent"
	s := newSup(f, &logs{})
	defer s.Shutdown()
	_, err := s.Start(context.Background(), &Child{Name: "embedding0", Ready: readyline.Embedding}, 30*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "embedding0 not ready after 30ms") {
		t.Fatalf("Start: %v", err)
	}
	if sigs := f.proc("embedding0", 0).signals(); len(sigs) != 1 || sigs[0] != os.Kill {
		t.Errorf("a child not ready in time got %v, want a kill", sigs)
	}
}

func TestExitBeforeReady(t *testing.T) {
	f := newFakes()
	f.behave["router"] = "die"
	s := newSup(f, &logs{})
	defer s.Shutdown()
	_, err := s.Start(context.Background(), &Child{Name: "router", Ready: readyline.Router}, time.Minute)
	if err == nil || !strings.Contains(err.Error(), "router exited before it was ready") {
		t.Fatalf("Start: %v", err)
	}
	// How it ended: a child killed outright logs nothing that says so.
	if !strings.Contains(err.Error(), "exit status 2") {
		t.Errorf("Start: %v, which does not say how the child ended", err)
	}
}

func TestStartCancelled(t *testing.T) {
	f := newFakes()
	f.behave["embedding0"] = "silent"
	s := newSup(f, &logs{})
	ctx, cancel := context.WithCancel(context.Background())
	go func() { time.Sleep(20 * time.Millisecond); cancel() }()
	if _, err := s.Start(ctx, &Child{Name: "embedding0", Ready: readyline.Embedding}, time.Minute); err == nil {
		t.Fatal("Start returned no error after its context ended")
	}
	// The process is still the supervisor's to stop.
	s.Shutdown()
	if sigs := f.proc("embedding0", 0).signals(); len(sigs) == 0 || sigs[0] != syscall.SIGTERM {
		t.Errorf("got %v, want SIGTERM at shutdown", sigs)
	}
}

func TestShutdownKillsAfterGrace(t *testing.T) {
	f := newFakes()
	f.behave["dense0"] = "stubborn"
	s := newSup(f, &logs{})
	if _, err := s.Start(context.Background(), &Child{Name: "dense0", Ready: readyline.Dense}, time.Second); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	s.Shutdown()
	if el := time.Since(start); el < 200*time.Millisecond {
		t.Errorf("shutdown took %v, less than the grace", el)
	}
	if sigs := f.proc("dense0", 0).signals(); len(sigs) != 2 || sigs[0] != syscall.SIGTERM || sigs[1] != os.Kill {
		t.Errorf("got %v, want SIGTERM then a kill", sigs)
	}
}

// TestShutdownForced: children that ignore SIGTERM are killed as soon
// as Force is closed, not a grace later, each stage's in turn, and the
// log names each one killed. Without Force, a stubborn child is killed
// after the grace with a line that says so (the shutdown said nothing
// of what it waited for).
func TestShutdownForced(t *testing.T) {
	for _, tc := range []struct {
		name    string
		force   bool
		grace   time.Duration
		atLeast time.Duration // the shutdown's least duration
		atMost  time.Duration
		log     []string
	}{
		{name: "grace", grace: 200 * time.Millisecond, atLeast: 400 * time.Millisecond, atMost: 5 * time.Second,
			log: []string{"router still running 200ms after SIGTERM: killed", "embedding0 still running 200ms after SIGTERM: killed"}},
		{name: "forced", force: true, grace: time.Minute, atMost: 5 * time.Second,
			log: []string{"killing router: stop forced", "killing embedding0: stop forced"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakes()
			f.behave["router"], f.behave["embedding0"] = "stubborn", "stubborn"
			l := &logs{}
			force := make(chan struct{})
			s := New(Options{Starter: f, Stdout: io.Discard, Logf: l.logf, Grace: tc.grace, Force: force})
			for i, name := range []string{"router", "embedding0", "dense0"} {
				if _, err := s.Start(context.Background(), &Child{Name: name, Ready: readyline.Dense, Stage: i}, time.Second); err != nil {
					t.Fatal(err)
				}
			}
			if tc.force {
				time.AfterFunc(50*time.Millisecond, func() { close(force) })
			}
			start := time.Now()
			s.Shutdown()
			el := time.Since(start)
			if el < tc.atLeast || el > tc.atMost {
				t.Errorf("shutdown took %v, want %v to %v", el, tc.atLeast, tc.atMost)
			}
			for _, name := range []string{"router", "embedding0"} {
				if sigs := f.proc(name, 0).signals(); len(sigs) != 2 || sigs[0] != syscall.SIGTERM || sigs[1] != os.Kill {
					t.Errorf("%s got %v, want SIGTERM then a kill", name, sigs)
				}
			}
			for _, want := range tc.log {
				if !strings.Contains(l.String(), want) {
					t.Errorf("log lacks %q:\n%s", want, l.String())
				}
			}
			if tc.force {
				return // dense0, draining when its stage came, is killed too
			}
			if sigs := f.proc("dense0", 0).signals(); len(sigs) != 1 || sigs[0] != syscall.SIGTERM {
				t.Errorf("dense0 (which stops on SIGTERM) got %v, want SIGTERM alone", sigs)
			}
			if strings.Contains(l.String(), "dense0") {
				t.Errorf("log names dense0, which exited on SIGTERM:\n%s", l.String())
			}
		})
	}
}

func TestEchoTagsLines(t *testing.T) {
	f := newFakes()
	var out strings.Builder
	s := New(Options{Starter: f, Stdout: &out})
	c := &Child{Name: "dense0", Ready: readyline.Dense}
	if _, err := s.Start(context.Background(), c, time.Second); err != nil {
		t.Fatal(err)
	}
	s.Shutdown()
	want := "[dense0] starting\n[dense0] dense tier listening on 127.0.0.1:1000\n"
	s.outMu.Lock()
	got := out.String()
	s.outMu.Unlock()
	if got != want {
		t.Errorf("echoed %q, want %q", got, want)
	}
}

// TestStartAfterShutdown: once shutdown began nothing starts.
func TestStartAfterShutdown(t *testing.T) {
	f := newFakes()
	s := newSup(f, &logs{})
	s.Shutdown()
	_, err := s.Start(context.Background(), &Child{Name: "router", Ready: readyline.Router}, time.Second)
	if !errors.Is(err, ErrStopping) {
		t.Fatalf("Start after Shutdown: %v, want ErrStopping", err)
	}
	if n := f.started("router"); n != 0 {
		t.Fatalf("%d processes started after Shutdown", n)
	}
}

// TestReadyWithoutAddress: a ready line naming no address is an error,
// not an address "" for the workers to dial.
func TestReadyWithoutAddress(t *testing.T) {
	f := newFakes()
	f.behave["router"] = "noaddr"
	s := newSup(f, &logs{})
	_, err := s.Start(context.Background(), &Child{Name: "router", Ready: readyline.Router}, time.Second)
	if err == nil || !strings.Contains(err.Error(), "router printed its ready line without an address") {
		t.Fatalf("Start: %v", err)
	}
	s.Shutdown()
}

// TestRestartBacksOff: a child that keeps failing is restarted ever less
// often, the pause doubling (up to MaxRestartDelay), not every RestartDelay.
func TestRestartBacksOff(t *testing.T) {
	f := newFakes()
	l := &logs{}
	s := newSup(f, l) // RestartDelay 10ms
	defer s.Shutdown()
	c := &Child{Name: "dense0", Ready: readyline.Dense}
	if _, err := s.Start(context.Background(), c, time.Second); err != nil {
		t.Fatal(err)
	}
	s.Supervise(context.Background(), c, time.Second)
	f.mu.Lock()
	f.behave["dense0"] = "die"
	f.mu.Unlock()
	f.proc("dense0", 0).exit(fmt.Errorf("exit status 1"))
	eventually(t, "seven starts", func() bool { return f.started("dense0") >= 7 })
	// Pauses 10, 20, 40, 80, 160 ms before starts 1 to 5 (0 is the first).
	for i, want := range []time.Duration{10, 20, 40, 80, 160} {
		gap := f.proc("dense0", i+1).at.Sub(f.proc("dense0", i).at)
		if gap < want*time.Millisecond*9/10 {
			t.Errorf("restart %d after %s, want at least %dms (backoff)\n%s", i+1, gap, want, l)
		}
	}
}
