package store

import (
	"context"
	"errors"
	"testing"

	"github.com/prism-serve/prism/api/prismv1"
)

// TestEpochFence: sequenced writes of an earlier hold of the sequencing
// Lease than the store has heard of are refused (*StaleEpochError),
// writing nothing and taking no number, on every path (rows, a number
// alone, a range, a replay, bad input); a later epoch, an update's or
// RaiseEpoch's, raises the kept one; another legacy Lease's (high 32
// bits: a uid's hash, as routers of earlier releases send) is not
// compared (TestEpochFenceAcrossLeases: ordered epochs are); 0 is not
// checked. The kept epoch survives a reopen, written with the seq
// (issue 14).
func TestEpochFence(t *testing.T) {
	tabs := []*testTable{{name: "a", rows: 10, dim: 2, seed: 1}}
	s, fs := openMem(t, &Options{})
	if _, err := s.Ingest(context.Background(), writePlan(t, "m", tabs), IngestOptions{}); err != nil {
		t.Fatal(err)
	}
	const lease, other = uint64(0xfe11ce00) << 32, uint64(0x0c0ffee0) << 32
	row := func(v float32) []float32 { return []float32{v, v} }
	type step struct {
		op         string // upsert, skip (from = seq), skips (seq-1 .. seq), raise
		table      string
		seq        int64
		epoch      uint64
		val        float32
		stale      bool
		after      int64  // AppliedSeq afterwards
		afterEpoch uint64 // Epoch afterwards
	}
	steps := []step{
		{op: "upsert", table: "a", seq: 1, epoch: 0, val: 1, after: 1, afterEpoch: 0},                 // unchecked, nothing kept
		{op: "upsert", table: "a", seq: 2, epoch: lease | 3, val: 2, after: 2, afterEpoch: lease | 3}, // kept with the seq
		{op: "upsert", table: "a", seq: 3, epoch: lease | 2, val: 9, stale: true, after: 2, afterEpoch: lease | 3},
		{op: "upsert", table: "a", seq: 2, epoch: lease | 2, val: 9, stale: true, after: 2, afterEpoch: lease | 3}, // not even a replay's ack
		{op: "upsert", table: "nope", seq: 3, epoch: lease | 2, stale: true, after: 2, afterEpoch: lease | 3},      // bad input takes no number
		{op: "skip", seq: 3, epoch: lease | 2, stale: true, after: 2, afterEpoch: lease | 3},
		{op: "raise", epoch: lease | 5, after: 2, afterEpoch: lease | 5}, // an announcement's answer
		{op: "raise", epoch: lease | 4, after: 2, afterEpoch: lease | 5}, // lower: kept as is
		{op: "skips", seq: 4, epoch: lease | 4, stale: true, after: 2, afterEpoch: lease | 5},
		{op: "upsert", table: "a", seq: 3, epoch: 0, val: 3, after: 3, afterEpoch: lease | 5}, // 0: unchecked
		{op: "upsert", table: "a", seq: 4, epoch: lease | 5, val: 4, after: 4, afterEpoch: lease | 5},
		{op: "skips", seq: 6, epoch: lease | 6, after: 6, afterEpoch: lease | 6},                      // a range raises with its seq
		{op: "upsert", table: "a", seq: 6, epoch: lease | 7, val: 9, after: 6, afterEpoch: lease | 7}, // a replay's ack raises alone
		{op: "upsert", table: "a", seq: 7, epoch: other | 1, val: 7, after: 7, afterEpoch: other | 1}, // another Lease: not compared
		{op: "upsert", table: "a", seq: 8, epoch: other | 1, val: 8, after: 8, afterEpoch: other | 1},
	}
	for i, st := range steps {
		var err error
		switch st.op {
		case "upsert":
			_, err = s.UpsertSeqAt("m", st.table, []int64{1}, row(st.val), st.seq, st.epoch)
		case "skip":
			err = s.SkipSeqsAt("m", st.seq, st.seq, st.epoch)
		case "skips":
			err = s.SkipSeqsAt("m", st.seq-1, st.seq, st.epoch)
		case "raise":
			_, err = s.RaiseEpoch(st.epoch)
		}
		var stale *StaleEpochError
		switch {
		case st.stale:
			if !errors.As(err, &stale) || stale.Epoch != st.epoch || stale.Held != st.afterEpoch || stale.Seq != st.seq {
				t.Fatalf("step %d (%s %d epoch %#x): %v, want a stale epoch error naming %#x and %#x", i, st.op, st.seq, st.epoch, err, st.epoch, st.afterEpoch)
			}
		case err != nil && !(st.table == "nope"):
			t.Fatalf("step %d (%s %d epoch %#x): %v", i, st.op, st.seq, st.epoch, err)
		}
		if got, err := s.AppliedSeq("m"); err != nil || got != st.after {
			t.Fatalf("step %d (%s %d epoch %#x): AppliedSeq %d, %v; want %d", i, st.op, st.seq, st.epoch, got, err, st.after)
		}
		if got, err := s.Epoch(); err != nil || got != st.afterEpoch {
			t.Fatalf("step %d (%s %d epoch %#x): Epoch %#x, %v; want %#x", i, st.op, st.seq, st.epoch, got, err, st.afterEpoch)
		}
	}
	if got := lookupRow(t, s, "m", "a", 1, 2); got[0] != 8 {
		t.Fatalf("row 1 reads %v, want 8: a refused update wrote", got)
	}

	// A restart keeps refusing the earlier holds.
	if _, err := s.UpsertSeqAt("m", "a", []int64{1}, row(9), 9, lease|9); err != nil { // back to the first Lease
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s2, err := Open("db", &Options{FS: fs})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if got, err := s2.Epoch(); err != nil || got != lease|9 {
		t.Fatalf("reopened: Epoch %#x, %v; want %#x", got, err, lease|9)
	}
	var stale *StaleEpochError
	if _, err := s2.UpsertSeqAt("m", "a", []int64{1}, row(99), 10, lease|8); !errors.As(err, &stale) {
		t.Fatalf("reopened: an update of an earlier hold: %v, want it refused", err)
	}
	if got, err := s2.AppliedSeq("m"); err != nil || got != 9 {
		t.Fatalf("reopened: AppliedSeq %d, %v; want 9", got, err)
	}
	if _, err := s2.RaiseEpoch(lease | 10); err != nil {
		t.Fatal(err)
	}
	if err := s2.Close(); err != nil {
		t.Fatal(err)
	}
	s3, err := Open("db", &Options{FS: fs})
	if err != nil {
		t.Fatal(err)
	}
	defer s3.Close()
	if got, err := s3.Epoch(); err != nil || got != lease|10 {
		t.Fatalf("reopened after RaiseEpoch: Epoch %#x, %v; want %#x", got, err, lease|10)
	}
	if err := s3.SkipSeqsAt("m", 10, 10, lease|9); !errors.As(err, &stale) {
		t.Fatalf("reopened after RaiseEpoch: a number of an earlier hold: %v, want it refused", err)
	}
}

// TestEpochFenceAcrossLeases: the Lease deleted and made anew. Its first
// hold's epoch (prismv1's ordered epochs: the creation time above the
// count) is above the old Lease's ninth, so once the store has heard of
// it the old Lease's holder is refused, also after a reopen, and so is
// a router of an earlier release (a legacy epoch). With the uid's hash
// as the high bits, as before, the old holder's write was taken as
// another Lease's and raised the kept epoch back (the flip-flop).
func TestEpochFenceAcrossLeases(t *testing.T) {
	tabs := []*testTable{{name: "a", rows: 10, dim: 2, seed: 1}}
	s, fs := openMem(t, &Options{})
	if _, err := s.Ingest(context.Background(), writePlan(t, "m", tabs), IngestOptions{}); err != nil {
		t.Fatal(err)
	}
	made := func(sec uint64, hold uint64) uint64 { return sec<<32 | prismv1.OrderedEpoch | hold }
	oldLease, newLease := made(1796126400, 9), made(1796126460, 1)
	row := []float32{1, 1}
	if _, err := s.UpsertSeqAt("m", "a", []int64{1}, row, 1, oldLease); err != nil {
		t.Fatal(err)
	}
	if got, err := s.RaiseEpoch(newLease); err != nil || got != newLease {
		t.Fatalf("RaiseEpoch(new Lease) kept %#x, %v", got, err)
	}
	var stale *StaleEpochError
	if _, err := s.UpsertSeqAt("m", "a", []int64{1}, row, 2, oldLease); !errors.As(err, &stale) {
		t.Fatalf("the old Lease's holder after the new Lease's: %v, want refused", err)
	}
	if _, err := s.UpsertSeqAt("m", "a", []int64{1}, row, 2, 0xfeed<<32|12); !errors.As(err, &stale) {
		t.Fatalf("a legacy epoch after an ordered one: %v, want refused", err)
	}
	if _, err := s.UpsertSeqAt("m", "a", []int64{1}, row, 2, newLease); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s2, err := Open("db", &Options{FS: fs})
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	if err := s2.SkipSeqsAt("m", 3, 3, oldLease); !errors.As(err, &stale) {
		t.Fatalf("after a reopen, the old Lease's holder: %v, want refused", err)
	}
	if got, err := s2.AppliedSeq("m"); err != nil || got != 2 {
		t.Fatalf("AppliedSeq %d, %v; want 2", got, err)
	}
}
