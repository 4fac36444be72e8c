package local

import (
	"context"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prism-serve/prism/internal/supervise"
)

// fakeStarter starts in-process workers: each prints its ready line
// ("dense tier listening on ...") and, on SIGTERM, exits after hold
// (finishing what it holds); a kill ends it at once.
type fakeStarter struct {
	mu   sync.Mutex
	n    int
	hold time.Duration
	// stuck workers never print their ready line and ignore SIGTERM (a
	// worker hung in its start-up): only a kill ends them.
	stuck  bool
	envs   [][]string
	args   [][]string
	events []string
}

type fakeProc struct {
	s    *fakeStarter
	name string
	out  *io.PipeWriter
	once sync.Once
	done chan struct{}
}

func (f *fakeStarter) Start(c *supervise.Child) (supervise.Process, io.Reader, error) {
	pr, pw := io.Pipe()
	f.mu.Lock()
	f.n++
	n := f.n
	f.envs = append(f.envs, c.Env)
	f.args = append(f.args, c.Args)
	f.mu.Unlock()
	p := &fakeProc{s: f, name: c.Name, out: pw, done: make(chan struct{})}
	if !f.stuck {
		go c.Ready.Write(pw, fmt.Sprintf("127.0.0.1:%d", 2000+n))
	}
	return p, pr, nil
}

func (f *fakeStarter) record(ev string) {
	f.mu.Lock()
	f.events = append(f.events, ev)
	f.mu.Unlock()
}

func (p *fakeProc) exit() { p.once.Do(func() { p.out.Close(); close(p.done) }) }

func (p *fakeProc) Signal(sig os.Signal) error {
	select {
	case <-p.done:
		return os.ErrProcessDone
	default:
	}
	switch sig {
	case syscall.SIGTERM:
		p.s.record("term " + p.name)
		if !p.s.stuck {
			time.AfterFunc(p.s.hold, p.exit)
		}
	case os.Kill:
		p.s.record("kill " + p.name)
		p.exit()
	}
	return nil
}

func (p *fakeProc) Wait() error { <-p.done; return nil }

func newLender(t *testing.T, s *fakeStarter, o Options) *Provider {
	t.Helper()
	o.Starter, o.Args, o.Stdout = s, []string{"serve", "dense"}, io.Discard
	p, err := New(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if ok() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}

func TestBorrowDrainReturn(t *testing.T) {
	s := &fakeStarter{hold: 50 * time.Millisecond}
	p := newLender(t, s, Options{Max: 2, Slots: []Slot{{Name: "gpu1", Env: []string{"CUDA_VISIBLE_DEVICES=GPU-1"}}}})
	ctx := context.Background()
	ids, err := p.Borrow(ctx, "m", 3)
	if len(ids) != 2 || err == nil || !strings.Contains(err.Error(), "no free slot") {
		t.Fatalf("borrow 3 of 2: %v, %v", ids, err)
	}
	if n, _ := p.Idle(ctx); n != 0 {
		t.Errorf("idle %d with every slot lent", n)
	}
	waitFor(t, "both serving", func() bool {
		for _, w := range p.Workers() {
			if w.Addr == "" {
				return false
			}
		}
		return true
	})
	for _, env := range s.envs {
		if len(env) != 1 || env[0] != "CUDA_VISIBLE_DEVICES=GPU-1" {
			t.Errorf("worker env %v: the slot's pinning is missing", env)
		}
	}
	// Drain: SIGTERM, the worker finishes and exits by itself.
	if err := p.Drain(ctx, ids[0]); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the drained worker's exit", func() bool {
		for _, w := range p.Workers() {
			if w.ID == ids[0] {
				return !w.Running && w.Draining
			}
		}
		return false
	})
	if err := p.Return(ctx, ids[0]); err != nil {
		t.Fatal(err)
	}
	if n, _ := p.Idle(ctx); n != 1 {
		t.Errorf("idle %d after a return, want 1", n)
	}
	// Return without waiting for the drain: killed.
	s.hold = time.Hour
	p.Drain(ctx, ids[1])
	if err := p.Return(ctx, ids[1]); err != nil {
		t.Fatal(err)
	}
	got := strings.Join(s.events, ",")
	if got != "term loan1,term loan2,kill loan2" {
		t.Errorf("signals %s", got)
	}
	if len(p.Workers()) != 0 {
		t.Errorf("workers left: %v", p.Workers())
	}
}

func TestReclaim(t *testing.T) {
	s := &fakeStarter{hold: 10 * time.Millisecond}
	p := newLender(t, s, Options{Max: 2, Slots: []Slot{{Name: "cpu"}}, ReclaimAfter: 30 * time.Millisecond, ReclaimGrace: 7 * time.Second, Hold: time.Hour})
	ctx := context.Background()
	if _, err := p.Reclaim("", 0); err == nil {
		t.Error("a reclaim with nothing lent")
	}
	ids, _ := p.Borrow(ctx, "m", 1)
	select {
	case r := <-p.Reclaims():
		if r.Worker != ids[0] || r.Grace != 7*time.Second {
			t.Errorf("reclaim %+v", r)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("reclaim-after never reclaimed")
	}
	p.Drain(ctx, ids[0])
	p.Return(ctx, ids[0])
	// The reclaimed slot stays with the lender.
	if n, _ := p.Idle(ctx); n != 1 {
		t.Errorf("idle %d, want 1 (the reclaimed slot is held)", n)
	}
	// An injected reclaim names the longest-serving worker.
	ids, _ = p.Borrow(ctx, "m", 1)
	waitFor(t, "serving", func() bool { return p.Workers()[0].Addr != "" })
	id, err := p.Reclaim("", 2*time.Second)
	if err != nil || id != ids[0] {
		t.Fatalf("reclaim: %q, %v", id, err)
	}
	if r := <-p.Reclaims(); r.Grace != 2*time.Second || r.At.IsZero() || r.At.After(time.Now()) {
		t.Errorf("grace %v, at %v: want 2s from the reclaim (the controller times the deadline from it)", r.Grace, r.At)
	}
}

// TestDrainWhileStarting: a worker drained before its ready line (a
// reclaim, or a borrow given up) whose process does not exit on SIGTERM
// is listed as running until it exits, and Return kills it at once.
// Taken for exited when the drain gave up the wait, it was listed as not
// running and Return sent no kill, then waited out the whole grace.
func TestDrainWhileStarting(t *testing.T) {
	s := &fakeStarter{stuck: true}
	const grace = 20 * time.Second
	p := newLender(t, s, Options{Max: 1, Slots: []Slot{{Name: "cpu0"}}, Grace: grace})
	ctx := context.Background()
	ids, err := p.Borrow(ctx, "m", 1)
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the worker's process", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.n == 1
	})
	if err := p.Drain(ctx, ids[0]); err != nil {
		t.Fatal(err)
	}
	p.mu.Lock()
	w := p.workers[ids[0]]
	p.mu.Unlock()
	<-w.started // the start's wait has ended (cancelled by the drain)
	if ws := p.Workers(); len(ws) != 1 || !ws[0].Running || !ws[0].Draining {
		t.Fatalf("after a drain while starting: %+v, want it running (its process has not exited) and draining", ws)
	}
	start := time.Now()
	if err := p.Return(ctx, ids[0]); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > grace/2 {
		t.Fatalf("Return took %v: the worker was not killed but waited out its grace", d)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !slices.Contains(s.events, "kill loan1") {
		t.Fatalf("events %v, want the worker killed at its return", s.events)
	}
}

// TestArgsForIndexes: with ArgsFor, each worker lent at once gets the
// arguments of an index of its own (prism up: a certificate of its
// own), the lowest free one, reused once its worker is returned.
func TestArgsForIndexes(t *testing.T) {
	s := &fakeStarter{}
	p, err := New(Options{Max: 3, Slots: []Slot{{Name: "cpu"}}, Starter: s, Stdout: io.Discard,
		ArgsFor: func(i int) []string { return []string{"serve", "dense", "--certs", fmt.Sprintf("dense-%d", 1+i)} }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	ctx := context.Background()
	// certs are the certificate folders of the starts from the from-th
	// on, once there are n in all, sorted (workers start concurrently).
	certs := func(from, n int) string {
		waitFor(t, fmt.Sprint(n, " starts"), func() bool {
			s.mu.Lock()
			defer s.mu.Unlock()
			return len(s.args) == n
		})
		s.mu.Lock()
		defer s.mu.Unlock()
		var out []string
		for _, a := range s.args[from:] {
			out = append(out, a[len(a)-1])
		}
		slices.Sort(out)
		return strings.Join(out, ",")
	}
	ids, err := p.Borrow(ctx, "m", 2)
	if err != nil {
		t.Fatal(err)
	}
	if got := certs(0, 2); got != "dense-1,dense-2" {
		t.Fatalf("two lent at once: %s", got)
	}
	// The first (index 0, given as Borrow lends it) returned: the next
	// two take index 0 again and index 2.
	if err := p.Return(ctx, ids[0]); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Borrow(ctx, "m", 2); err != nil {
		t.Fatal(err)
	}
	if got := certs(2, 4); got != "dense-1,dense-3" {
		t.Fatalf("after a return, two more: %s, want the returned one's and dense-3", got)
	}
	// Three lent at once hold three certificates.
	seen := map[string]bool{}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, a := range s.args {
		seen[a[len(a)-1]] = true
	}
	if len(seen) != 3 {
		t.Fatalf("certificates used: %v", seen)
	}
}
