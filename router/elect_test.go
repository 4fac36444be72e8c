package router

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
)

// handElection is an Election driven by hand: the test reports the
// holder to each router (elected.setLeader), as a Lease would.
type handElection struct {
	self string
	// ran is set while Run runs; Run reports self as the holder.
	ran atomic.Bool
}

func (h *handElection) Identity() string { return h.self }

func (h *handElection) Run(ctx context.Context, leader func(string, uint64)) {
	h.ran.Store(true)
	leader(h.self, 1)
	<-ctx.Done()
	leader("", 0)
}

// electRig: two routers electing their sequencer, each serving its
// Embeddings service in process at the address it is elected under, and
// embedding workers announcing to both. Both routers' clocks run skew
// ahead of the wall clock.
type electRig struct {
	t *testing.T
	// epoch counts the holds as a Lease does (lead): one more for each
	// holder other than the last.
	epoch, last int
	rs          []*Router
	addrs       []string
	cns         []*seqCN
	cnAt        []string
	skew        atomic.Int64
	logs        lockedBuffer
}

func newElectRig(t *testing.T, workers int) *electRig {
	rig := &electRig{t: t}
	for range 2 {
		addr, lis := listen(t)
		r := testRouter(Options{Election: &handElection{self: addr}, Logger: slog.New(slog.NewTextHandler(&rig.logs, nil)),
			now: func() time.Time { return time.Now().Add(time.Duration(rig.skew.Load())) }})
		r.opts.SequencerDialOptions = []grpc.DialOption{grpc.WithContextDialer(dialInproc)}
		s := grpc.NewServer()
		prismv1.RegisterEmbeddingsServer(s, r.Updater())
		prismv1.RegisterRegistryServer(s, r.Reg)
		go s.Serve(lis)
		t.Cleanup(s.Stop)
		t.Cleanup(r.Close)
		r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{Id: "gpu", Role: prismv1.Role_ROLE_DENSE, Addr: "dense:a", Models: []string{"m"}, Healthy: true}})
		rig.rs, rig.addrs = append(rig.rs, r), append(rig.addrs, addr)
	}
	for range workers {
		f := &seqCN{}
		rig.cns = append(rig.cns, f)
		rig.cnAt = append(rig.cnAt, startCN(t, f))
	}
	rig.announce()
	rig.advance() // past the followers' start-up wait
	return rig
}

// announce: every worker announces what it holds to both routers, and
// hears the election epoch in their answers.
func (rig *electRig) announce() {
	for _, r := range rig.rs {
		for i, f := range rig.cns {
			resp, err := r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{
				Id: "cpu" + rig.cnAt[i], Role: prismv1.Role_ROLE_EMBEDDING, Addr: rig.cnAt[i], Models: []string{"m"}, Healthy: true,
				UpdateSeq: map[string]int64{"m": f.held()}, Diverged: f.marked(),
			}})
			if err == nil {
				f.heard(resp.GetEpoch())
				f.told(resp.GetDiverged())
			}
		}
	}
}

// advance moves the clocks three heartbeats on, the workers announcing.
func (rig *electRig) advance() {
	rig.skew.Add(int64(3*rig.rs[0].opts.Heartbeat) + 1)
	rig.announce()
}

// lead reports holder (an index into rs, -1: none) to both routers,
// with the epoch a Lease would give its hold.
func (rig *electRig) lead(holder int) {
	if holder >= 0 && (rig.epoch == 0 || holder != rig.last) {
		rig.epoch++
		rig.last = holder
	}
	for i, r := range rig.rs {
		switch {
		case holder < 0:
			r.el.setLeader("", 0)
		case holder == i:
			r.el.setLeader(rig.addrs[holder], uint64(rig.epoch))
		default:
			r.el.setLeader(rig.addrs[holder], 0)
		}
	}
}

func (rig *electRig) update(via int, id int64, v float32) error {
	// The routers' clocks run ahead (skew): a deadline well past it.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rows := binary.LittleEndian.AppendUint32(nil, math.Float32bits(v))
	_, err := rig.rs[via].Updater().Update(ctx, &prismv1.UpdateRequest{Model: "m", Table: "t", Ids: []int64{id}, Rows: rows})
	return err
}

// orders checks every worker applied want, in that order.
func (rig *electRig) orders(want ...int64) {
	rig.t.Helper()
	for i, f := range rig.cns {
		f.mu.Lock()
		order := slices.Clone(f.order)
		f.mu.Unlock()
		if !slices.Equal(order, want) {
			rig.t.Fatalf("worker %d applied %v, want %v", i, order, want)
		}
	}
}

func wantUnavailable(t *testing.T, err error, what, says string) {
	t.Helper()
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), says) {
		t.Fatalf("%s: %v, want Unavailable saying %q", what, err, says)
	}
}

// Router A is elected and sequences updates sent to either router; A
// loses the election and during the gap every update is Unavailable;
// B is elected, learns in its start-up window what the workers hold
// and numbers the next updates after A's: no number reused, every
// worker applies one order.
func TestElectedSequencerMoves(t *testing.T) {
	rig := newElectRig(t, 3)
	a, b := 0, 1
	// No holder known yet.
	for via := range rig.rs {
		wantUnavailable(t, rig.update(via, 1, 1), "no holder", "election of one is under way")
	}
	rig.lead(a)
	// A's start-up window: nothing numbered, on A or through B, each
	// refusal with the time left in the window as its pushback (B
	// relays A's).
	for via, what := range map[int]string{a: "A's window", b: "through B in A's window"} {
		err := rig.update(via, 1, 1)
		wantUnavailable(t, err, what, "moments ago")
		var r *refusal
		if !errors.As(err, &r) || !r.retry || r.wait <= 0 {
			t.Fatalf("%s: %v carries no pushback of the time left in the window (%+v)", what, err, r)
		}
	}
	rig.orders()
	rig.advance()
	for i := range 4 {
		if err := rig.update(i%2, int64(i), float32(i+1)); err != nil {
			t.Fatalf("update %d via router %d: %v", i+1, i%2, err)
		}
	}
	rig.orders(1, 2, 3, 4)

	// An update being applied when A loses finishes, but is not
	// acknowledged: its workers held it only after A stopped sequencing
	// (B might have numbered another over it). One waiting its turn is
	// refused, and A numbers nothing more.
	for _, f := range rig.cns {
		f.mu.Lock()
		f.gate, f.entered = make(chan struct{}), make(chan struct{}, 8)
		f.mu.Unlock()
	}
	first, second := make(chan error, 1), make(chan error, 1)
	go func() { first <- rig.update(a, 10, 10) }()
	for _, f := range rig.cns {
		<-f.entered
	}
	go func() { second <- rig.update(b, 11, 11) }() // forwarded to A, queued there
	waitQueued(t, rig.rs[a], 1)
	rig.lead(-1)
	wantUnavailable(t, <-second, "queued when A lost", "stopped sequencing")
	for _, f := range rig.cns {
		f.mu.Lock()
		close(f.gate)
		f.gate = nil
		f.mu.Unlock()
	}
	wantUnavailable(t, <-first, "in flight when A lost", "only after this router stopped sequencing")
	rig.orders(1, 2, 3, 4, 5)
	// The gap: no router sequences.
	for via := range rig.rs {
		wantUnavailable(t, rig.update(via, 1, 1), "gap", "election of one is under way")
	}

	// B is elected: its window first, then it numbers on from 5.
	rig.lead(b)
	rig.announce()
	wantUnavailable(t, rig.update(a, 1, 1), "through A in B's window", "moments ago")
	wantUnavailable(t, rig.update(b, 1, 1), "B's window", "moments ago")
	rig.advance()
	for i := range 3 {
		if err := rig.update(i%2, int64(20+i), float32(20+i)); err != nil {
			t.Fatalf("update %d via router %d under B: %v", 6+i, i%2, err)
		}
	}
	rig.orders(1, 2, 3, 4, 5, 6, 7, 8)
	if got := rig.cns[0].row(22); got != 22 {
		t.Fatalf("row 22 = %v, want 22", got)
	}
	// A keeps no driver: its term ended.
	if d := rig.rs[a].el.term.Load().d; d != nil {
		t.Fatal("A still has a sequencer after losing the election")
	}
}

// While the election moves, two routers may each take the other for
// the holder: a forwarded update reaching a router that does not hold
// the election is Unavailable (retry), never passed on nor applied.
func TestElectedForwardedToNonHolder(t *testing.T) {
	rig := newElectRig(t, 1)
	rig.rs[0].el.setLeader(rig.addrs[1], 0)
	rig.rs[1].el.setLeader(rig.addrs[0], 0)
	wantUnavailable(t, rig.update(0, 1, 1), "A and B name each other", "does not sequence")
	rig.orders()
}

// Lookups: a worker lacking an acknowledged update serves on no router,
// the new holder's included while its window lasts (it judges by the
// follower's rule) and after it (by its sequencer's). The new holder
// copied the old one's update log while it followed (replica.go), so
// its heartbeat replays what the worker missed and it serves again.
// Without a copy (B never reached A) it stays out, as before.
func TestElectedLookups(t *testing.T) {
	for _, copied := range []bool{true, false} {
		t.Run(map[bool]string{true: "copied", false: "no copy"}[copied], func(t *testing.T) {
			rig := newElectRig(t, 3)
			rig.lead(0)
			rig.advance()
			rig.cns[2].setDown(true)
			if err := rig.update(0, 1, 1); err != nil {
				t.Fatal(err)
			}
			rig.cns[2].setDown(false)
			rig.announce()
			if copied {
				rig.rs[1].copySequencerLog(context.Background())
				if got, want := rig.rs[1].el.copy.models["m"].end(), int64(1); got != want {
					t.Fatalf("B's copy ends at %d, want %d", got, want)
				}
				if lag := rig.rs[1].el.copy.lag()["m"]; lag != 0 {
					t.Fatalf("B's copy lags %d updates, want 0", lag)
				}
				if got := copyLagMetric(t, rig.rs[1]); got != "m=0" {
					t.Fatalf("B following: prism_router_update_log_copy_lag %q, want m=0", got)
				}
			}
			serves := func(r *Router) []bool {
				var out []bool
				for i := range rig.cns {
					var others []string
					for j := range rig.cns {
						if j != i {
							others = append(others, "cpu"+rig.cnAt[j])
						}
					}
					_, release, err := r.Reg.Pick(prismv1.Role_ROLE_EMBEDDING, "m", 1, others)
					if err == nil {
						release()
					}
					out = append(out, err == nil)
				}
				return out
			}
			want := []bool{true, true, false}
			for i, r := range rig.rs {
				if got := serves(r); !slices.Equal(got, want) {
					t.Fatalf("router %d serves from %v, want %v", i, got, want)
				}
			}
			rig.lead(1)
			if got := copyLagMetric(t, rig.rs[1]); got != "" {
				t.Fatalf("B holding the election: prism_router_update_log_copy_lag %q, want none", got)
			}
			if got := serves(rig.rs[1]); !slices.Equal(got, want) {
				t.Fatalf("B in its window serves from %v, want %v", got, want)
			}
			rig.advance()
			if got := serves(rig.rs[1]); !slices.Equal(got, want) {
				t.Fatalf("B after its window serves from %v, want %v", got, want)
			}
			rig.rs[1].el.tick()
			rig.rs[1].el.term.Load().d.wait()
			rig.announce()
			if copied {
				// B replayed update 1 to worker 2 from its copy.
				want = []bool{true, true, true}
				if got := rig.cns[2].row(1); got != 1 {
					t.Fatalf("worker 2's row 1 = %v after the replay, want 1", got)
				}
			}
			for i, r := range rig.rs {
				if got := serves(r); !slices.Equal(got, want) {
					t.Fatalf("after B's heartbeat router %d serves from %v, want %v", i, got, want)
				}
			}
			if says := strings.Contains(rig.logs.String(), "misses updates the router no longer holds"); says == copied {
				t.Fatalf("B reported a worker it cannot catch up: %v, want %v:\n%s", says, !copied, rig.logs.String())
			}
		})
	}
}

// Run takes part in the election and gives it up when ctx ends; the
// options refuse what an elected router cannot do.
func TestElectedRunAndOptions(t *testing.T) {
	h := &handElection{self: "10.0.0.1:8500"}
	r, err := Open(Options{Election: h, Heartbeat: 10 * time.Millisecond}, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	deadline := time.Now().Add(5 * time.Second)
	for r.el.leader() != h.self && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if r.el.leader() != h.self {
		t.Fatalf("Run did not take part: holder %q", r.el.leader())
	}
	cancel()
	<-done
	if r.el.leader() != "" {
		t.Fatalf("after Run: holder %q", r.el.leader())
	}
	r.Close()
	for _, o := range []Options{
		{Election: h, Sequencer: "other:1"},
		{Election: h, UpdateLogDir: t.TempDir()},
		{Election: &handElection{}},
	} {
		if _, err := Open(o, nil); err == nil {
			t.Errorf("Open(%+v): no error", o)
		}
	}
}

// waitQueued waits until r's sequencer has n updates waiting their turn.
func waitQueued(t *testing.T, r *Router, n int) {
	t.Helper()
	d := r.el.term.Load().d
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		d.mu.Lock()
		q := 0
		for _, m := range d.seq.models {
			q += len(m.queue)
		}
		d.mu.Unlock()
		if q >= n {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("no %d updates queued", n)
}

// A holder that loses the election and wins it back with no other
// holder reported between keeps its own log as its copy: it catches up
// a worker that missed an update of its first term.
func TestElectedRegainsItsOwnLog(t *testing.T) {
	rig := newElectRig(t, 3)
	rig.lead(0)
	rig.advance()
	rig.cns[1].setDown(true)
	if err := rig.update(0, 3, 3); err != nil {
		t.Fatal(err)
	}
	rig.cns[1].setDown(false)
	rig.announce()
	rig.lead(-1)
	rig.lead(0)
	rig.advance()
	rig.rs[0].el.tick()
	rig.rs[0].el.term.Load().d.wait()
	if got := rig.cns[1].row(3); got != 3 {
		t.Fatalf("worker 1's row 3 = %v after A won back, want 3 (replayed from A's own log)", got)
	}
	if !strings.Contains(rig.logs.String(), "starts from its copy") {
		t.Fatalf("A did not say it starts from its copy:\n%s", rig.logs.String())
	}
}

// A holds the election (epoch 1) and numbers update 2 (X) after B's last
// pull; no worker applies it. A's hold ends, and A never hears of B's
// (cut off from the API server, it sees no holder). B (epoch 2) starts
// from its copy, which ends at 1, and numbers 2 again (Y), acknowledged
// on workers 1 and 2. B's hold ends and A takes the Lease (epoch 3).
// A's own log is of epoch 1, not the hold right before: it is not
// started from, so X is never replayed under number 2; worker 0 stays
// out of serving (before the fix A replayed X to it, and it served X's
// row where Y was acknowledged). Found by review.
func TestElectedUnseenHolder(t *testing.T) {
	rig := newElectRig(t, 3)
	a, b := 0, 1
	rig.rs[a].el.setLeader(rig.addrs[a], 1)
	rig.rs[b].el.setLeader(rig.addrs[a], 0)
	rig.advance()
	if err := rig.update(a, 1, 1); err != nil {
		t.Fatal(err)
	}
	rig.rs[b].copySequencerLog(context.Background()) // B's copy: 1
	if rm := rig.rs[b].el.copy.models["m"]; rm == nil || rm.end() != 1 {
		t.Fatalf("B's copy: %+v, want one ending at 1", rm)
	}
	for _, f := range rig.cns {
		f.setDown(true)
	}
	if err := rig.update(a, 2, 2); err == nil { // numbered 2 (X) by A, applied nowhere
		t.Fatal("update X acknowledged with every worker down")
	}
	for _, f := range rig.cns {
		f.setDown(false)
	}
	rig.rs[a].el.setLeader("", 0) // A's hold ends; it keeps its own log
	rig.rs[b].el.setLeader(rig.addrs[b], 2)
	rig.announce()
	rig.advance()
	rig.cns[0].setDown(true)
	if err := rig.update(b, 2, 20); err != nil { // numbered 2 (Y) by B, acknowledged
		t.Fatal(err)
	}
	rig.cns[0].setDown(false)
	rig.rs[b].el.setLeader("", 0)
	rig.rs[a].el.setLeader(rig.addrs[a], 3) // A never heard of B's hold
	rig.announce()
	rig.advance()
	rig.rs[a].el.tick()
	rig.rs[a].el.term.Load().d.wait()
	rig.announce()
	for i, f := range rig.cns {
		if f.held() >= 2 && f.row(2) != 20 {
			t.Errorf("worker %d holds update 2 as row 2 = %v; the acknowledged update 2 wrote 20", i, f.row(2))
		}
	}
	if got := rig.cns[0].held(); got != 1 {
		t.Errorf("worker 0 holds %d, want 1 (out of serving until it gets a store)", got)
	}
	if !strings.Contains(rig.logs.String(), "does not come from the hold right before") {
		t.Errorf("A did not say it drops its copy:\n%s", rig.logs.String())
	}
}

// A follower loses sight of the sequencer it followed while a worker
// lacking an acknowledged update is announced, and the up-to-date
// workers are fewer than the quorum (worker 1 lost its store), so
// announcements alone cannot hold the bar:
//
//   - the holder's restarted process answers at the holder's address
//     without sequencing (the Lease still names the crashed one): the
//     follower keeps its last view;
//   - the election moved to a router that does not sequence yet (its
//     Elector has not reported its own hold; router 1 itself stands for
//     it): the follower drops the old view but keeps its acknowledged
//     number as the floor.
//
// Either way worker 2 stays out of the follower's lookups. Before, the
// empty answer's view (or no view) dropped the floor and it served
// (found by review).
func TestElectedFollowerKeepsTheBar(t *testing.T) {
	for _, restarted := range []bool{true, false} {
		t.Run(map[bool]string{true: "restarted holder", false: "new holder not yet sequencing"}[restarted], func(t *testing.T) {
			rig := newElectRig(t, 3)
			rig.lead(0)
			rig.advance()
			rig.cns[2].setDown(true)
			if err := rig.update(0, 1, 1); err != nil {
				t.Fatal(err)
			}
			rig.cns[2].setDown(false)
			rig.announce()
			rig.rs[1].pollSequencer(context.Background())
			rig.rs[1].Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{
				Id: "cpu" + rig.cnAt[1], Role: prismv1.Role_ROLE_EMBEDDING, Addr: rig.cnAt[1], Models: []string{"m"}, Healthy: true,
				UpdateSeq: map[string]int64{"m": 0}}})
			if restarted {
				rig.rs[0].el.setLeader("", 0)
				rig.rs[1].pollSequencer(context.Background())
			} else if err := rig.rs[1].el.fol.poll(context.Background(), rig.addrs[1], time.Second); err == nil {
				t.Fatal("a poll of a router that does not sequence succeeded")
			}
			others := []string{"cpu" + rig.cnAt[0], "cpu" + rig.cnAt[1]}
			if _, release, err := rig.rs[1].Reg.Pick(prismv1.Role_ROLE_EMBEDDING, "m", 1, others); err == nil {
				release()
				t.Fatal("router 1 sends lookups to worker 2, which lacks acknowledged update 1")
			}
		})
	}
}

// copyLagMetric is what r's prism_router_update_log_copy_lag says, as
// "model=lag" joined by commas ("": absent).
func copyLagMetric(t *testing.T, r *Router) string {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(copyLagCollector{r})
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			out = append(out, fmt.Sprintf("%s=%v", m.GetLabel()[0].GetValue(), m.GetGauge().GetValue()))
		}
	}
	return strings.Join(out, ",")
}

// A's update X (number 2) is at the workers when A loses the election,
// and is applied only after B's start-up window ended: B heard the
// workers hold 1 and numbers its own update Y 2 as well. The workers,
// holding a 2 already, must not acknowledge Y as a replay: B would tell
// its client Y is applied while no worker holds its rows (and keep
// serving the workers holding X under B's number 2). Y is not
// acknowledged, B leaves the workers out, and A, which stopped
// sequencing before X reached its quorum, does not acknowledge X
// either: the sequencer now may never have heard of it. Found by
// review.
func TestElectedLateUpdateOfOldHolder(t *testing.T) {
	rig := newElectRig(t, 2)
	a, b := 0, 1
	rig.lead(a)
	rig.advance()
	if err := rig.update(a, 1, 1); err != nil {
		t.Fatalf("update 1 on A: %v", err)
	}
	for _, f := range rig.cns {
		f.mu.Lock()
		f.gate, f.entered = make(chan struct{}), make(chan struct{}, 8)
		f.mu.Unlock()
	}
	x := make(chan error, 1)
	go func() { x <- rig.update(a, 5, 5) }() // X, number 2 on A
	for _, f := range rig.cns {
		<-f.entered
	}
	rig.lead(b)
	rig.announce()
	rig.advance() // B's window ends: the workers hold 1
	for _, f := range rig.cns {
		f.mu.Lock()
		close(f.gate)
		f.gate = nil
		f.mu.Unlock()
	}
	xErr := <-x
	for i, f := range rig.cns {
		if f.held() != 2 || f.row(5) != 5 {
			t.Fatalf("worker %d holds %d, row 5 = %v: X did not land", i, f.held(), f.row(5))
		}
	}
	yErr := rig.update(b, 6, 6) // Y, numbered 2 by B too
	for i, f := range rig.cns {
		if yErr == nil && f.row(6) != 6 {
			t.Errorf("B acknowledged Y, but worker %d lacks its row (row 6 = %v; it held A's update under Y's number)", i, f.row(6))
		}
	}
	if yErr != nil {
		wantUnavailable(t, yErr, "Y, on workers holding another update 2", "not acknowledged")
		if _, release, err := rig.rs[b].Reg.Pick(prismv1.Role_ROLE_EMBEDDING, "m", 1, nil); err == nil {
			release()
			t.Error("B still sends lookups to the workers holding another update under its number 2")
		}
	}
	if xErr == nil {
		t.Error("A acknowledged X after it stopped sequencing; B never heard of it and numbered over it")
	}
}

// Issue 14, "no acknowledged update lost": TestElectedLateUpdateOfOldHolder
// with workers of this release, which fence. A holds the Lease (epoch
// 1) and its update X (number 2) is at the workers when B takes the
// Lease (epoch 2); B answers the workers' next announcements with its
// epoch, so when X lands after B's start-up window they refuse it
// (FAILED_PRECONDITION, nothing written, number not taken) and A tells
// X's client Unavailable, never OK. B numbers its own Y 2, and every
// worker applies and acknowledges it: none diverged, all serve. Before,
// X landed, Y was answered AlreadyExists and B left every worker out
// of serving (an outage), A possibly having told X's client OK.
// "A not told": A's election has not yet said it lost (a router cut off
// from the API server still believes it holds): the fenced answer alone
// makes it stop sequencing.
func TestElectedFencesOldHolder(t *testing.T) {
	for _, told := range []bool{true, false} {
		t.Run(map[bool]string{true: "A told", false: "A not told"}[told], func(t *testing.T) {
			rig := newElectRig(t, 2)
			for _, f := range rig.cns {
				f.fence = true
			}
			a, b := 0, 1
			rig.lead(a) // epoch 1
			rig.advance()
			if err := rig.update(a, 1, 1); err != nil {
				t.Fatalf("update 1 on A: %v", err)
			}
			for _, f := range rig.cns {
				f.mu.Lock()
				f.gate, f.entered = make(chan struct{}), make(chan struct{}, 8)
				f.mu.Unlock()
			}
			x := make(chan error, 1)
			go func() { x <- rig.update(a, 5, 5) }() // X, number 2 on A
			for _, f := range rig.cns {
				<-f.entered
			}
			if told {
				rig.lead(b) // epoch 2
			} else {
				rig.rs[b].el.setLeader(rig.addrs[b], 2)
			}
			rig.announce() // B's answers tell the workers epoch 2
			// Only the holder tells an epoch: B its own; A, once told it
			// lost, none (while it believes it holds, its own 1).
			for i, want := range map[int]uint64{b: 2, a: map[bool]uint64{true: 0, false: 1}[told]} {
				resp, err := rig.rs[i].Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{
					Id: "cpu" + rig.cnAt[0], Role: prismv1.Role_ROLE_EMBEDDING, Addr: rig.cnAt[0], Models: []string{"m"}, Healthy: true,
					UpdateSeq: map[string]int64{"m": rig.cns[0].held()}}})
				if err != nil || resp.GetEpoch() != want {
					t.Errorf("router %d answers an embedding worker with epoch %d, %v; want %d", i, resp.GetEpoch(), err, want)
				}
			}
			rig.advance() // B's window ends: the workers hold 1
			for _, f := range rig.cns {
				f.mu.Lock()
				close(f.gate)
				f.gate = nil
				f.mu.Unlock()
			}
			xErr := <-x
			if status.Code(xErr) != codes.Unavailable || !strings.Contains(xErr.Error(), "lost the sequencing lease") {
				t.Errorf("X on A: %v, want Unavailable naming the fenced refusal", xErr)
			}
			for i, f := range rig.cns {
				if f.held() != 1 || f.row(5) != 0 {
					t.Errorf("worker %d holds %d, row 5 = %v: X landed after the workers heard of B's epoch", i, f.held(), f.row(5))
				}
			}
			if err := rig.update(b, 6, 6); err != nil { // Y, number 2 on B
				t.Fatalf("Y on B: %v, want it acknowledged", err)
			}
			rig.orders(1, 2)
			for i, f := range rig.cns {
				if f.row(6) != 6 {
					t.Errorf("worker %d: row 6 = %v, want Y's 6", i, f.row(6))
				}
			}
			rig.announce()
			for i := range rig.cns {
				var others []string
				for j := range rig.cns {
					if j != i {
						others = append(others, "cpu"+rig.cnAt[j])
					}
				}
				_, release, err := rig.rs[b].Reg.Pick(prismv1.Role_ROLE_EMBEDDING, "m", 1, others)
				if err != nil {
					t.Errorf("B does not send lookups to worker %d: %v (diverged?)", i, err)
					continue
				}
				release()
			}
			if strings.Contains(rig.logs.String(), "holds another update under a number") {
				t.Errorf("a worker diverged:\n%s", rig.logs.String())
			}
			if !told {
				// A stopped sequencing on the fenced answer: its next
				// client is refused, not numbered.
				wantUnavailable(t, rig.update(a, 7, 7), "update on A after it was fenced", "stopped sequencing")
				// It says so in the step that took the first fenced
				// answer. Each worker's answer is a step of its own, whose
				// messages go out after the driver's lock: the last
				// answer's step, which answers X, can deliver before the
				// first one's log line is written (a loaded machine failed
				// the check made at once). Wait for it, 10 s at most.
				const says = "this router stops sequencing"
				for deadline := time.Now().Add(10 * time.Second); !strings.Contains(rig.logs.String(), says) && time.Now().Before(deadline); {
					time.Sleep(time.Millisecond)
				}
				if !strings.Contains(rig.logs.String(), says) {
					t.Errorf("A did not say it stops sequencing:\n%s", rig.logs.String())
				}
				rig.orders(1, 2)
			}
		})
	}
}

// TestElectedFencesAcrossLeases: TestElectedFencesOldHolder with the
// Lease deleted and made anew (prismv1's ordered epochs: its creation
// time above the count). A holds the old Lease (its third hold); its
// update X is at the workers when the new Lease's first hold begins:
// B's (another router made the new Lease), or A's own (its renewal made
// it, kubelease.Elector.wrote: a new hold, a new term, under the same
// router). The new hold's epoch is above A's old one although its count
// starts over, so the workers refuse X once they heard of it, and the
// new term numbers its own update 2 on every worker. (With epochs of
// different Leases not compared, as before, X landed after the window
// and the kept epoch went back to the old Lease's.)
func TestElectedFencesAcrossLeases(t *testing.T) {
	const made = 1796126400
	oldHold := uint64(made)<<32 | prismv1.OrderedEpoch | 3
	newHold := uint64(made+60)<<32 | prismv1.OrderedEpoch | 1
	for _, remadeBy := range []int{1, 0} {
		t.Run(map[int]string{1: "another router", 0: "the holder"}[remadeBy], func(t *testing.T) {
			rig := newElectRig(t, 2)
			for _, f := range rig.cns {
				f.fence = true
			}
			a, next := 0, remadeBy
			for i, r := range rig.rs {
				r.el.setLeader(rig.addrs[a], map[bool]uint64{true: oldHold}[i == a])
			}
			rig.advance()
			if err := rig.update(a, 1, 1); err != nil {
				t.Fatalf("update 1 on A: %v", err)
			}
			for _, f := range rig.cns {
				f.mu.Lock()
				f.gate, f.entered = make(chan struct{}), make(chan struct{}, 8)
				f.mu.Unlock()
			}
			x := make(chan error, 1)
			go func() { x <- rig.update(a, 5, 5) }() // X, number 2 of A's old hold
			for _, f := range rig.cns {
				<-f.entered
			}
			for i, r := range rig.rs {
				r.el.setLeader(rig.addrs[next], map[bool]uint64{true: newHold}[i == next])
			}
			rig.announce() // the new holder's answers tell the workers its epoch
			for i, f := range rig.cns {
				f.mu.Lock()
				got := f.epoch
				f.mu.Unlock()
				if got != newHold {
					t.Fatalf("worker %d keeps epoch %s, want the new Lease's %s", i, prismv1.FormatEpoch(got), prismv1.FormatEpoch(newHold))
				}
			}
			rig.advance() // the new term's window ends: the workers hold 1
			for _, f := range rig.cns {
				f.mu.Lock()
				close(f.gate)
				f.gate = nil
				f.mu.Unlock()
			}
			if xErr := <-x; status.Code(xErr) != codes.Unavailable {
				t.Errorf("X of the old Lease's hold: %v, want Unavailable", xErr)
			}
			for i, f := range rig.cns {
				if f.held() != 1 || f.row(5) != 0 {
					t.Errorf("worker %d holds %d, row 5 = %v: X landed after the workers heard of the new Lease", i, f.held(), f.row(5))
				}
			}
			if err := rig.update(next, 6, 6); err != nil { // Y, number 2 of the new hold
				t.Fatalf("Y on the new holder: %v, want it acknowledged", err)
			}
			rig.orders(1, 2)
			for i, f := range rig.cns {
				f.mu.Lock()
				got := f.epoch
				f.mu.Unlock()
				if f.row(6) != 6 || got != newHold {
					t.Errorf("worker %d: row 6 = %v, epoch %s; want Y's 6 under %s", i, f.row(6), prismv1.FormatEpoch(got), prismv1.FormatEpoch(newHold))
				}
			}
		})
	}
}

// Issue 14 across an election: router A finds worker 1's copy diverged
// (it refuses an update worker 0 applies) and tells it; B, elected next,
// never saw it happen, yet learns it from the worker's announcements,
// and neither B (its new term's sequencer) nor A (now following, by the
// follower's rule) sends worker 1 lookups, nor B updates. Before, B
// took worker 1's update number for an up-to-date copy.
func TestDivergedMarkOutlivesElection(t *testing.T) {
	rig := newElectRig(t, 2)
	a, b := 0, 1
	rig.lead(a)
	rig.advance()
	refuser := rig.cns[1]
	refuser.mu.Lock()
	refuser.refuse = true
	refuser.mu.Unlock()
	_ = rig.update(a, 1, 1) // refused by worker 1: acknowledged or not by the quorum, it diverged
	refuser.mu.Lock()
	refuser.refuse = false
	refuser.mu.Unlock()
	rig.announce()
	if got := refuser.marked(); !maps.Equal(got, map[string]int64{"m": 1}) {
		t.Fatalf("the refuser was told %v, want m diverged at 1", got)
	}
	rig.lead(b)
	rig.announce()
	rig.advance()
	serves := func(r *Router, i int) bool {
		_, release, err := r.Reg.Pick(prismv1.Role_ROLE_EMBEDDING, "m", 1, []string{"cpu" + rig.cnAt[1-i]})
		if err != nil {
			return false
		}
		release()
		return true
	}
	for name, r := range map[string]*Router{"B (holds the election)": rig.rs[b], "A (follows)": rig.rs[a]} {
		if !serves(r, 0) || serves(r, 1) {
			t.Errorf("%s sends lookups to worker 0: %v, to the diverged worker 1: %v; want only worker 0", name, serves(r, 0), serves(r, 1))
		}
	}
	if err := rig.update(b, 2, 2); err != nil {
		t.Fatalf("update under B: %v", err)
	}
	if got := refuser.held(); got != 1 {
		t.Fatalf("the diverged worker holds %d: B sent it an update", got)
	}
}

// A new holder whose Election reports its hold first with epoch 0 (the
// Lease could not be read as the hold began, kubelease.readEpoch) and a
// renewal later with the hold's epoch (kubelease's wrote) is one hold:
// its copy of the previous holder's log is kept through the epoch-0
// term and started from once the epoch is known, so a worker that
// missed an update of the previous holder is caught up. Before, the
// epoch-0 term dropped the copy (and kept its own empty log, of epoch
// 0, in its place), and the worker stayed out of serving until it got a
// store.
func TestElectedEpochLearntLateKeepsCopy(t *testing.T) {
	rig := newElectRig(t, 3)
	a, b := 0, 1
	rig.rs[a].el.setLeader(rig.addrs[a], 1)
	rig.rs[b].el.setLeader(rig.addrs[a], 0)
	rig.advance()
	rig.cns[1].setDown(true)
	if err := rig.update(a, 3, 3); err != nil { // acknowledged by workers 0 and 2
		t.Fatal(err)
	}
	rig.cns[1].setDown(false)
	rig.rs[b].copySequencerLog(context.Background()) // B's copy: 1, of epoch 1
	rig.rs[a].el.setLeader("", 0)
	rig.rs[b].el.setLeader(rig.addrs[b], 0) // epoch not known yet
	rig.announce()
	rig.rs[b].el.setLeader(rig.addrs[b], 2) // learnt from a renewal
	rig.announce()
	rig.advance()
	rig.rs[b].el.tick()
	rig.rs[b].el.term.Load().d.wait()
	if got := rig.cns[1].row(3); got != 3 {
		t.Fatalf("worker 1's row 3 = %v once B's hold's epoch was known, want 3 (replayed from B's copy of A's log)\n%s", got, rig.logs.String())
	}
}

// As TestElectedEpochLearntLateKeepsCopy, but B's term of epoch 0
// numbers an update before the renewal names the epoch (it takes
// updates once its window ends): the term of the epoch starts from the
// copy with that update appended, and catches up both the worker that
// missed A's update and the one that missed B's. Before, the copy was
// started from without B's update, and worker 0, announcing it, past
// the copy's end, had the copy dropped: workers 1 and 2 stayed out of
// serving until they got a store.
func TestElectedEpochLearntLateKeepsItsUpdates(t *testing.T) {
	rig := newElectRig(t, 3)
	a, b := 0, 1
	rig.rs[a].el.setLeader(rig.addrs[a], 1)
	rig.rs[b].el.setLeader(rig.addrs[a], 0)
	rig.advance()
	rig.cns[1].setDown(true)
	if err := rig.update(a, 3, 3); err != nil { // acknowledged by workers 0 and 2
		t.Fatal(err)
	}
	rig.cns[1].setDown(false)
	rig.rs[b].copySequencerLog(context.Background()) // B's copy: 1, of epoch 1
	rig.rs[a].el.setLeader("", 0)
	rig.rs[b].el.setLeader(rig.addrs[b], 0) // epoch not known yet
	rig.announce()
	rig.advance() // B's window ends
	rig.cns[2].setDown(true)
	// Update 2 reaches worker 0 only (worker 1 is out of serving, worker
	// 2 down): below the quorum, answered Unavailable, but numbered.
	if err := rig.update(b, 4, 4); status.Code(err) != codes.Unavailable {
		t.Fatalf("update through B in its epoch-0 term: %v, want Unavailable (below the quorum)", err)
	}
	if held := []int64{rig.cns[0].held(), rig.cns[1].held(), rig.cns[2].held()}; !slices.Equal(held, []int64{2, 0, 1}) {
		t.Fatalf("workers hold %v before B's epoch is known, want [2 0 1]", held)
	}
	rig.cns[2].setDown(false)
	rig.rs[b].el.setLeader(rig.addrs[b], 2) // learnt from a renewal
	rig.announce()
	rig.advance()
	rig.rs[b].el.tick()
	rig.rs[b].el.term.Load().d.wait()
	for i, f := range rig.cns {
		if r3, r4 := f.row(3), f.row(4); r3 != 3 || r4 != 4 {
			t.Errorf("worker %d: rows 3 and 4 = %v, %v, want 3, 4 (caught up from B's copy of A's log and B's own)\n%s", i, r3, r4, rig.logs.String())
		}
	}
}

// As TestElectedEpochLearntLateKeepsItsUpdates, but the renewal names
// an epoch that does not follow the copy's (another router held the
// Lease between A's hold and B's): the copy is stale, and the term of
// the epoch starts from B's own log, as with no copy at all, and
// catches worker 2 up on B's update. Before, B's update was appended to
// the stale copy, which the term of the epoch then dropped whole:
// worker 2 lacked B's update for good.
func TestElectedEpochLearntLateStaleCopyKeepsItsOwnLog(t *testing.T) {
	rig := newElectRig(t, 3)
	a, b := 0, 1
	rig.rs[a].el.setLeader(rig.addrs[a], 1)
	rig.rs[b].el.setLeader(rig.addrs[a], 0)
	rig.advance()
	rig.cns[1].setDown(true)
	if err := rig.update(a, 3, 3); err != nil { // acknowledged by workers 0 and 2
		t.Fatal(err)
	}
	rig.cns[1].setDown(false)
	rig.rs[b].copySequencerLog(context.Background()) // B's copy: 1, of epoch 1
	rig.rs[a].el.setLeader("", 0)
	rig.rs[b].el.setLeader(rig.addrs[b], 0) // epoch not known yet
	rig.announce()
	rig.advance() // B's window ends
	rig.cns[2].setDown(true)
	if err := rig.update(b, 4, 4); status.Code(err) != codes.Unavailable {
		t.Fatalf("update through B in its epoch-0 term: %v, want Unavailable (below the quorum)", err)
	}
	rig.cns[2].setDown(false)
	rig.rs[b].el.setLeader(rig.addrs[b], 3) // learnt from a renewal: a hold came between
	rig.announce()
	rig.advance()
	rig.rs[b].el.tick()
	rig.rs[b].el.term.Load().d.wait()
	if r4 := rig.cns[2].row(4); r4 != 4 {
		t.Errorf("worker 2: row 4 = %v, want 4 (caught up from B's own log)\n%s", r4, rig.logs.String())
	}
}

// The first hold of the election, its epoch learnt late: no copy of an
// earlier holder's log, and B's term of epoch 0 numbers an update that
// reaches worker 0 alone. The term of the epoch starts from the hold's
// own log and catches workers 1 and 2 up. Before, it started with no
// log: they lacked the update for good.
func TestElectedEpochLearntLateKeepsItsOwnLog(t *testing.T) {
	rig := newElectRig(t, 3)
	b := 1
	rig.rs[0].el.setLeader(rig.addrs[b], 0)
	rig.rs[b].el.setLeader(rig.addrs[b], 0) // epoch not known yet
	rig.announce()
	rig.advance() // B's window ends
	rig.cns[1].setDown(true)
	rig.cns[2].setDown(true)
	if err := rig.update(b, 4, 4); status.Code(err) != codes.Unavailable {
		t.Fatalf("update through B in its epoch-0 term: %v, want Unavailable (below the quorum)", err)
	}
	rig.cns[1].setDown(false)
	rig.cns[2].setDown(false)
	rig.rs[b].el.setLeader(rig.addrs[b], 1) // learnt from a renewal
	rig.announce()
	rig.advance()
	rig.rs[b].el.tick()
	rig.rs[b].el.term.Load().d.wait()
	for i, f := range rig.cns {
		if r4 := f.row(4); r4 != 4 {
			t.Errorf("worker %d: row 4 = %v, want 4 (caught up from B's own log)\n%s", i, r4, rig.logs.String())
		}
	}
}

// The election moves from A to B; B, in its start-up window, serves
// lookups by the follower's rule (elect.go), and so must the routers
// that follow it: an up-to-date worker serves on A as on B while B's
// window lasts, and one lacking the acknowledged update serves on
// neither. Before, a follower that polled B in its window (the view's
// settling) took every worker of the model out of serving: lookups of
// an updated model failed on every router but the holder for three
// heartbeats at each handoff.
func TestElectedFollowerServesInHoldersWindow(t *testing.T) {
	rig := newElectRig(t, 3)
	rig.lead(0)
	rig.advance()
	rig.cns[2].setDown(true)
	if err := rig.update(0, 1, 1); err != nil {
		t.Fatal(err)
	}
	rig.cns[2].setDown(false)
	rig.announce()
	serves := func(r *Router) []bool {
		var out []bool
		for i := range rig.cns {
			var others []string
			for j := range rig.cns {
				if j != i {
					others = append(others, "cpu"+rig.cnAt[j])
				}
			}
			_, release, err := r.Reg.Pick(prismv1.Role_ROLE_EMBEDDING, "m", 1, others)
			if err == nil {
				release()
			}
			out = append(out, err == nil)
		}
		return out
	}
	want := []bool{true, true, false}
	rig.lead(1)
	rig.announce()
	rig.rs[0].pollSequencer(context.Background()) // A asks B, in its window
	if v := rig.rs[0].el.fol.view["m"]; v == nil || !v.GetSettling() {
		t.Fatalf("A's view of B: %v, want B settling", v)
	}
	for i, r := range rig.rs {
		if got := serves(r); !slices.Equal(got, want) {
			t.Fatalf("router %d in B's window serves from %v, want %v", i, got, want)
		}
	}
}

// TestResignGivesUpTheElection: Resign ends the router's part in the
// election (the Lease is released, its sequencer's term ends) while Run
// goes on keeping the registry; one before Run starts takes effect when
// it does. A holder told to stop kept the Lease through its whole drain,
// and every update was Unavailable until the drain ended.
func TestResignGivesUpTheElection(t *testing.T) {
	for _, early := range []bool{false, true} {
		h := &handElection{self: "10.0.0.1:8500"}
		r, err := Open(Options{Election: h, Heartbeat: 10 * time.Millisecond}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if early {
			r.Resign()
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { r.Run(ctx); close(done) }()
		if !early {
			deadline := time.Now().Add(5 * time.Second)
			for r.el.leader() != h.self && time.Now().Before(deadline) {
				time.Sleep(5 * time.Millisecond)
			}
			if r.el.leader() != h.self {
				t.Fatalf("Run did not take part: holder %q", r.el.leader())
			}
			r.Resign()
		}
		deadline := time.Now().Add(5 * time.Second)
		for (r.el.leader() != "" || !h.ran.Load()) && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		if r.el.leader() != "" {
			t.Fatalf("resigned (early %v): holder still %q", early, r.el.leader())
		}
		select {
		case <-done:
			t.Fatalf("early %v: Run returned at Resign; it keeps the registry until its context ends", early)
		default:
		}
		// The registry's upkeep goes on: a worker that stops answering
		// is still expired.
		r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{Id: "w", Role: prismv1.Role_ROLE_DENSE, Addr: "x:1", Models: []string{"m"}, Healthy: true}})
		listed := func() int {
			resp, _ := r.Reg.List(context.Background(), nil)
			return len(resp.GetWorkers())
		}
		for listed() > 0 && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		if listed() > 0 {
			t.Fatalf("early %v: a silent worker was not expired after Resign", early)
		}
		cancel()
		<-done
		r.Close()
	}
}

// behindMetric is the router's prism_router_embedding_workers_behind,
// by model ("" none reported).
func behindMetric(t *testing.T, r *Router) string {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(updateLogCollector{r})
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, mf := range mfs {
		if mf.GetName() != "prism_router_embedding_workers_behind" {
			continue
		}
		for _, m := range mf.GetMetric() {
			out = append(out, fmt.Sprintf("%s=%v", m.GetLabel()[0].GetValue(), m.GetGauge().GetValue()))
		}
	}
	return strings.Join(out, ",")
}

// TestElectedBehindEndsWithHold: the holder reports the workers behind
// on updates; once it loses the election it reports none (the gauge
// stayed at the last value its sequencer set, and
// PrismEmbeddingWorkersBehind paged on the old holder for as long as it
// ran), and the new holder reports its own judgement.
func TestElectedBehindEndsWithHold(t *testing.T) {
	rig := newElectRig(t, 3)
	a, b := 0, 1
	rig.lead(a)
	rig.advance()
	if err := rig.update(a, 1, 1); err != nil {
		t.Fatal(err)
	}
	// Worker 2 is down for the next update: behind once it announces.
	rig.cns[2].mu.Lock()
	rig.cns[2].down = true
	rig.cns[2].mu.Unlock()
	if err := rig.update(a, 2, 2); err != nil {
		t.Fatal(err) // acknowledged by the quorum's two
	}
	rig.cns[2].mu.Lock()
	rig.cns[2].down = false
	rig.cns[2].gate, rig.cns[2].entered = make(chan struct{}), make(chan struct{}, 8) // no catch-up yet
	rig.cns[2].mu.Unlock()
	rig.announce()
	rig.rs[a].el.tick() // the heartbeat's judgement (Router.Run's ticker)
	if got := behindMetric(t, rig.rs[a]); got != "m=1" {
		t.Fatalf("holder A reports behind %q, want m=1; held %d\n%s", got, rig.cns[2].held(), rig.logs.String())
	}
	rig.lead(b)
	if got := behindMetric(t, rig.rs[a]); got != "" {
		t.Fatalf("A, no longer the holder, reports behind %q, want none", got)
	}
	rig.cns[2].mu.Lock()
	close(rig.cns[2].gate)
	rig.cns[2].gate = nil
	rig.cns[2].mu.Unlock()
}
