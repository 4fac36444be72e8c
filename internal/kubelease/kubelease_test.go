package kubelease

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/scheme"
	fakecoordination "k8s.io/client-go/kubernetes/typed/coordination/v1/fake"
	clienttesting "k8s.io/client-go/testing"

	"github.com/prism-serve/prism/api/prismv1"
)

// cluster is a fake API server holding Leases (client-go's object
// tracker, the one behind kubernetes/fake, with only the coordination
// client so the test links little of client-go): each router gets a
// client of its own, which can be cut off.
type cluster struct {
	tracker clienttesting.ObjectTracker
	// made counts the Leases made: the API server stamps each with its
	// creation time, which the tracker does not; here the n-th Lease is
	// made n seconds after a fixed start.
	made atomic.Int64
	// failGet, when set, is the number of the Get of a Lease (counted
	// from 1 over every client) that fails, as a call cut short.
	failGet, gets atomic.Int64
	// sameSecond stamps every Lease with the first one's creation time,
	// as an API server does for a Lease made within the second its
	// predecessor was.
	sameSecond atomic.Bool
}

func newCluster() *cluster {
	return &cluster{tracker: clienttesting.NewObjectTracker(scheme.Scheme, scheme.Codecs.UniversalDecoder())}
}

// created is the creation time the cluster stamps its n-th Lease with.
func created(n int64) time.Time {
	return time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC).Add(time.Duration(n) * time.Second)
}

// client is a coordination/v1 client of the cluster; while cut is set
// every call fails, as from a router cut off from the API server (or
// dead: it neither renews nor releases).
func (c *cluster) client(cut *atomic.Bool) *fakecoordination.FakeCoordinationV1 {
	f := &clienttesting.Fake{}
	f.AddReactor("*", "*", func(clienttesting.Action) (bool, runtime.Object, error) {
		if cut.Load() {
			return true, nil, errors.New("connection refused")
		}
		return false, nil, nil
	})
	f.AddReactor("get", "leases", func(clienttesting.Action) (bool, runtime.Object, error) {
		if n := c.gets.Add(1); n == c.failGet.Load() {
			return true, nil, errors.New("the call was cut short")
		}
		return false, nil, nil
	})
	f.AddReactor("create", "leases", func(a clienttesting.Action) (bool, runtime.Object, error) {
		if l, ok := a.(clienttesting.CreateAction).GetObject().(*coordv1.Lease); ok {
			n := c.made.Add(1)
			l.CreationTimestamp = metav1.NewTime(created(n))
			if c.sameSecond.Load() {
				l.CreationTimestamp = metav1.NewTime(created(1))
			}
			l.UID = types.UID(fmt.Sprintf("lease-%d", n))
		}
		return false, nil, nil // the tracker below stores it
	})
	// An update of a Lease deleted since (and maybe made anew) is refused
	// as the API server refuses it (its resourceVersion is not the
	// stored one's; the tracker keeps none, the uid stands in for it):
	// the tracker would store the old object over the new Lease, its
	// creation time with it.
	f.AddReactor("update", "leases", func(a clienttesting.Action) (bool, runtime.Object, error) {
		l, ok := a.(clienttesting.UpdateAction).GetObject().(*coordv1.Lease)
		if !ok {
			return false, nil, nil
		}
		cur, err := c.tracker.Get(coordv1.SchemeGroupVersion.WithResource("leases"), l.Namespace, l.Name)
		if err != nil {
			return false, nil, nil // the tracker answers NotFound
		}
		if cur.(*coordv1.Lease).UID != l.UID {
			return true, nil, apierrors.NewConflict(coordv1.Resource("leases"), l.Name, errors.New("the object has been modified"))
		}
		return false, nil, nil
	})
	f.AddReactor("*", "*", clienttesting.ObjectReaction(c.tracker))
	return &fakecoordination.FakeCoordinationV1{Fake: f}
}

// candidate is one router in the election: what it was told, when.
type candidate struct {
	name   string
	cut    atomic.Bool
	cancel context.CancelFunc
	done   chan struct{}
	mu     sync.Mutex
	views  []view
}

type view struct {
	leader string
	epoch  uint64
	at     time.Time
}

func (c *candidate) last() view {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.views) == 0 {
		return view{}
	}
	return c.views[len(c.views)-1]
}

// Short durations, as the brief of the test asks: the figures scale
// with them (failover after a crash is about the lease duration plus a
// retry period).
const (
	leaseDuration = time.Second
	renewDeadline = 600 * time.Millisecond
	retryPeriod   = 200 * time.Millisecond
)

func (cl *cluster) start(t *testing.T, name string) *candidate {
	c := &candidate{name: name, done: make(chan struct{})}
	e, err := New(Options{Namespace: "prism", Name: "prism-router-sequencer", Identity: name, Leases: cl.client(&c.cut),
		LeaseDuration: leaseDuration, RenewDeadline: renewDeadline, RetryPeriod: retryPeriod})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
	go func() {
		defer close(c.done)
		e.Run(ctx, func(leader string, epoch uint64) {
			c.mu.Lock()
			c.views = append(c.views, view{leader, epoch, time.Now()})
			c.mu.Unlock()
		})
	}()
	t.Cleanup(func() { cancel(); <-c.done })
	return c
}

// waitFor waits until c's view is leader, and says when it became so.
func waitFor(t *testing.T, c *candidate, leader string, within time.Duration) time.Time {
	t.Helper()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		if v := c.last(); v.leader == leader && !v.at.IsZero() {
			return v.at
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("%s: leader still %q after %v, want %q (views %v)", c.name, c.last().leader, within, leader, c.views)
	return time.Time{}
}

// Two routers elect one through the Lease; when the holder stops
// (gives the Lease up) or is cut off (it neither renews nor gives it
// up), the other takes over, and the failover time is logged (the
// figure in BENCHMARKS.md, against a fake API server).
func TestFailover(t *testing.T) {
	for _, c := range []struct {
		name  string
		crash bool
		// within bounds the failover: one retry period (with jitter)
		// when the Lease is given up. When it must expire, the lease
		// duration from the last change the other saw, and the record
		// changes once a second (its renew time has whole seconds):
		// up to a second more, and a retry period.
		within time.Duration
	}{
		{"holder stops", false, 3 * retryPeriod},
		{"holder cut off", true, 2*leaseDuration + 3*retryPeriod},
	} {
		t.Run(c.name, func(t *testing.T) {
			cl := newCluster()
			a := cl.start(t, "10.0.0.1:8500")
			waitFor(t, a, "10.0.0.1:8500", 5*time.Second)
			b := cl.start(t, "10.0.0.2:8500")
			waitFor(t, b, "10.0.0.1:8500", 5*time.Second)
			time.Sleep(2 * retryPeriod) // a few renewals

			stopped := time.Now()
			if c.crash {
				a.cut.Store(true)
			} else {
				a.cancel()
				<-a.done
			}
			took := waitFor(t, b, "10.0.0.2:8500", leaseDuration+5*retryPeriod).Sub(stopped)
			// Each hold's epoch: the Lease's holder changes plus one, so
			// b's follows a's directly (a router's copy of the update log
			// is used only then, router/replica.go).
			a.mu.Lock()
			ea := a.views[0].epoch
			a.mu.Unlock()
			if eb := b.last().epoch; !prismv1.Ordered(ea) || uint32(ea)&^prismv1.OrderedEpoch != 1 || eb != ea+1 {
				t.Errorf("epochs: a's hold %#x, b's %#x; want the count 1, then one more", ea, eb)
			}
			t.Logf("leader failover (%s): %v (lease %v, renew deadline %v, retry %v; fake API server)", c.name, took.Round(time.Millisecond), leaseDuration, renewDeadline, retryPeriod)
			if took > c.within {
				t.Errorf("failover took %v, want at most %v", took, c.within)
			}
			if c.crash {
				// The cut-off holder stops leading on its own after its
				// renew deadline. client-go keeps it before the other's
				// takeover by the lease duration less the renew deadline,
				// less up to a second (the record's renew time has whole
				// seconds): with these short durations the two may touch,
				// which the new sequencer's start-up window (three
				// heartbeats without numbering) covers; logged, not checked.
				lost := waitFor(t, a, "", leaseDuration)
				t.Logf("the cut-off holder stopped leading at +%v, the other took over at +%v", lost.Sub(stopped).Round(time.Millisecond), took.Round(time.Millisecond))
				// Back in touch, it follows the new holder.
				a.cut.Store(false)
				waitFor(t, a, "10.0.0.2:8500", 5*time.Second)
			}
		})
	}
}

func TestOptions(t *testing.T) {
	if ns, name, err := ParseLease("prism/seq"); err != nil || ns != "prism" || name != "seq" {
		t.Fatalf("ParseLease: %q %q %v", ns, name, err)
	}
	for _, bad := range []string{"seq", "/seq", "prism/", "a/b/c"} {
		if _, _, err := ParseLease(bad); err == nil {
			t.Errorf("ParseLease(%q): no error", bad)
		}
	}
	o := Options{Namespace: "prism", Name: "seq", Identity: "a:1"}
	o.EnsureDefaults()
	if err := o.Validate(); err != nil || o.RenewDeadline != 10*time.Second || o.RetryPeriod != 2*time.Second {
		t.Fatalf("defaults %+v: %v", o, err)
	}
	for _, id := range []string{"[fd00::5]:8500", "10.1.2.3:8500", "[10.1.2.3]:8500", "prism-router-0.prism-router-headless:8500"} {
		ok := Options{Namespace: "prism", Name: "seq", Identity: id}
		ok.EnsureDefaults()
		if err := ok.Validate(); err != nil {
			t.Errorf("identity %q: %v", id, err)
		}
	}
	for _, bad := range []Options{
		{Namespace: "prism", Name: "seq"},
		{Namespace: "prism", Name: "seq", Identity: "a:1", LeaseDuration: 500 * time.Millisecond},
		{Namespace: "prism", Name: "seq", Identity: "a:1", LeaseDuration: time.Second, RenewDeadline: time.Second},
		{Namespace: "prism", Name: "seq", Identity: "a:1", LeaseDuration: 2 * time.Second, RenewDeadline: time.Second, RetryPeriod: time.Second},
		// The Lease records 2s: the others take it over after 2s, while
		// the holder would renew within 1.67s every 333ms.
		{Namespace: "prism", Name: "seq", Identity: "a:1", LeaseDuration: 2500 * time.Millisecond},
		// Not an address the other routers can dial: an IPv6 pod IP
		// and a port without brackets, no port, no host.
		{Namespace: "prism", Name: "seq", Identity: "fd00::5:8500"},
		{Namespace: "prism", Name: "seq", Identity: "prism-router-0"},
		{Namespace: "prism", Name: "seq", Identity: ":8500"},
	} {
		bad.EnsureDefaults()
		if err := bad.Validate(); err == nil {
			t.Errorf("Validate(%+v): no error", bad)
		}
	}
}

// A holder that dies and is restarted under the same address (a Pod's
// container restart) is another process to the Lease: its hold, or
// the other router's, counts a change (the epoch moves on), never the
// crashed process's epoch again. With the address alone as identity
// the restarted process took the crashed one's hold back at once with
// the same epoch, and a router holding a copy of the crashed process's
// log would have started from it after the restarted one had numbered
// updates of its own (found by review).
func TestRestartedHolderIsAnotherHold(t *testing.T) {
	cl := newCluster()
	a1 := cl.start(t, "10.0.0.1:8500")
	waitFor(t, a1, "10.0.0.1:8500", 5*time.Second)
	b := cl.start(t, "10.0.0.2:8500")
	waitFor(t, b, "10.0.0.1:8500", 5*time.Second)
	ea1 := a1.last().epoch
	a1.cut.Store(true) // dies: neither renews nor gives the Lease up
	a2 := cl.start(t, "10.0.0.1:8500")
	deadline := time.Now().Add(2*leaseDuration + 10*retryPeriod)
	for time.Now().Before(deadline) {
		for _, c := range []*candidate{a2, b} {
			if v := c.last(); v.leader == c.name && v.epoch != 0 {
				if v.epoch != ea1+1 {
					t.Fatalf("%s holds at epoch %#x after the crashed holder's %#x: want one more", c.name, v.epoch, ea1)
				}
				return
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("nobody took the Lease over (a2 sees %q, b %q)", a2.last().leader, b.last().leader)
}

// TestRecreatedLeaseOrdered: the Lease is deleted under its holder and
// made again (an operator's kubectl delete; the holder's next renewal
// finds none and makes a new one). The new Lease's count of holds
// starts over, yet its holds' epochs follow every hold of the old one,
// so a worker that heard of the new hold refuses the old hold's
// updates, and one that heard of the old hold takes the new one as
// later. (With a uid's hash in the epoch, as before, the two were not
// ordered: a deposed holder of the old Lease could still write.)
func TestRecreatedLeaseOrdered(t *testing.T) {
	cl := newCluster()
	a := cl.start(t, "10.0.0.1:8500")
	waitFor(t, a, "10.0.0.1:8500", 5*time.Second)
	b := cl.start(t, "10.0.0.2:8500")
	waitFor(t, b, "10.0.0.1:8500", 5*time.Second)
	// a gives the Lease up: b's hold is its second.
	a.cancel()
	<-a.done
	waitFor(t, b, "10.0.0.2:8500", 5*time.Second)
	old := b.last().epoch
	if uint32(old)&^prismv1.OrderedEpoch != 2 {
		t.Fatalf("b's hold of the first Lease: epoch %s, want its second hold", prismv1.FormatEpoch(old))
	}
	gvr := coordv1.SchemeGroupVersion.WithResource("leases")
	if err := cl.tracker.Delete(gvr, "prism", "prism-router-sequencer"); err != nil {
		t.Fatal(err)
	}
	c := cl.start(t, "10.0.0.3:8500")
	// Whoever holds the new Lease (b making it anew on its renewal, or
	// c), its first hold's epoch is above the old Lease's.
	deadline := time.Now().Add(2*leaseDuration + 10*retryPeriod)
	for ; time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		for _, x := range []*candidate{b, c} {
			v := x.last()
			if v.leader != x.name || v.epoch == 0 || v.epoch == old {
				continue
			}
			if cl.made.Load() != 2 {
				t.Fatalf("%s holds at %s with %d Leases made, want the second", x.name, prismv1.FormatEpoch(v.epoch), cl.made.Load())
			}
			// c's hold is the new Lease's first (c never read the old
			// one); b, making it anew on its renewal, counts on from the
			// hold it had (Elector.floor; TestHolderRemakesItsLease).
			count := uint32(1)
			if x == b {
				count = 3
			}
			if uint32(v.epoch)&^prismv1.OrderedEpoch != count || v.epoch <= old {
				t.Fatalf("%s's hold of the new Lease: epoch %s, after %s: want hold %d, above the old Lease's", x.name, prismv1.FormatEpoch(v.epoch), prismv1.FormatEpoch(old), count)
			}
			if !prismv1.EpochStale(v.epoch, old) || prismv1.EpochRaises(v.epoch, old) || !prismv1.EpochRaises(old, v.epoch) {
				t.Fatalf("a worker holding %s does not refuse %s, or one holding the old does not take the new", prismv1.FormatEpoch(v.epoch), prismv1.FormatEpoch(old))
			}
			t.Logf("old Lease's last hold %s; new Lease's first %s", prismv1.FormatEpoch(old), prismv1.FormatEpoch(v.epoch))
			// The other one's renewals of the deleted Lease are refused (a
			// stale resourceVersion): it stops leading within its renew
			// deadline, and the new Lease stays the holder's, with its epoch.
			other := b
			if x == b {
				other = c
			}
			time.Sleep(renewDeadline + 3*retryPeriod)
			if o, h := other.last(), x.last(); o.leader == other.name || h.leader != x.name || h.epoch != v.epoch {
				t.Fatalf("after the new Lease's first hold (%s, %s): %s sees %q, %s sees %q at %s; want %s alone to hold it, at that epoch", x.name, prismv1.FormatEpoch(v.epoch), other.name, o.leader, x.name, h.leader, prismv1.FormatEpoch(h.epoch), x.name)
			}
			return
		}
	}
	t.Fatalf("nobody holds the new Lease (b sees %q, c %q)", b.last().leader, c.last().leader)
}

// TestHolderRemakesItsLease: the Lease is deleted under its holder and
// nobody else makes it first, so the holder's next renewal makes it
// anew (client-go creates it when it finds none, in the same hold, with
// no new start of leading). The elector reports the new Lease's epoch
// for its hold (Elector.wrote), above the old one's, without reporting
// a stop in between; the count it makes the new Lease with goes on from
// the old Lease's hold (Elector.floor), and its renewals keep it. (TestRecreatedLeaseOrdered's other router almost always
// makes the new Lease first, so it does not reach this path.)
func TestHolderRemakesItsLease(t *testing.T) {
	cl := newCluster()
	a := cl.start(t, "10.0.0.1:8500")
	waitFor(t, a, "10.0.0.1:8500", 5*time.Second)
	b := cl.start(t, "10.0.0.2:8500")
	waitFor(t, b, "10.0.0.1:8500", 5*time.Second)
	a.cancel()
	<-a.done
	waitFor(t, b, "10.0.0.2:8500", 5*time.Second)
	old := b.last().epoch
	if uint32(old)&^prismv1.OrderedEpoch != 2 {
		t.Fatalf("b's hold of the first Lease: epoch %s, want its second hold", prismv1.FormatEpoch(old))
	}
	b.mu.Lock()
	seen := len(b.views)
	b.mu.Unlock()
	gvr := coordv1.SchemeGroupVersion.WithResource("leases")
	if err := cl.tracker.Delete(gvr, "prism", "prism-router-sequencer"); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(renewDeadline + 5*retryPeriod); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		v := b.last()
		if v.epoch == old {
			continue
		}
		b.mu.Lock()
		views := append([]view(nil), b.views[seen:]...)
		b.mu.Unlock()
		for _, w := range views {
			if w.leader != b.name {
				t.Fatalf("b reported %q while its Lease was made anew (views %v): want its hold to go on", w.leader, views)
			}
		}
		// Its count goes on from the epoch it held (hold 2): hold 3.
		want := uint64(created(2).Unix())<<32 | prismv1.OrderedEpoch | 3
		if cl.made.Load() != 2 || v.epoch != want || !prismv1.EpochStale(v.epoch, old) {
			t.Fatalf("b's hold in the Lease it made anew: epoch %s (%d Leases made), want %s, above %s", prismv1.FormatEpoch(v.epoch), cl.made.Load(), prismv1.FormatEpoch(want), prismv1.FormatEpoch(old))
		}
		return
	}
	t.Fatalf("b's epoch still %s after its Lease was deleted (last view %v)", prismv1.FormatEpoch(b.last().epoch), b.last())
}

// TestRecreatedLeaseSameSecond: a Lease deleted and made anew by
// another router within the second the old one was made (so both have
// one creation time) is ordered by its count: the maker counts on from
// the highest epoch it read (Elector.floor), so its hold is above every
// hold of the old Lease, and the workers refuse the cut-off holder's
// updates. (Made from a count of zero, as client-go makes a Lease, its
// first hold would have the old Lease's first hold's epoch.)
func TestRecreatedLeaseSameSecond(t *testing.T) {
	cl := newCluster()
	cl.sameSecond.Store(true)
	a := cl.start(t, "10.0.0.1:8500")
	waitFor(t, a, "10.0.0.1:8500", 5*time.Second)
	b := cl.start(t, "10.0.0.2:8500")
	waitFor(t, b, "10.0.0.1:8500", 5*time.Second)
	old := a.last().epoch
	// a is cut off (neither renews nor makes the Lease anew), and the
	// Lease is deleted: b, which read it, makes it anew.
	a.cut.Store(true)
	gvr := coordv1.SchemeGroupVersion.WithResource("leases")
	if err := cl.tracker.Delete(gvr, "prism", "prism-router-sequencer"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, b, "10.0.0.2:8500", 5*time.Second)
	v := b.last()
	for deadline := time.Now().Add(5 * retryPeriod); v.epoch == 0 && time.Now().Before(deadline); v = b.last() {
		// The hold began before its epoch could be read: a renewal names it.
		time.Sleep(10 * time.Millisecond)
	}
	if cl.made.Load() != 2 || v.epoch>>32 != old>>32 {
		t.Fatalf("b holds at %s with %d Leases made, want the second, made in the first's second (%s)", prismv1.FormatEpoch(v.epoch), cl.made.Load(), prismv1.FormatEpoch(old))
	}
	if v.epoch <= old || !prismv1.EpochStale(v.epoch, old) || !prismv1.EpochRaises(old, v.epoch) {
		t.Fatalf("b's hold of the Lease made anew in the same second: epoch %s, want above the old Lease's %s", prismv1.FormatEpoch(v.epoch), prismv1.FormatEpoch(old))
	}
	// b's renewals keep the count it made the Lease with (client-go
	// writes the one it asked for, zero).
	time.Sleep(4 * retryPeriod)
	if w := b.last(); w.leader != b.name || w.epoch != v.epoch {
		t.Fatalf("after b's renewals: %q at %s, want b at %s", w.leader, prismv1.FormatEpoch(w.epoch), prismv1.FormatEpoch(v.epoch))
	}
	l, err := cl.tracker.Get(gvr, "prism", "prism-router-sequencer")
	if err != nil {
		t.Fatal(err)
	}
	if got := Epoch(l.(*coordv1.Lease).CreationTimestamp.Time, *l.(*coordv1.Lease).Spec.LeaseTransitions); got != v.epoch {
		t.Fatalf("the stored Lease's epoch %s, want b's %s", prismv1.FormatEpoch(got), prismv1.FormatEpoch(v.epoch))
	}
}

// TestEpochBounds: an epoch is ordered, the creation time's seconds
// above the count, and 0 (not known) where either does not fit: no
// count spills into the mark or the time, at the int32 limit of
// leaseTransitions either.
func TestEpochBounds(t *testing.T) {
	at := time.Unix(1796126400, 0)
	for _, c := range []struct {
		created     time.Time
		transitions int32
		want        uint64
	}{
		{at, 0, 1796126400<<32 | prismv1.OrderedEpoch | 1},
		{at, math.MaxInt32 - 1, 1796126400<<32 | prismv1.OrderedEpoch | math.MaxInt32},
		{at, math.MaxInt32, 0},
		{at, -1, 0},
		{time.Time{}, 0, 0},
		{time.Unix(0, 0), 0, 0},
		{time.Unix(math.MaxUint32, 0), 0, math.MaxUint32<<32 | prismv1.OrderedEpoch | 1},
		{time.Unix(math.MaxUint32+1, 0), 0, 0},
	} {
		if got := Epoch(c.created, c.transitions); got != c.want {
			t.Errorf("Epoch(%v, %d) = %#x, want %#x", c.created.UTC(), c.transitions, got, c.want)
		}
	}
	last := Epoch(at, math.MaxInt32-1)
	if !prismv1.EpochRaises(Epoch(at, math.MaxInt32-2), last) || !prismv1.EpochStale(Epoch(at.Add(time.Second), 0), last) {
		t.Errorf("the last count of a Lease is not ordered between its previous one and a later Lease's first")
	}
}

// TestEpochLearntFromRenewal: the Lease cannot be read when the hold
// begins (readEpoch's Get fails), so the hold starts with epoch 0, not
// known: unfenced. The next renewal's answer names the Lease, and its
// epoch is reported then, so the workers are told it and fencing starts
// one retry period later instead of never in this hold.
func TestEpochLearntFromRenewal(t *testing.T) {
	cl := newCluster()
	// Get 1 is client-go's (no Lease yet: NotFound, then it makes one);
	// Get 2 is readEpoch's, at the start of the hold.
	cl.failGet.Store(2)
	a := cl.start(t, "10.0.0.1:8500")
	waitFor(t, a, "10.0.0.1:8500", 5*time.Second)
	deadline := time.Now().Add(5 * time.Second)
	for ; time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if v := a.last(); v.leader == a.name && v.epoch != 0 {
			if want := Epoch(created(1), 0); v.epoch != want {
				t.Fatalf("epoch %s, want %s", prismv1.FormatEpoch(v.epoch), prismv1.FormatEpoch(want))
			}
			a.mu.Lock()
			first := a.views[0]
			a.mu.Unlock()
			if first.leader != a.name || first.epoch != 0 {
				t.Fatalf("first view %+v: want the hold with epoch 0 (readEpoch's Get failed)", first)
			}
			return
		}
	}
	t.Fatalf("the hold's epoch was never learnt (view %+v, Gets %d)", a.last(), cl.gets.Load())
}
