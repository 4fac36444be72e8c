package store

import (
	"context"
	"errors"
	"math"
	"slices"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// TestUpsertSeq: sequenced upserts apply in order, replays are
// acknowledged without writing, gaps are refused, bad input takes its
// place in the sequence, and the seq survives a reopen with the rows.
func TestUpsertSeq(t *testing.T) {
	tabs := []*testTable{{name: "a", rows: 10, dim: 2, seed: 1}}
	s, fs := openMem(t, &Options{})
	if _, err := s.Ingest(context.Background(), writePlan(t, "m", tabs), IngestOptions{}); err != nil {
		t.Fatal(err)
	}
	row := func(v float32) []float32 { return []float32{v, v} }
	steps := []struct {
		seq     int64
		table   string
		id      int64
		val     float32
		applied bool
		err     error // errors.Is target; nil: none
		gap     bool
		after   int64 // AppliedSeq afterwards
	}{
		{seq: 1, table: "a", id: 1, val: 10, applied: true, after: 1},
		{seq: 2, table: "a", id: 1, val: 20, applied: true, after: 2},
		{seq: 1, table: "a", id: 1, val: 99, applied: false, after: 2}, // replay: not written again
		{seq: 4, table: "a", id: 2, val: 40, gap: true, after: 2},
		{seq: 3, table: "nope", id: 2, val: 30, err: ErrUnknownTable, after: 3}, // rejected, seq taken
		{seq: 3, table: "nope", id: 2, val: 30, err: ErrUnknownTable, after: 3}, // its replay
		{seq: 4, table: "a", id: 2, val: 40, applied: true, after: 4},
		{seq: 6, table: "nope", id: 2, val: 30, gap: true, after: 4}, // bad and early: the gap comes first
		{seq: 5, table: "a", id: 99, val: 1, err: ErrIDOutOfRange, after: 5},
	}
	for i, st := range steps {
		applied, err := s.UpsertSeq("m", st.table, []int64{st.id}, row(st.val), st.seq)
		var gapErr *SeqGapError
		switch {
		case st.gap:
			if !errors.As(err, &gapErr) || gapErr.Applied != st.after || gapErr.Got != st.seq {
				t.Fatalf("step %d: %v, want a gap after %d", i, err, st.after)
			}
		case st.err != nil:
			if !errors.Is(err, st.err) {
				t.Fatalf("step %d: %v, want %v", i, err, st.err)
			}
		case err != nil:
			t.Fatalf("step %d: %v", i, err)
		}
		if applied != st.applied {
			t.Fatalf("step %d: applied %v", i, applied)
		}
		if got, err := s.AppliedSeq("m"); err != nil || got != st.after {
			t.Fatalf("step %d: AppliedSeq %d, %v; want %d", i, got, err, st.after)
		}
	}
	if got := lookupRow(t, s, "m", "a", 1, 2); got[0] != 20 {
		t.Fatalf("row 1 reads %v: a replay wrote over a later update", got)
	}
	if _, err := s.UpsertSeq("m", "a", []int64{1}, row(1), 0); !errors.Is(err, ErrBadRequest) {
		t.Fatalf("seq 0: %v", err)
	}
	// Unsequenced upserts leave the sequence alone.
	if err := s.Upsert("m", "a", []int64{3}, row(3)); err != nil {
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
	if got, err := s2.AppliedSeq("m"); err != nil || got != 5 {
		t.Fatalf("after reopen: AppliedSeq %d, %v; want 5", got, err)
	}
	if got := lookupRow(t, s2, "m", "a", 2, 2); got[0] != 40 {
		t.Fatalf("after reopen: row 2 reads %v", got)
	}
	if got, _ := s2.AppliedSeq("other"); got != 0 {
		t.Fatalf("a model without updates: %d", got)
	}
}

// TestSkipSeqs: a run of numbers taken in one write, from at most one
// past the last held; numbers held already are no-ops, and a run
// starting inside what the store holds takes the rest.
func TestSkipSeqs(t *testing.T) {
	tabs := []*testTable{{name: "a", rows: 10, dim: 2, seed: 1}}
	s, _ := openMem(t, &Options{})
	if _, err := s.Ingest(context.Background(), writePlan(t, "m", tabs), IngestOptions{}); err != nil {
		t.Fatal(err)
	}
	for i, st := range []struct {
		from, to int64
		gap, bad bool
		after    int64
	}{
		{from: 1, to: 4, after: 4},
		{from: 2, to: 3, after: 4},             // held already
		{from: 3, to: 7, after: 7},             // starts inside: takes 5 .. 7
		{from: 9, to: 12, gap: true, after: 7}, // 8 missing
		{from: 8, to: 8, after: 8},
		{from: 5, to: 4, bad: true, after: 8},
		{from: 0, to: 9, bad: true, after: 8},
	} {
		err := s.SkipSeqs("m", st.from, st.to)
		var gapErr *SeqGapError
		switch {
		case st.gap:
			if !errors.As(err, &gapErr) || gapErr.Applied != st.after || gapErr.Got != st.from {
				t.Fatalf("step %d: %v, want a gap after %d", i, err, st.after)
			}
		case st.bad:
			if !errors.Is(err, ErrBadRequest) {
				t.Fatalf("step %d: %v, want ErrBadRequest", i, err)
			}
		case err != nil:
			t.Fatalf("step %d: %v", i, err)
		}
		if got, err := s.AppliedSeq("m"); err != nil || got != st.after {
			t.Fatalf("step %d: AppliedSeq %d, %v; want %d", i, got, err, st.after)
		}
	}
}

// BenchmarkCatchUpSkips: a sharded worker back after its model took 1000
// updates of other shards' tables takes their numbers, one synced write
// each (SkipSeq, as before ranges) or in one (SkipSeqs), on disk. Run:
//
//	go test -run '^$' -bench CatchUpSkips -benchtime 3x ./cpuserve/store/
func BenchmarkCatchUpSkips(b *testing.B) {
	const behind = 1000
	for _, mode := range []string{"one-by-one", "range"} {
		b.Run(mode, func(b *testing.B) {
			s, err := Open(b.TempDir(), &Options{FS: vfs.Default})
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			if _, err := s.Ingest(context.Background(), writePlan(b, "m", []*testTable{{name: "a", rows: 10, dim: 2, seed: 1}}), IngestOptions{}); err != nil {
				b.Fatal(err)
			}
			var next int64 = 1
			b.ResetTimer()
			for range b.N {
				if mode == "range" {
					err = s.SkipSeqs("m", next, next+behind-1)
				} else {
					for seq := next; seq < next+behind && err == nil; seq++ {
						err = s.SkipSeq("m", seq)
					}
				}
				if err != nil {
					b.Fatal(err)
				}
				next += behind
			}
			b.ReportMetric(float64(b.Elapsed().Microseconds())/1000/float64(b.N), "ms/catch-up")
		})
	}
}

// An update holding a NaN or an infinity is bad input, as at ingest:
// nothing written (not even the other rows of the call), the row read
// as before, its seq taken; a quantized table's hot tier never sees the
// row of NaNs int8 would store.
func TestUpsertNonFinite(t *testing.T) {
	const dim = 16
	tabs := []*testTable{{name: "a", rows: 100, dim: dim, seed: 1}}
	for _, dt := range []DType{Float32, Int8} {
		s, _ := openMem(t, &Options{HotBytes: 1 << 20})
		if _, err := s.Ingest(context.Background(), writePlan(t, "m", tabs), IngestOptions{DType: dt}); err != nil {
			t.Fatal(err)
		}
		read := func(id int64) []float32 {
			t.Helper()
			out := make([]float32, dim)
			if err := s.Lookup("m", []TableLookup{{Table: "a", IDs: []int64{id}, Pooling: PoolSum, Out: out}}); err != nil {
				t.Fatal(err)
			}
			return out
		}
		before3, before4 := read(3), read(4)
		for i, bad := range []float32{float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1))} {
			rows := make([]float32, 2*dim)
			for k := range rows {
				rows[k] = 0.5
			}
			rows[dim+7] = bad
			seq := int64(i + 1)
			applied, err := s.UpsertSeq("m", "a", []int64{3, 4}, rows, seq)
			if applied || !IsInputError(err) {
				t.Errorf("%s: upsert of a row holding %v: applied %v, %v; want bad input", dt, bad, applied, err)
			}
			if got, err := s.AppliedSeq("m"); err != nil || got != seq {
				t.Errorf("%s: AppliedSeq %d %v after bad update %d", dt, got, err, seq)
			}
			if got := read(3); !slices.Equal(got, before3) {
				t.Errorf("%s: row 3 reads %v after a refused update, want %v", dt, got, before3)
			}
			if got := read(4); !slices.Equal(got, before4) {
				t.Errorf("%s: row 4 reads %v after a refused update, want %v", dt, got, before4)
			}
		}
	}
}

// TestUpsertRepeatedIDLastWins: an id given twice in one upsert reads
// the later row, from the hot tier and from Pebble after a reopen, as
// if the rows had come in two upserts. The router's group commit relies
// on it: it merges concurrent clients' updates of a table into one,
// their rows in the order it took them (router/sequencer_merge.go).
func TestUpsertRepeatedIDLastWins(t *testing.T) {
	tabs := []*testTable{{name: "a", rows: 10, dim: 2, seed: 1}}
	for _, dt := range []DType{Float32, Float16, Int8} {
		for _, preload := range []PreloadMode{PreloadOff, PreloadAuto} {
			t.Run(string(dt)+"/preload="+string(preload), func(t *testing.T) {
				s, fs := openMem(t, &Options{HotBytes: 1 << 20, Preload: preload})
				if _, err := s.Ingest(context.Background(), writePlan(t, "m", tabs), IngestOptions{DType: dt}); err != nil {
					t.Fatal(err)
				}
				lookupRow(t, s, "m", "a", 3, 2) // resident, where there is a hot tier
				ids := []int64{3, 5, 3, 5, 3}
				rows := []float32{1, 1, 5, 5, 2, 2, 6, 6, 4, 4}
				if _, err := s.UpsertSeq("m", "a", ids, rows, 1); err != nil {
					t.Fatal(err)
				}
				check := func(s *Store, when string) {
					for id, want := range map[int64]float32{3: 4, 5: 6} {
						if got := lookupRow(t, s, "m", "a", id, 2); got[0] != want || got[1] != want {
							t.Fatalf("%s: row %d reads %v, want the last row given, %v", when, id, got, want)
						}
					}
				}
				check(s, "after the upsert")
				if err := s.Close(); err != nil {
					t.Fatal(err)
				}
				s2, err := Open("db", &Options{FS: fs})
				if err != nil {
					t.Fatal(err)
				}
				defer s2.Close()
				check(s2, "after a reopen")
			})
		}
	}
}
