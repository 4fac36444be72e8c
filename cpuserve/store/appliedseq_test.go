package store

import (
	"context"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/prism-serve/prism/internal/crashfs"
)

// TestAppliedSeqDuringSyncedUpsert: the update number a worker announces
// every heartbeat (AppliedSeq) is read while an upsert waits for its
// write-ahead log's sync, not after it. Read under the upserts' lock, a
// heartbeat waited out the whole write: a large update (a million rows
// took 2.4-7.3 s), or a disk slow to sync, kept the worker from
// announcing for three heartbeats, and the router removed it, lookups
// and updates of its models and all ("worker stopped answering").
func TestAppliedSeqDuringSyncedUpsert(t *testing.T) {
	g := crashfs.NewSyncGate(vfs.NewMem())
	s, _ := openMem(t, &Options{FS: g, HotBytes: -1})
	if _, err := s.Ingest(context.Background(), writePlan(t, "m", []*testTable{{name: "a", rows: 10, dim: 4, seed: 1}}), IngestOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.UpsertSeq("m", "a", []int64{1}, fill(4, 1), 1); err != nil {
		t.Fatal(err)
	}
	g.Arm(true)
	done := make(chan error, 1)
	go func() {
		_, err := s.UpsertSeq("m", "a", []int64{2}, fill(4, 2), 2)
		done <- err
	}()
	select {
	case <-g.Blocked():
	case <-time.After(10 * time.Second):
		t.Fatal("the upsert never synced its log")
	}
	read := make(chan int64, 1)
	go func() {
		seq, err := s.AppliedSeq("m")
		if err != nil {
			t.Error(err)
		}
		read <- seq
	}()
	waited := false
	select {
	case seq := <-read:
		if seq != 1 {
			t.Errorf("AppliedSeq during update 2's sync = %d, want 1 (update 2 is not durable yet)", seq)
		}
	case <-time.After(2 * time.Second):
		t.Errorf("AppliedSeq waited for an upsert's sync (2 s and counting)")
		waited = true
	}
	g.Arm(false)
	g.Release()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if waited {
		<-read
	}
	if seq, err := s.AppliedSeq("m"); err != nil || seq != 2 {
		t.Fatalf("AppliedSeq after update 2 = %d, %v; want 2", seq, err)
	}
}
