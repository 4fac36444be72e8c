package store

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// overlayKeys counts the overlay keys under prefix.
func overlayKeys(t *testing.T, s *Store, prefix []byte) int {
	t.Helper()
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: prefix, UpperBound: prefixEnd(prefix)})
	if err != nil {
		t.Fatal(err)
	}
	defer it.Close()
	n := 0
	for ok := it.First(); ok; ok = it.Next() {
		n++
	}
	if err := it.Error(); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestCarriedTableIsMutated (review defect 1): a table a version switch
// carried updates into no longer holds its content hash's rows, so a
// later ingest of that content by another model must not share it.
func TestCarriedTableIsMutated(t *testing.T) {
	ctx := context.Background()
	v1 := []*testTable{{name: "a", rows: 50, dim: 4, seed: 1}}
	v2 := []*testTable{{name: "a", rows: 50, dim: 4, seed: 11}}
	s, _ := openMem(t, nil)
	if _, err := s.Ingest(ctx, writePlan(t, "m", v1), IngestOptions{}); err != nil {
		t.Fatal(err)
	}
	p2 := writePlan(t, "m", v2)
	if _, err := s.Ingest(ctx, p2, IngestOptions{NoActivate: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.UpsertSeq("m", "a", []int64{7}, fill(4, 700), 1); err != nil {
		t.Fatal(err)
	}
	if err := s.Activate("m", 2); err != nil {
		t.Fatal(err)
	}
	wantRow(t, s, "m", "a", 7, fill(4, 700), "m after activate")
	rep, err := s.Ingest(ctx, p2, IngestOptions{Model: "other"})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Tables[0].Shared {
		t.Errorf("other shares table a, which carried m's update: %+v", rep.Tables[0])
	}
	wantRow(t, s, "other", "a", 7, v2[0].data[7*4:8*4], "other model")
}

// TestDropVersionPrunesOverlay (review defect 2): the overlay of a table
// name no version of the model names any more is deleted with the
// version, the rest is kept (and still carried).
func TestDropVersionPrunesOverlay(t *testing.T) {
	ctx := context.Background()
	v1 := []*testTable{{name: "a", rows: 50, dim: 4, seed: 1}, {name: "c", rows: 20, dim: 4, seed: 3}}
	v2 := []*testTable{{name: "a", rows: 50, dim: 4, seed: 11}}
	v3 := []*testTable{{name: "a", rows: 50, dim: 4, seed: 21}}
	s, _ := openMem(t, nil)
	if _, err := s.Ingest(ctx, writePlan(t, "m", v1), IngestOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Ingest(ctx, writePlan(t, "m", v2), IngestOptions{NoActivate: true}); err != nil {
		t.Fatal(err)
	}
	for i, u := range []struct {
		table string
		id    int64
	}{{"a", 1}, {"a", 2}, {"c", 3}, {"c", 4}} {
		if _, err := s.UpsertSeq("m", u.table, []int64{u.id}, fill(4, float32(10*(i+1))), int64(i+1)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Activate("m", 2); err != nil {
		t.Fatal(err)
	}
	if n := overlayKeys(t, s, overlayTablePrefix("m", "c")); n != 2 {
		t.Fatalf("overlay of c: %d keys before the drop, want 2", n)
	}
	if err := s.DropVersion(ctx, "m", 1); err != nil {
		t.Fatal(err)
	}
	if n := overlayKeys(t, s, overlayTablePrefix("m", "c")); n != 0 {
		t.Errorf("overlay of c, which no version names: %d keys after the drop, want 0", n)
	}
	if n := overlayKeys(t, s, overlayTablePrefix("m", "a")); n != 2 {
		t.Errorf("overlay of a: %d keys after the drop, want 2", n)
	}
	// a's updates still carry.
	if _, err := s.Ingest(ctx, writePlan(t, "m", v3), IngestOptions{}); err != nil {
		t.Fatal(err)
	}
	wantRow(t, s, "m", "a", 2, fill(4, 20), "carried after the prune")
}

// TestDropModelDeletesOverlay (review defect 2): dropping a model's last
// version deletes its whole overlay and its update seq, so a model of
// that name made later neither inherits the rows nor claims the updates.
func TestDropModelDeletesOverlay(t *testing.T) {
	ctx := context.Background()
	v1 := []*testTable{{name: "a", rows: 50, dim: 4, seed: 1}}
	s, _ := openMem(t, nil)
	p := writePlan(t, "m", v1)
	if _, err := s.Ingest(ctx, p, IngestOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.UpsertSeq("m", "a", []int64{1}, fill(4, 10), 1); err != nil {
		t.Fatal(err)
	}
	// A model whose only version is inactive (what a crash between an
	// ingest's version commit and its activation leaves).
	s.catMu.Lock()
	next := s.cat.clone()
	next.Models["m"].Active = 0
	if err := s.commit(next); err != nil {
		s.catMu.Unlock()
		t.Fatal(err)
	}
	s.catMu.Unlock()
	if err := s.DropVersion(ctx, "m", 1); err != nil {
		t.Fatal(err)
	}
	var mp []byte
	mp = append(mp, overlayPrefix...)
	mp = append(mp, 1, 'm')
	if n := overlayKeys(t, s, mp); n != 0 {
		t.Errorf("overlay of the dropped model: %d keys, want 0", n)
	}
	if seq, err := s.AppliedSeq("m"); err != nil || seq != 0 {
		t.Errorf("dropped model's AppliedSeq %d %v, want 0", seq, err)
	}
	if _, err := s.Ingest(ctx, p, IngestOptions{}); err != nil {
		t.Fatal(err)
	}
	wantRow(t, s, "m", "a", 1, v1[0].data[4:8], "a new model of the name")
}

// closeAt makes a Close at hook point (in another goroutine: Close may
// wait for the change in progress) and gives it a moment; it returns
// the channel Close's result comes on.
func closeAt(s *Store, point string) <-chan error {
	done := make(chan error, 1)
	var once bool
	s.testHook = func(p string) {
		if p != point || once {
			return
		}
		once = true
		go func() { done <- s.Close() }()
		select {
		case err := <-done:
			done <- err
		case <-time.After(200 * time.Millisecond):
		}
	}
	return done
}

// TestCloseDuringCopy (review defect 3): closing the store while a table
// copy or a version switch is under way neither panics nor loses the
// store: the change fails with ErrClosed or completes, and Close returns.
func TestCloseDuringCopy(t *testing.T) {
	ctx := context.Background()
	for _, point := range []string{"cow-registered", "cow-copied", "activate-batch"} {
		t.Run(point, func(t *testing.T) {
			v1 := []*testTable{{name: "a", rows: 3000, dim: 4, seed: 1}}
			v2 := []*testTable{{name: "a", rows: 3000, dim: 4, seed: 11}}
			s, fs := openMem(t, nil)
			p1 := writePlan(t, "m", v1)
			if _, err := s.Ingest(ctx, p1, IngestOptions{}); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Ingest(ctx, writePlan(t, "m", v2), IngestOptions{NoActivate: true}); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Ingest(ctx, p1, IngestOptions{Model: "o"}); err != nil {
				t.Fatal(err)
			}
			done := closeAt(s, point)
			var err error
			if point == "activate-batch" {
				if _, err = s.UpsertSeq("m", "a", []int64{7}, fill(4, 70), 1); err != nil {
					t.Fatal(err)
				}
				err = s.Activate("m", 2)
			} else {
				_, err = s.UpsertSeq("m", "a", []int64{7}, fill(4, 70), 1)
			}
			t.Logf("the change during Close: %v", err)
			if err != nil && !errors.Is(err, ErrClosed) {
				t.Errorf("change during Close: %v, want nil or ErrClosed", err)
			}
			if err := <-done; err != nil {
				t.Fatalf("close: %v", err)
			}
			s2, err := Open("db", &Options{FS: fs})
			if err != nil {
				t.Fatal(err)
			}
			defer s2.Close()
			wantRow(t, s2, "o", "a", 7, v1[0].data[7*4:8*4], "after reopen")
			checkNoStrayTables(t, s2, "after reopen")
		})
	}
}

// TestGCDropsAbandonedCopy (review defect 4): a copy an error path left
// in state copying (a failed dropCopy or commit) is deleted by the next
// gc, not only by the next Open; a copy in progress is not.
func TestGCDropsAbandonedCopy(t *testing.T) {
	ctx := context.Background()
	v1 := []*testTable{{name: "a", rows: 100, dim: 4, seed: 1}}
	v2 := []*testTable{{name: "a", rows: 100, dim: 4, seed: 11}}
	v3 := []*testTable{{name: "a", rows: 100, dim: 4, seed: 21}}
	s, _ := openMem(t, nil)
	p1 := writePlan(t, "m", v1)
	for _, p := range []string{p1, writePlan(t, "m", v2), writePlan(t, "m", v3)} {
		if _, err := s.Ingest(ctx, p, IngestOptions{NoActivate: true}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Ingest(ctx, p1, IngestOptions{Model: "o"}); err != nil {
		t.Fatal(err)
	}
	// An abandoned copy, as a failed dropCopy leaves it: in the catalog
	// in state copying, some rows written.
	s.catMu.Lock()
	next := s.cat.clone()
	stray := next.NextTable
	next.NextTable++
	next.Tables[stray] = &physTable{ID: stray, SHA256: "x", Rows: 100, Dim: 4, DType: Float32, State: stateCopying, Mutated: true}
	if err := s.commit(next); err != nil {
		s.catMu.Unlock()
		t.Fatal(err)
	}
	s.catMu.Unlock()
	var key [keyLen]byte
	if err := s.db.Set(rowKey(key[:], stray, 3), Float32.encode(nil, fill(4, 1)), pebble.Sync); err != nil {
		t.Fatal(err)
	}
	// A gc while a copy runs (m's first update copies the table it
	// shares with o) keeps that copy and drops the abandoned one.
	dropped := false
	s.testHook = func(p string) {
		if p == "cow-registered" && !dropped {
			dropped = true
			if err := s.dropVersion(ctx, "m", 3); err != nil {
				t.Error(err)
			}
		}
	}
	if err := s.Upsert("m", "a", []int64{5}, fill(4, 50)); err != nil {
		t.Fatal(err)
	}
	s.testHook = nil
	if !dropped {
		t.Fatal("no copy ran")
	}
	wantRow(t, s, "m", "a", 5, fill(4, 50), "updated copy")
	wantRow(t, s, "o", "a", 5, v1[0].data[5*4:6*4], "other model")
	checkNoStrayTables(t, s, "after gc")
}

// TestBoundedCarry (review defect 2): a carry larger than one batch goes
// in several bounded batches and still carries every update, marks the
// tables it wrote mutated, and keeps no stale hot row.
func TestBoundedCarry(t *testing.T) {
	ctx := context.Background()
	for _, hm := range hotModes {
		t.Run(hm.name, func(t *testing.T) {
			v1 := []*testTable{{name: "a", rows: 300, dim: 4, seed: 1}, {name: "b", rows: 200, dim: 8, seed: 2}}
			v2 := []*testTable{{name: "a", rows: 300, dim: 4, seed: 11}, {name: "b", rows: 200, dim: 8, seed: 12}}
			o := hm.opts
			s, fs := openMem(t, &o)
			s.carryBatchBytes = 1 << 10
			if _, err := s.Ingest(ctx, writePlan(t, "m", v1), IngestOptions{}); err != nil {
				t.Fatal(err)
			}
			if _, err := s.Ingest(ctx, writePlan(t, "m", v2), IngestOptions{NoActivate: true}); err != nil {
				t.Fatal(err)
			}
			want := map[int]map[string][]float32{}
			for v, tabs := range map[int][]*testTable{1: v1, 2: v2} {
				want[v] = map[string][]float32{}
				for _, tt := range tabs {
					want[v][tt.name] = append([]float32(nil), tt.data...)
				}
			}
			dims := map[string]int{"a": 4, "b": 8}
			for i := range 150 {
				tn, id := "a", int64(i*7%300)
				if i%3 == 0 {
					tn, id = "b", int64(i*5%200)
				}
				row := fill(dims[tn], float32(i+1))
				if _, err := s.UpsertSeq("m", tn, []int64{id}, row, int64(i+1)); err != nil {
					t.Fatal(err)
				}
				for v := range want {
					copy(want[v][tn][id*int64(dims[tn]):], row)
				}
			}
			wantRow(t, s, "m", "a", 9, want[1]["a"][36:40], "before") // resident if hot
			batches := 0
			s.testHook = func(p string) {
				if p == "carry-batch" {
					batches++
				}
			}
			if err := s.Activate("m", 2); err != nil {
				t.Fatal(err)
			}
			s.testHook = nil
			if batches < 2 {
				t.Fatalf("%d bounded carry batches, want several", batches)
			}
			check := func(s *Store, v int, what string) {
				t.Helper()
				for _, tn := range []string{"a", "b"} {
					checkAllRows(t, s, "m", tn, dims[tn], want[v][tn], what)
				}
			}
			check(s, 2, "after activate")
			s.catMu.Lock()
			for tn, vt := range s.cat.Models["m"].Versions[2].Tables {
				if !s.cat.Tables[vt.Phys].Mutated {
					t.Errorf("table %s carried into but not marked mutated", tn)
				}
			}
			s.catMu.Unlock()
			if err := s.Rollback("m"); err != nil {
				t.Fatal(err)
			}
			check(s, 1, "after rollback")
			s2 := reopen(t, s, hm.opts, fs)
			s2.carryBatchBytes = 1 << 10
			check(s2, 1, "after reopen")
			if err := s2.Activate("m", 2); err != nil {
				t.Fatal(err)
			}
			check(s2, 2, "after reopen and activate")
		})
	}
}

// TestOpenRefusesUpdateLog: a folder holding a router's update log
// (router/updatelog.go: a model's state under "s"+model, its entries
// under "e"+..., their outcomes under "o"+...) and no catalog is refused, not served as an empty
// store; a store whose catalog is written opens whatever else it holds.
func TestOpenRefusesUpdateLog(t *testing.T) {
	for _, tc := range []struct {
		name string
		keys []string
		want string
	}{
		{"state only", []string{"sdlrm-kaggle"}, "router's update log"},
		{"entries only", []string{"e\x0bdlrm-kaggle\x00\x00\x00\x00\x00\x00\x00\x07"}, "router's update log"},
		{"outcomes only", []string{"o\x0bdlrm-kaggle\x00\x00\x00\x00\x00\x00\x00\x07"}, "router's update log"},
		{"an empty folder", nil, ""},
		{"a store's seq without a catalog", []string{"\x00\x00\x00\x00updseq/m"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := vfs.NewMem()
			db, err := pebble.Open("dir", &pebble.Options{FS: fs})
			if err != nil {
				t.Fatal(err)
			}
			for _, k := range tc.keys {
				if err := db.Set([]byte(k), []byte{1, 1, 0}, nil); err != nil {
					t.Fatal(err)
				}
			}
			if err := db.Close(); err != nil {
				t.Fatal(err)
			}
			s, err := Open("dir", &Options{FS: fs})
			switch {
			case tc.want == "" && err != nil:
				t.Fatal(err)
			case tc.want == "":
				s.Close()
			case err == nil:
				s.Close()
				t.Fatalf("opened; want %q", tc.want)
			case !strings.Contains(err.Error(), tc.want):
				t.Fatalf("%v; want %q", err, tc.want)
			}
		})
	}
}

// TestOpenMustExist: with MustExist a folder holding no store is refused
// and left as it was (not made, no LOCK file); a store opens.
func TestOpenMustExist(t *testing.T) {
	fs := vfs.NewMem()
	if _, err := Open("nothing", &Options{FS: fs, MustExist: true}); err == nil || !strings.Contains(err.Error(), "no store there") {
		t.Fatalf("a missing folder: %v", err)
	}
	if _, err := fs.Stat("nothing"); err == nil {
		t.Fatal("MustExist made the folder")
	}
	s, err := Open("db", &Options{FS: fs})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	s, err = Open("db", &Options{FS: fs, MustExist: true})
	if err != nil {
		t.Fatalf("an existing store: %v", err)
	}
	s.Close()
}
