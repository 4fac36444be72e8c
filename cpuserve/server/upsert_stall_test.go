package server

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/prism-serve/prism/internal/crashfs"

	"github.com/prism-serve/prism/cpuserve/store"
)

// TestUpsertInFlightStallsNoLookupNorHeartbeat: while an upsert waits
// for its synced write (a disk slow to sync; a large update: a million
// rows took 2.4-7.3 s), lookups and the heartbeat's WorkerInfo go on.
// Both read the model's active version through the store's catalog
// lock, which an upsert holds from its checks to its write, so every
// lookup of the model waited out the write (one refreshing the cached
// version, the others behind it), and the worker did not announce for
// as long: over three heartbeats, the router removed it ("worker
// stopped answering"). WorkerInfo read the update number under the
// upserts' lock, too.
func TestUpsertInFlightStallsNoLookupNorHeartbeat(t *testing.T) {
	g := crashfs.NewSyncGate(vfs.NewMem())
	s, addr := serveTestPlanOn(t, testPlan(3), Options{}, zeroScores{}, &store.Options{FS: g})
	if _, err := s.st.UpsertSeq("m", "t", []int64{1}, []float32{2, 2, 2, 2}, 1); err != nil {
		t.Fatal(err)
	}
	s.WorkerInfo("w", "addr") // the first announcement, at the worker's start
	g.Arm(true)
	done := make(chan error, 1)
	go func() {
		_, err := s.st.UpsertSeq("m", "t", []int64{2}, []float32{3, 3, 3, 3}, 2)
		done <- err
	}()
	select {
	case <-g.Blocked():
	case <-time.After(10 * time.Second):
		t.Fatal("the upsert never synced its log")
	}
	// Longer than the version cache once kept a figure (500 ms): the
	// next lookup or heartbeat reads the version anew.
	time.Sleep(600 * time.Millisecond)
	type result struct {
		what string
		err  error
	}
	results := make(chan result, 2)
	go func() {
		info := s.WorkerInfo("w", "addr")
		var err error
		if got := info.GetUpdateSeq()["m"]; got != 1 {
			err = fmt.Errorf("announces update %d, want 1 (update 2 is not durable yet)", got)
		}
		results <- result{"WorkerInfo (the heartbeat)", err}
	}()
	go func() {
		_, err := s.Lookup(context.Background(), idsLookup(addr, 1, []int64{1, 2, 3}))
		results <- result{"Lookup", err}
	}()
	deadline := time.After(2 * time.Second)
	answered := 0
	for answered < 2 {
		select {
		case r := <-results:
			answered++
			t.Logf("%s answered", r.what)
			if r.err != nil {
				t.Errorf("%s during an upsert's sync: %v", r.what, r.err)
			}
		case <-deadline:
			t.Errorf("%d of WorkerInfo and Lookup waited for an upsert's sync (2 s and counting)", 2-answered)
			answered = 2
		}
	}
	g.Arm(false)
	g.Release()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := s.WorkerInfo("w", "addr").GetUpdateSeq()["m"]; got != 2 {
		t.Fatalf("after update 2, announces %d", got)
	}
}
