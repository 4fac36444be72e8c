package kubelease

import (
	"context"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/internal/kubetest"
)

// TestElectionOnAPIServer: two electors on a real API server
// (internal/kubetest; skipped without it) agree on one holder; when the
// holder stops and gives the Lease up, the other takes it over, and the
// time that takes is logged (BENCHMARKS.md, multi-host).
func TestElectionOnAPIServer(t *testing.T) {
	s := kubetest.Start(t)
	cfg, err := clientcmd.BuildConfigFromFlags("", s.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	leases, err := v1.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	type seen struct {
		mu    sync.Mutex
		view  string
		epoch uint64
		at    time.Time
	}
	start := func(id string) (*seen, context.CancelFunc, chan struct{}) {
		e, err := New(Options{Namespace: "default", Name: "prism-router-sequencer", Identity: id, Leases: leases,
			LeaseDuration: 2 * time.Second, RenewDeadline: 1200 * time.Millisecond, RetryPeriod: 200 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		v := &seen{}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			e.Run(ctx, func(addr string, epoch uint64) {
				v.mu.Lock()
				v.view, v.epoch, v.at = addr, epoch, time.Now()
				v.mu.Unlock()
			})
		}()
		t.Cleanup(func() { cancel(); <-done })
		return v, cancel, done
	}
	view := func(v *seen) (string, time.Time) {
		v.mu.Lock()
		defer v.mu.Unlock()
		return v.view, v.at
	}
	a, stopA, doneA := start("10.0.0.1:8500")
	b, stopB, doneB := start("10.0.0.2:8500")
	var holder string
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		va, _ := view(a)
		vb, _ := view(b)
		if va != "" && va == vb {
			holder = va
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no agreed holder: a sees %q, b sees %q", va, vb)
		}
	}
	if holder != "10.0.0.1:8500" && holder != "10.0.0.2:8500" {
		t.Fatalf("holder %q", holder)
	}
	// Stop the holder (it gives the Lease up) and time the takeover.
	other, otherID := b, "10.0.0.2:8500"
	stop, done := stopA, doneA
	if holder == "10.0.0.2:8500" {
		other, otherID, stop, done = a, "10.0.0.1:8500", stopB, doneB
	}
	stopped := time.Now()
	stop()
	<-done
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if v, at := view(other); v == otherID {
			t.Logf("failover on a real API server (holder stopped and released the Lease): %v", at.Sub(stopped).Round(time.Millisecond))
			break
		}
		if time.Now().After(deadline) {
			v, _ := view(other)
			t.Fatalf("the other elector never took over: it sees %q", v)
		}
	}
	// The Lease deleted under its holder (made over a second before): the
	// holder makes it anew on its next renewal, and the epoch of that
	// hold, in the new Lease, is above the old Lease's (the API server's
	// creation times order them; kubelease.Epoch), reported without a
	// new start of leading (Elector.wrote).
	epoch := func() uint64 { other.mu.Lock(); defer other.mu.Unlock(); return other.epoch }
	old := epoch()
	if !prismv1.Ordered(old) {
		t.Fatalf("holder's epoch %s: want an ordered one", prismv1.FormatEpoch(old))
	}
	// A second later: the new Lease's creation time orders it.
	time.Sleep(1100 * time.Millisecond)
	if err := leases.Leases("default").Delete(context.Background(), "prism-router-sequencer", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	remade := func(old uint64) uint64 {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			if e := epoch(); e != 0 && e != old {
				if e <= old || !prismv1.EpochStale(e, old) {
					t.Fatalf("hold of the Lease made anew: epoch %s after %s; want above", prismv1.FormatEpoch(e), prismv1.FormatEpoch(old))
				}
				return e
			}
			if time.Now().After(deadline) {
				t.Fatalf("no hold of a new Lease after the delete (epoch still %s)", prismv1.FormatEpoch(epoch()))
			}
		}
	}
	e := remade(old)
	if e>>32 <= old>>32 {
		t.Fatalf("hold of the Lease made anew a second later: epoch %s after %s; want a later Lease's", prismv1.FormatEpoch(e), prismv1.FormatEpoch(old))
	}
	t.Logf("Lease deleted and made anew by its holder: epoch %s after %s", prismv1.FormatEpoch(e), prismv1.FormatEpoch(old))
	// Deleted again at once, it is made anew mostly within the second
	// the last one was (a retry period later): its count orders it
	// (Elector.floor) where its creation time does not.
	// Tried until one is (remade checks each is ordered after the last).
	for try := 1; try <= 8; try++ {
		if err := leases.Leases("default").Delete(context.Background(), "prism-router-sequencer", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		e2 := remade(e)
		if e2>>32 == e>>32 {
			t.Logf("deleted again at once and made anew in the same second (try %d): epoch %s after %s", try, prismv1.FormatEpoch(e2), prismv1.FormatEpoch(e))
			return
		}
		e = e2
	}
	t.Logf("no Lease made anew within the second of the last in 8 tries; each was ordered after the last")
}
