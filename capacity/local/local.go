// Package local is the lender of spare device slots on this host: it
// starts `prism serve dense` workers on them as child processes (through
// internal/supervise, as prism up starts its own), drains them with
// SIGTERM (a dense worker then leaves the router's registry at once and
// exits when its in-flight work is done) and stops them on return.
// Reclaims are injected: Reclaim (prism up's POST /loan/reclaim) or
// Options.ReclaimAfter, a lender that takes each worker back a fixed time
// after it serves.
package local

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

	"github.com/prism-serve/prism/capacity"
	"github.com/prism-serve/prism/internal/readyline"
	"github.com/prism-serve/prism/internal/supervise"
)

// Slot is one spare device of the host a lent worker runs on: a GPU or
// MIG slice (Env pins it: CUDA_VISIBLE_DEVICES) or a CPU core (no Env).
type Slot struct {
	Name string
	Env  []string
}

// Options configure the local lender.
type Options struct {
	// Max is how many workers it lends at once.
	Max int
	// Slots are the spare devices; with fewer than Max, workers share
	// them round-robin.
	Slots []Slot
	// Args are a lent worker's arguments to the prism binary (serve
	// dense, its plans, router, certificates), as prism up gives its own
	// dense workers; ArgsFor, when set, gives them per worker instead,
	// told its index among the workers lent at once (0 to Max-1, the
	// lowest one free), so each can have a certificate of its own.
	Args    []string
	ArgsFor func(index int) []string
	// Starter starts the processes (supervise.Exec of the prism binary).
	Starter supervise.Starter
	// Stdout gets the workers' output lines, tagged "[loanN] ".
	Stdout io.Writer
	// Logf reports what the lender does (default: discarded).
	Logf func(format string, args ...any)
	// ReadyTimeout bounds a worker's start (model load and warm-up)
	// until its ready line (default 10m).
	ReadyTimeout time.Duration
	// Grace: a worker still running this long after SIGTERM when the
	// lender closes is killed (default 30s).
	Grace time.Duration
	// ReclaimAfter, when positive, reclaims each worker this long after
	// it serves, with ReclaimGrace: a lender that wants its devices back.
	ReclaimAfter time.Duration
	// ReclaimGrace is the grace of reclaims that name none (default 30s).
	ReclaimGrace time.Duration
	// Hold keeps a reclaimed slot with the lender this long before it
	// may be lent again (0: at once).
	Hold time.Duration
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// EnsureDefaults fills zero fields.
func (o *Options) EnsureDefaults() {
	if o.Stdout == nil {
		o.Stdout = os.Stdout
	}
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
	if o.ReadyTimeout <= 0 {
		o.ReadyTimeout = 10 * time.Minute
	}
	if o.Grace <= 0 {
		o.Grace = 30 * time.Second
	}
	if o.ReclaimGrace <= 0 {
		o.ReclaimGrace = 30 * time.Second
	}
	if o.Now == nil {
		o.Now = time.Now
	}
}

// Validate checks o after EnsureDefaults.
func (o *Options) Validate() error {
	var errs []error
	if o.Max < 1 {
		errs = append(errs, fmt.Errorf("local lender: max %d, want at least 1", o.Max))
	}
	if len(o.Slots) == 0 {
		errs = append(errs, errors.New("local lender: no device slots"))
	}
	if len(o.Args) == 0 && o.ArgsFor == nil {
		errs = append(errs, errors.New("local lender: no worker command"))
	}
	if o.Starter == nil {
		errs = append(errs, errors.New("local lender: no process starter"))
	}
	if o.ReclaimAfter < 0 || o.Hold < 0 {
		errs = append(errs, errors.New("local lender: reclaim-after and hold must not be negative"))
	}
	return errors.Join(errs...)
}

// Provider lends workers on this host's spare slots.
type Provider struct {
	o        Options
	mu       sync.Mutex
	seq      int
	workers  map[string]*worker
	heldTill []time.Time // per slot index: a reclaimed slot stays with the lender
	reclaims chan capacity.ProviderReclaim
	closed   bool
}

// worker is one lent worker process.
type worker struct {
	id, model string
	slot      int
	// index is the worker's among those lent at once (Options.ArgsFor).
	index     int
	sup       *supervise.Supervisor
	cancel    context.CancelFunc // ends the start's wait
	proc      *tracked           // nil until the process started
	started   chan struct{}      // closed once Start returned
	addr      string
	lent      time.Time
	ready     time.Time
	draining  bool
	exited    bool
	reclaimed bool
	timer     *time.Timer // ReclaimAfter
}

var _ capacity.Provider = (*Provider)(nil)

// New returns the lender; o is defaulted and validated.
func New(o Options) (*Provider, error) {
	o.EnsureDefaults()
	if err := o.Validate(); err != nil {
		return nil, err
	}
	return &Provider{o: o, workers: map[string]*worker{}, heldTill: make([]time.Time, o.Max), reclaims: make(chan capacity.ProviderReclaim, 64)}, nil
}

func (p *Provider) Name() string { return "local" }

// slotOf is the device of slot index i (round-robin over Slots).
func (p *Provider) slotOf(i int) Slot { return p.o.Slots[i%len(p.o.Slots)] }

// freeSlots are the slot indexes neither lent nor held by the lender.
func (p *Provider) freeSlots(now time.Time) []int {
	used := make([]bool, p.o.Max)
	for _, w := range p.workers {
		used[w.slot] = true
	}
	var free []int
	for i := range p.o.Max {
		if !used[i] && !now.Before(p.heldTill[i]) {
			free = append(free, i)
		}
	}
	return free
}

func (p *Provider) Idle(context.Context) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return 0, nil
	}
	return len(p.freeSlots(p.o.Now())), nil
}

// Borrow starts n workers and returns their ids at once; each is
// Running and without an address until its ready line.
func (p *Provider) Borrow(_ context.Context, model string, n int) ([]string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, errors.New("local lender: closed")
	}
	free := p.freeSlots(p.o.Now())
	var ids []string
	for i := range n {
		if i >= len(free) {
			return ids, fmt.Errorf("local lender: %d of %d workers: no free slot (max %d)", n-i, n, p.o.Max)
		}
		p.seq++
		w := &worker{id: fmt.Sprintf("local/%d", p.seq), model: model, slot: free[i], index: p.freeIndex(), lent: p.o.Now(), started: make(chan struct{})}
		p.workers[w.id] = w
		ids = append(ids, w.id)
		p.start(w)
	}
	return ids, nil
}

// freeIndex is the lowest index no lent worker has. p.mu is held.
func (p *Provider) freeIndex() int {
	used := map[int]bool{}
	for _, w := range p.workers {
		used[w.index] = true
	}
	i := 0
	for used[i] {
		i++
	}
	return i
}

// start launches w's process and waits for its ready line in the
// background. p.mu is held.
func (p *Provider) start(w *worker) {
	slot := p.slotOf(w.slot)
	args := p.o.Args
	if p.o.ArgsFor != nil {
		args = p.o.ArgsFor(w.index)
	}
	child := &supervise.Child{Name: fmt.Sprintf("loan%d", p.seq), Args: args, Env: slot.Env, Ready: readyline.Dense}
	w.sup = supervise.New(supervise.Options{
		Starter: &trackingStarter{inner: p.o.Starter, started: func(t *tracked) {
			p.mu.Lock()
			w.proc = t
			p.mu.Unlock()
			go func() {
				<-t.exited
				p.mu.Lock()
				w.exited = true
				p.mu.Unlock()
				p.o.Logf("lent worker %s exited", w.id)
			}()
		}},
		Stdout: p.o.Stdout,
		Grace:  p.o.Grace,
	})
	ctx, cancel := context.WithCancel(context.Background())
	w.cancel = cancel
	p.o.Logf("lending %s on %s", w.id, slot.Name)
	go func() {
		defer close(w.started)
		addr, err := w.sup.Start(ctx, child, p.o.ReadyTimeout)
		p.mu.Lock()
		defer p.mu.Unlock()
		if err != nil {
			if !w.draining {
				p.o.Logf("lent worker %s did not start: %v", w.id, err)
			}
			if w.proc == nil {
				w.exited = true // no process was started
			}
			// Else its exit says so: a drain that gave up the wait (ctx)
			// leaves the process running until Return kills it; taken
			// for exited, it was listed as not running and Return sent no
			// kill, then waited out the whole grace at Shutdown.
			return
		}
		w.addr, w.ready = addr, p.o.Now()
		p.o.Logf("lent worker %s serves at %s, %s after it was lent", w.id, addr, w.ready.Sub(w.lent).Round(time.Millisecond))
		// Not for a worker Close or Return cancelled as its ready line
		// came: their timers are stopped already, and this one would
		// reclaim from a closed lender.
		if p.o.ReclaimAfter > 0 && !p.closed && !w.draining && p.workers[w.id] == w {
			id := w.id
			w.timer = time.AfterFunc(p.o.ReclaimAfter, func() { _, _ = p.Reclaim(id, p.o.ReclaimGrace) })
		}
	}()
}

func (p *Provider) signal(w *worker, sig os.Signal) {
	if w.proc != nil && !w.exited {
		_ = w.proc.Signal(sig)
	}
}

// Drain sends the worker SIGTERM: it leaves the router's registry at
// once and exits when what it holds is done.
func (p *Provider) Drain(_ context.Context, id string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	w := p.workers[id]
	if w == nil {
		return fmt.Errorf("local lender: drain %s: not lent", id)
	}
	w.draining = true
	if w.addr == "" {
		w.cancel() // still starting: give up the wait, Return stops it
	}
	p.signal(w, syscall.SIGTERM)
	return nil
}

// Return stops the worker (killing it if it still runs) and frees its
// slot; a reclaimed slot stays with the lender for Options.Hold.
func (p *Provider) Return(_ context.Context, id string) error {
	p.mu.Lock()
	w := p.workers[id]
	if w == nil {
		p.mu.Unlock()
		return fmt.Errorf("local lender: return %s: not lent", id)
	}
	if !w.exited && w.proc != nil {
		p.o.Logf("lent worker %s still runs at its return: killed", id)
	}
	p.signal(w, os.Kill)
	w.cancel()
	if w.timer != nil {
		w.timer.Stop()
	}
	delete(p.workers, id)
	if w.reclaimed {
		p.heldTill[w.slot] = p.o.Now().Add(p.o.Hold)
	}
	p.mu.Unlock()
	<-w.started
	w.sup.Shutdown()
	return nil
}

// Workers are the workers lent now.
func (p *Provider) Workers() []capacity.LentWorker {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]capacity.LentWorker, 0, len(p.workers))
	for _, w := range p.workers {
		out = append(out, capacity.LentWorker{ID: w.id, Model: w.model, Addr: w.addr, Running: !w.exited, Draining: w.draining, Lent: w.lent, Ready: w.ready})
	}
	slices.SortFunc(out, func(a, b capacity.LentWorker) int { return a.Lent.Compare(b.Lent) })
	return out
}

func (p *Provider) Reclaims() <-chan capacity.ProviderReclaim { return p.reclaims }

// Reclaim takes a lent worker back with grace (<= 0: ReclaimGrace): id
// names it, or "" the longest-serving one not draining. It returns the
// worker's id.
func (p *Provider) Reclaim(id string, grace time.Duration) (string, error) {
	if grace <= 0 {
		grace = p.o.ReclaimGrace
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	var w *worker
	if id != "" {
		w = p.workers[id]
		if w == nil {
			return "", fmt.Errorf("local lender: reclaim %s: not lent", id)
		}
	} else {
		for _, c := range p.workers {
			if c.addr != "" && !c.draining && !c.reclaimed && (w == nil || c.ready.Before(w.ready)) {
				w = c
			}
		}
		if w == nil {
			return "", errors.New("local lender: reclaim: no lent worker serves")
		}
	}
	if w.reclaimed {
		return w.id, nil
	}
	select {
	case p.reclaims <- capacity.ProviderReclaim{Worker: w.id, Grace: grace, At: p.o.Now()}:
	default:
		return "", errors.New("local lender: reclaim: too many reclaims waiting")
	}
	w.reclaimed = true
	p.o.Logf("lender reclaims %s with %s grace", w.id, grace)
	return w.id, nil
}

// Close stops every lent worker: SIGTERM (they drain), then a kill
// after Grace. Nothing is lent afterwards.
func (p *Provider) Close() {
	p.mu.Lock()
	p.closed = true
	ws := make([]*worker, 0, len(p.workers))
	for _, w := range p.workers {
		ws = append(ws, w)
		w.cancel()
		if w.timer != nil {
			w.timer.Stop()
		}
	}
	p.mu.Unlock()
	var wg sync.WaitGroup
	for _, w := range ws {
		wg.Go(func() {
			<-w.started
			w.sup.Shutdown()
		})
	}
	wg.Wait()
}

// trackingStarter hands each process it starts to started, so the
// lender can signal it and learn when it exits.
type trackingStarter struct {
	inner   supervise.Starter
	started func(*tracked)
}

func (s *trackingStarter) Start(c *supervise.Child) (supervise.Process, io.Reader, error) {
	p, out, err := s.inner.Start(c)
	if err != nil {
		return nil, nil, err
	}
	t := &tracked{Process: p, exited: make(chan struct{})}
	s.started(t)
	return t, out, nil
}

// tracked closes exited once the process's Wait returns (the
// supervisor calls it once).
type tracked struct {
	supervise.Process
	exited chan struct{}
}

func (t *tracked) Wait() error {
	err := t.Process.Wait()
	close(t.exited)
	return err
}
