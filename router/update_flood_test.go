package router

import (
	"context"
	"encoding/binary"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
)

// A flood of embedding updates (thousands a second, a thousand waiting
// for their model's turn) keeps the update driver's lock busy: what
// else takes it must not scale with the flood, or wait for it.

// errCounting is a context that counts the calls of its Err.
type errCounting struct {
	context.Context
	n *atomic.Int64
}

func (c errCounting) Err() error {
	c.n.Add(1)
	return c.Context.Err()
}

// TestDriverStepReadsNoWaitingContext: a step of the update driver
// reads the context of no update waiting for its model's turn (it read
// every one, under the driver's lock: with a thousand waiting, three
// quarters of each step), yet the waiting updates are numbered, merged
// and answered as before once their turn comes.
func TestDriverStepReadsNoWaitingContext(t *testing.T) {
	d, req, gate, _ := gatedDriver(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	first := make(chan error, 1)
	go func() { _, err := d.update(ctx, req(0)); first <- err }()
	<-gate.entered // update 1 holds the model's turn at its worker

	const waiting = 50
	var reads atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, waiting)
	for i := range waiting {
		wg.Go(func() {
			_, err := d.update(errCounting{ctx, &reads}, req(int64(i+1)))
			errs <- err
		})
	}
	for queued := false; !queued; {
		d.mu.Lock()
		queued = len(d.clients) == waiting+1
		d.mu.Unlock()
		time.Sleep(time.Millisecond)
	}
	reads.Store(0)
	for range 10 {
		d.step(func(time.Time) {}) // an event that numbers nothing
	}
	if n := reads.Load(); n != 0 {
		t.Errorf("10 steps with %d updates waiting read their contexts %d times, want none", waiting, n)
	}
	close(gate.open)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("a waiting update: %v", err)
		}
	}
	d.wait()
	d.mu.Lock()
	defer d.mu.Unlock()
	if m := d.seq.models["m"]; m == nil || m.next < 2 || m.next > waiting+1 || m.committed != m.next {
		t.Errorf("model's sequence %+v: want the waiting updates merged into 1-%d numbers, all acknowledged", m, waiting)
	}
}

// TestRouterCollectorsWithoutDriverLock: a scrape of the router's own
// collectors returns while the update driver's lock is held (a flood of
// updates holds it most of the time: the scrape that read the update
// log's bytes under it timed out), and reports the log's bytes as of
// the driver's last step.
func TestRouterCollectorsWithoutDriverLock(t *testing.T) {
	rig := newUpdateRig(t, Options{UpdateLogBytes: 1 << 20, UpdateQuorum: QuorumOne}, &seqCN{})
	for i := range 5 {
		if _, err := rig.update("t", int64(i), 1); err != nil {
			t.Fatal(err)
		}
	}
	d := rig.r.upd
	d.mu.Lock()
	want := d.seq.models["m"].bytes
	reg := prometheus.NewRegistry()
	reg.MustRegister(updateLogCollector{rig.r}, opsCollector{rig.r}, copyLagCollector{rig.r}, &rig.r.preds)
	done := make(chan string, 1)
	go func() { done <- gatherText(t, reg, "prism_router_update_log_bytes") }()
	select {
	case got := <-done:
		d.mu.Unlock()
		if want <= 0 {
			t.Fatalf("the update log holds %d bytes after 5 updates", want)
		}
		if w := "prism_router_update_log_bytes{model=\"m\"} " + strconv.FormatFloat(float64(want), 'g', -1, 64); !strings.Contains(got, w) {
			t.Errorf("scrape:\n%s\nwant %s", got, w)
		}
	case <-time.After(10 * time.Second):
		d.mu.Unlock()
		<-done
		t.Fatal("a scrape waited for the update driver's lock")
	}
}

// endedUnseen is a context whose Err says it ended while its Done never
// closes: its caller has not yet told the driver (the window between a
// caller's end and its own cancel step).
type endedUnseen struct{ context.Context }

func (endedUnseen) Err() error { return context.Canceled }

// TestEndedCallerNotNumbered: with no step reading the waiting
// updates' contexts, an update whose caller ended before its turn came,
// and whose caller has not yet taken it out of the queue, is still not
// numbered: not when its turn comes (startNext), nor merged into the
// update ahead of it (gather). It would be applied with no one told. It
// is answered its context's end; the others are numbered and applied.
func TestEndedCallerNotNumbered(t *testing.T) {
	for _, tc := range []struct {
		name  string
		ended int // which of the three waiting updates (ids 1-3) ended
	}{
		{"at the head of the queue", 1},
		{"behind the head, merged with it", 2},
	} {
		t.Run(tc.name, func(t *testing.T) { endedCallerNotNumbered(t, tc.ended) })
	}
}

func endedCallerNotNumbered(t *testing.T, ended int) {
	d, req, gate, applied := gatedDriver(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	first := make(chan error, 1)
	go func() { _, err := d.update(ctx, req(0)); first <- err }()
	<-gate.entered // update 0 holds the model's turn; 1-3 wait behind it
	errs := make([]chan error, 4)
	for id := 1; id <= 3; id++ {
		errs[id] = make(chan error, 1)
		c := context.Context(ctx)
		if id == ended {
			c = endedUnseen{ctx}
		}
		go func() { _, err := d.update(c, req(int64(id))); errs[id] <- err }()
		for queued := false; !queued; {
			d.mu.Lock()
			queued = len(d.clients) == id+1
			d.mu.Unlock()
			time.Sleep(time.Millisecond)
		}
	}
	close(gate.open)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	for id := 1; id <= 3; id++ {
		err := <-errs[id]
		switch {
		case id == ended && status.Code(err) != codes.Canceled:
			t.Errorf("update %d, its caller ended: %v, want Canceled", id, err)
		case id != ended && err != nil:
			t.Errorf("update %d: %v", id, err)
		}
	}
	d.wait()
	got := applied()
	for id := int64(1); id <= 3; id++ {
		if slices.Contains(got, id) == (id == int64(ended)) {
			t.Errorf("applied ids %v: want every one but %d (its caller ended before its turn)", got, ended)
			break
		}
	}
}

// driverGate holds a gatedDriver's first update at its worker until
// open is closed; entered hears that it got there.
type driverGate struct{ open, entered chan struct{} }

// gatedDriver is an update driver past its start-up wait with one
// worker of model "m", whose first update (seq 1) waits at the worker
// for the gate; req makes a one-row update of id, applied the ids the
// worker applied so far, in order.
func gatedDriver(t *testing.T) (d *updateDriver, req func(id int64) *prismv1.UpdateRequest, gate driverGate, applied func() []int64) {
	t.Helper()
	start := time.Unix(1000, 0)
	now := start.Add(time.Hour) // long past the start-up wait
	gate = driverGate{open: make(chan struct{}), entered: make(chan struct{}, 1)}
	var mu sync.Mutex
	var ids []int64
	call := func(ctx context.Context, addr string, r *prismv1.ApplyUpdateRequest) (*prismv1.UpdateResponse, error) {
		if r.GetSeq() == 1 {
			gate.entered <- struct{}{}
			<-gate.open
		}
		mu.Lock()
		ids = append(ids, r.GetUpdate().GetIds()...)
		mu.Unlock()
		return &prismv1.UpdateResponse{Workers: 1}, nil
	}
	d = newUpdateDriver(newSequencer(start, time.Second, 1<<20, 0, QuorumOne), func() time.Time { return now }, slog.New(slog.DiscardHandler), time.Second, 0, call)
	d.announced(&prismv1.WorkerInfo{Id: "w1", Role: prismv1.Role_ROLE_EMBEDDING, Addr: "addr-w1", Models: []string{"m"}, Healthy: true})
	req = func(id int64) *prismv1.UpdateRequest {
		return &prismv1.UpdateRequest{Model: "m", Table: "t", Ids: []int64{id}, Rows: binary.LittleEndian.AppendUint32(nil, math.Float32bits(float32(id)))}
	}
	applied = func() []int64 {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(ids)
	}
	return d, req, gate, applied
}
