package store

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"github.com/prism-serve/prism/plan"
)

func lookupRow(t *testing.T, s *Store, model, table string, id int64, dim int) []float32 {
	t.Helper()
	r := TableLookup{Table: table, IDs: []int64{id}, Out: make([]float32, dim)}
	if err := s.Lookup(model, []TableLookup{r}); err != nil {
		t.Fatal(err)
	}
	return r.Out
}

func TestVersionsAndSharing(t *testing.T) {
	ctx := context.Background()
	v1 := []*testTable{{name: "a", rows: 50, dim: 4, seed: 1}, {name: "b", rows: 60, dim: 8, seed: 2}}
	v2 := []*testTable{{name: "a", rows: 50, dim: 4, seed: 11}, {name: "b", rows: 60, dim: 8, seed: 2}}
	p1, p2 := writePlan(t, "m", v1), writePlan(t, "m", v2)
	s, _ := openMem(t, nil)
	if _, err := s.Ingest(ctx, p1, IngestOptions{}); err != nil {
		t.Fatal(err)
	}
	rep, err := s.Ingest(ctx, p2, IngestOptions{NoActivate: true})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Version != 2 || rep.Activated {
		t.Fatalf("second ingest: %+v", rep)
	}
	// b has the same content in both versions: one copy.
	for _, tr := range rep.Tables {
		if (tr.Name == "b") != tr.Shared {
			t.Errorf("table %s shared=%v", tr.Name, tr.Shared)
		}
	}
	check := func(want []*testTable) {
		t.Helper()
		if got := lookupRow(t, s, "m", "a", 7, 4); got[0] != want[0].data[7*4] {
			t.Fatalf("table a row 7 = %v, want the version with %v", got, want[0].data[7*4:8*4])
		}
	}
	check(v1)
	if err := s.Activate("m", 2); err != nil {
		t.Fatal(err)
	}
	check(v2)
	if err := s.Rollback("m"); err != nil {
		t.Fatal(err)
	}
	check(v1)
	if err := s.Activate("m", 2); err != nil {
		t.Fatal(err)
	}
	if err := s.DropVersion(ctx, "m", 2); !errors.Is(err, ErrBadRequest) {
		t.Fatalf("dropping the active version: %v", err)
	}
	// Another model with v1's content shares its tables.
	rep, err = s.Ingest(ctx, p1, IngestOptions{Model: "other"})
	if err != nil {
		t.Fatal(err)
	}
	for _, tr := range rep.Tables {
		if !tr.Shared {
			t.Errorf("model other: table %s not shared", tr.Name)
		}
	}
	if err := s.DropVersion(ctx, "m", 1); err != nil {
		t.Fatal(err)
	}
	if err := s.Rollback("m"); !errors.Is(err, ErrUnknownVersion) {
		t.Fatalf("rollback to a dropped version: %v", err)
	}
	check(v2)
	if got := lookupRow(t, s, "other", "a", 7, 4); got[0] != v1[0].data[7*4] {
		t.Fatalf("model other lost its shared table: %v", got)
	}
	vs, err := s.Versions("m")
	if err != nil || len(vs) != 1 || !vs[0].Active || vs[0].N != 2 {
		t.Fatalf("versions %+v %v", vs, err)
	}
}

// TestConcurrentVersionSwitch: readers never see a mix of versions.
func TestConcurrentVersionSwitch(t *testing.T) {
	ctx := context.Background()
	mk := func(c float32) []*testTable {
		tabs := []*testTable{{name: "a", rows: 10, dim: 2}, {name: "b", rows: 10, dim: 2}}
		for _, tt := range tabs {
			tt.data = make([]float32, 20)
			for i := range tt.data {
				tt.data[i] = c
			}
		}
		return tabs
	}
	s, _ := openMem(t, nil)
	for _, c := range []float32{1, 2} {
		if _, err := s.Ingest(ctx, writePlan(t, "m", mk(c)), IngestOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	var stop atomic.Bool
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				a := TableLookup{Table: "a", IDs: []int64{1}, Out: make([]float32, 2)}
				b := TableLookup{Table: "b", IDs: []int64{1}, Out: make([]float32, 2)}
				if err := s.Lookup("m", []TableLookup{a, b}); err != nil {
					t.Error(err)
					return
				}
				if a.Out[0] != b.Out[0] {
					t.Errorf("mixed versions: a=%v b=%v", a.Out, b.Out)
					return
				}
			}
		}()
	}
	for i := range 200 {
		if err := s.Activate("m", 1+i%2); err != nil {
			t.Fatal(err)
		}
	}
	stop.Store(true)
	wg.Wait()
}

func TestUpsertVisibleAfterAck(t *testing.T) {
	tabs := []*testTable{{name: "a", rows: 100, dim: 4, seed: 1}}
	for _, c := range []struct {
		dt      DType
		preload PreloadMode
	}{{Float32, PreloadOff}, {Int8, PreloadOff}, {Float32, PreloadAuto}, {Int8, PreloadAuto}} {
		dt := c.dt
		t.Run(string(dt)+"/preload="+string(c.preload), func(t *testing.T) {
			s, _ := openMem(t, &Options{HotBytes: 1 << 20, Preload: c.preload})
			if _, err := s.Ingest(context.Background(), writePlan(t, "m", tabs), IngestOptions{DType: dt}); err != nil {
				t.Fatal(err)
			}
			var stop atomic.Bool
			var wg sync.WaitGroup
			wg.Add(1)
			go func() { // keeps ids 0..9 hot and races the upserts
				defer wg.Done()
				for !stop.Load() {
					r := TableLookup{Table: "a", IDs: []int64{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, Out: make([]float32, 40)}
					if err := s.Lookup("m", []TableLookup{r}); err != nil {
						t.Error(err)
						return
					}
				}
			}()
			for i := range 300 {
				id := int64(i % 10)
				row := []float32{float32(i), -float32(i), 0.5, 1}
				if err := s.Upsert("m", "a", []int64{id}, row); err != nil {
					t.Fatal(err)
				}
				got := lookupRow(t, s, "m", "a", id, 4)
				if d := got[0] - float32(i); d > float32(i)/254+1e-6 || -d > float32(i)/254+1e-6 {
					t.Fatalf("after ack of update %d, row %d reads %v", i, id, got)
				}
			}
			stop.Store(true)
			wg.Wait()
			if m := s.Metrics(); m.Upserts != 300 || m.HotHits == 0 {
				t.Errorf("metrics %+v", m)
			}
		})
	}
}

func TestIngestResumeAndFaults(t *testing.T) {
	tabs := []*testTable{{name: "a", rows: 3000, dim: 16, seed: 5}, {name: "b", rows: 500, dim: 16, seed: 6}}
	plan := writePlan(t, "m", tabs)
	ctx := context.Background()

	t.Run("interrupted", func(t *testing.T) {
		s, _ := openMem(t, nil)
		cctx, cancel := context.WithCancel(ctx)
		_, err := s.Ingest(cctx, plan, IngestOptions{SSTBytes: 20 << 10, Progress: func(done, total int64) { cancel() }})
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("interrupted ingest: %v", err)
		}
		if _, err := s.Tables("m"); !errors.Is(err, ErrUnknownModel) {
			t.Fatalf("a half-ingested model is served: %v", err)
		}
		rep, err := s.Ingest(ctx, plan, IngestOptions{SSTBytes: 20 << 10})
		if err != nil {
			t.Fatal(err)
		}
		if rep.Tables[0].ResumedAt == 0 {
			t.Errorf("did not resume: %+v", rep.Tables[0])
		}
		for _, id := range []int64{0, 1234, 2999} {
			if got := lookupRow(t, s, "m", "a", id, 16); got[3] != tabs[0].data[id*16+3] {
				t.Fatalf("row %d after resume: %v", id, got)
			}
		}
	})

	t.Run("a write failing mid-file closes the file", func(t *testing.T) {
		// The store's process lives on after a failed ingest: the SST
		// it was writing is closed and removed, not left open.
		mem := vfs.NewMem()
		var writes atomic.Int64
		staged := errorfs.PathMatch("db/" + stagingDir + "/*")
		inj := errorfs.InjectorFunc(func(op errorfs.Op) error {
			if staged.Evaluate(op) && (op.Kind == errorfs.OpFileWrite || op.Kind == errorfs.OpFileWriteAt) && writes.Add(1) == 3 {
				return errorfs.ErrInjected
			}
			return nil
		})
		cfs := &closeCountFS{FS: errorfs.Wrap(mem, inj), dir: "db/" + stagingDir}
		s, _ := openMem(t, &Options{FS: cfs})
		_, err := s.Ingest(ctx, plan, IngestOptions{SSTBytes: 1 << 20})
		if err == nil || !strings.Contains(err.Error(), "injected") {
			t.Fatalf("ingest with a failing write: %v", err)
		}
		if c, d := cfs.creates.Load(), cfs.closes.Load(); c == 0 || c != d {
			t.Errorf("%d staging files made, %d closed", c, d)
		}
		if left, err := mem.List(mem.PathJoin("db", stagingDir)); err != nil || len(left) > 0 {
			t.Errorf("staging files after the failed ingest: %v %v", left, err)
		}
	})

	t.Run("io errors", func(t *testing.T) {
		mem := vfs.NewMem()
		var toggle errorfs.Toggle
		toggle.Injector = errorfs.ErrInjected.If(errorfs.PathMatch("db/" + stagingDir + "/*"))
		s, _ := openMem(t, &Options{FS: errorfs.Wrap(mem, &toggle)})
		// A model already served keeps serving through the failures.
		if _, err := s.Ingest(ctx, writePlan(t, "old", tabs[1:]), IngestOptions{}); err != nil {
			t.Fatal(err)
		}
		toggle.On()
		_, err := s.Ingest(ctx, plan, IngestOptions{})
		if err == nil || !strings.Contains(err.Error(), "injected") {
			t.Fatalf("ingest with failing staging writes: %v", err)
		}
		if _, err := s.Tables("m"); !errors.Is(err, ErrUnknownModel) {
			t.Fatalf("failed ingest is served: %v", err)
		}
		if got := lookupRow(t, s, "old", "b", 3, 16); got[0] != tabs[1].data[3*16] {
			t.Fatalf("old model: %v", got)
		}
		toggle.Off()
		if _, err := s.Ingest(ctx, plan, IngestOptions{}); err != nil {
			t.Fatal(err)
		}
		if got := lookupRow(t, s, "m", "a", 2999, 16); got[15] != tabs[0].data[2999*16+15] {
			t.Fatalf("after retry: %v", got)
		}
	})
}

// closeCountFS counts the files made by Create in folder dir and how
// many of them were closed.
type closeCountFS struct {
	vfs.FS
	dir             string
	creates, closes atomic.Int64
}

func (fs *closeCountFS) Create(name string, category vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := fs.FS.Create(name, category)
	if err != nil || fs.PathDir(name) != fs.dir {
		return f, err
	}
	fs.creates.Add(1)
	return &closeCountFile{File: f, closes: &fs.closes}, nil
}

type closeCountFile struct {
	vfs.File
	closes *atomic.Int64
	once   sync.Once
}

func (f *closeCountFile) Close() error {
	f.once.Do(func() { f.closes.Add(1) })
	return f.File.Close()
}

// TestIngestAgainKeepsRollback: ingesting a plan whose tables a version
// of the model holds already (the same command run again, after it
// finished or after a crash before its switch) is that version, not a
// copy of it. A copy moved the version Rollback returns to onto the same
// rows: rolling back a rollout run twice went nowhere.
func TestIngestAgainKeepsRollback(t *testing.T) {
	ctx := context.Background()
	v1 := []*testTable{{name: "a", rows: 20, dim: 4, seed: 1}}
	v2 := []*testTable{{name: "a", rows: 20, dim: 4, seed: 2}}
	v3 := []*testTable{{name: "a", rows: 20, dim: 4, seed: 3}}
	p1, p2, p3 := writePlan(t, "m", v1), writePlan(t, "m", v2), writePlan(t, "m", v3)
	s, _ := openMem(t, nil)
	for _, p := range []string{p1, p2} {
		if _, err := s.Ingest(ctx, p, IngestOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	rep, err := s.Ingest(ctx, p2, IngestOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Version != 2 || !rep.Existing || !rep.Activated {
		t.Fatalf("p2 ingested again: version %d, existing %v, activated %v; want version 2, existing, active", rep.Version, rep.Existing, rep.Activated)
	}
	if err := s.Rollback("m"); err != nil {
		t.Fatal(err)
	}
	if got := lookupRow(t, s, "m", "a", 3, 4); got[0] != v1[0].data[3*4] {
		t.Fatalf("rolled back to %v, want version 1's row %v", got, v1[0].data[3*4:4*4])
	}
	// Ingested without its switch (as a crash before it leaves it), then
	// run again: the same version, switched to now.
	if rep, err = s.Ingest(ctx, p3, IngestOptions{NoActivate: true}); err != nil || rep.Version != 3 || rep.Activated {
		t.Fatalf("p3 not activated: %+v, %v", rep, err)
	}
	if rep, err = s.Ingest(ctx, p3, IngestOptions{}); err != nil || rep.Version != 3 || !rep.Existing || !rep.Activated {
		t.Fatalf("p3 again: %+v, %v; want version 3, activated", rep, err)
	}
	// Once updated, its tables no longer hold p3's content: a new
	// version, which the update is carried into.
	if err := s.Upsert("m", "a", []int64{5}, []float32{9, 9, 9, 9}); err != nil {
		t.Fatal(err)
	}
	if rep, err = s.Ingest(ctx, p3, IngestOptions{}); err != nil || rep.Version != 4 || rep.Existing {
		t.Fatalf("p3 after an update: %+v, %v; want a new version 4", rep, err)
	}
	if got := lookupRow(t, s, "m", "a", 5, 4); got[0] != 9 {
		t.Fatalf("the update was not carried: %v", got)
	}
	vs, err := s.Versions("m")
	if err != nil || len(vs) != 4 {
		t.Fatalf("versions %+v, %v; want 1 to 4", vs, err)
	}
}

// TestDropDuringIngestKeepsItsTables: a table an ingest has finished is
// named by no version until the ingest's last step, and a drop (or a
// copy's gc) meanwhile deleted it as unreferenced: the new version then
// named a table gone from the catalog, served without it, its rows
// deleted, and the ingest reported success.
func TestDropDuringIngestKeepsItsTables(t *testing.T) {
	ctx := context.Background()
	s, _ := openMem(t, nil)
	for _, seed := range []uint64{1, 2} {
		if _, err := s.Ingest(ctx, writePlan(t, "m", []*testTable{{name: "a", rows: 10, dim: 2, seed: seed}}), IngestOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	v3 := []*testTable{{name: "a", rows: 10, dim: 2, seed: 3}, {name: "b", rows: 10, dim: 2, seed: 4}}
	p3 := writePlan(t, "m", v3)
	tableBytes := int64(10 * 2 * 4)
	dropped := false
	rep, err := s.Ingest(ctx, p3, IngestOptions{SSTBytes: 1, Progress: func(done, total int64) {
		// Table a is in, b under way: drop version 1 now.
		if done > tableBytes && !dropped {
			dropped = true
			if err := s.DropVersion(ctx, "m", 1); err != nil {
				t.Error(err)
			}
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	if !dropped {
		t.Fatal("the drop never ran during the ingest")
	}
	tabs, err := s.Tables("m")
	if err != nil || len(tabs) != 2 {
		t.Fatalf("version %d serves %+v, %v; want tables a and b", rep.Version, tabs, err)
	}
	if got := lookupRow(t, s, "m", "a", 4, 2); got[0] != v3[0].data[4*2] {
		t.Fatalf("table a row 4 = %v, want %v", got, v3[0].data[4*2:5*2])
	}
}

// TestVersionRecordsAbsolutePlan: a version records its plan's folder as
// an absolute path: given relative (prism ingest part --db db), prism
// store versions listed "part", which names another folder, or none, from
// anywhere else.
func TestVersionRecordsAbsolutePlan(t *testing.T) {
	dir := writePlan(t, "m", []*testTable{{name: "a", rows: 4, dim: 2, seed: 1}})
	t.Chdir(filepath.Dir(dir))
	s, _ := openMem(t, nil)
	if _, err := s.Ingest(context.Background(), filepath.Base(dir), IngestOptions{}); err != nil {
		t.Fatal(err)
	}
	vs, err := s.Versions("m")
	if err != nil || len(vs) != 1 || vs[0].Plan != dir {
		t.Fatalf("versions %+v, %v; want the plan recorded as %s", vs, err, dir)
	}
}

// TestMatchPlan: the active version holds a plan's tables whatever was
// updated since (prism ingest --if-changed leaves such a store as it is,
// updates included), and does not hold a retrained plan's (other
// content), another model's or a shard's.
func TestMatchPlan(t *testing.T) {
	ctx := context.Background()
	dir := writePlan(t, "m", []*testTable{{name: "a", rows: 4, dim: 2, seed: 1}, {name: "b", rows: 3, dim: 2, seed: 2}})
	retrained := writePlan(t, "m", []*testTable{{name: "a", rows: 4, dim: 2, seed: 7}, {name: "b", rows: 3, dim: 2, seed: 2}})
	read := func(d string) *plan.Plan {
		p, err := plan.Read(d)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	s, _ := openMem(t, nil)
	if err := s.MatchPlan("m", read(dir)); !errors.Is(err, ErrUnknownModel) {
		t.Fatalf("an empty store: %v, want ErrUnknownModel", err)
	}
	if _, err := s.Ingest(ctx, dir, IngestOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := s.MatchPlan("m", read(dir)); err != nil {
		t.Fatalf("the plan ingested: %v", err)
	}
	if err := s.Upsert("m", "a", []int64{1}, []float32{9, 9}); err != nil {
		t.Fatal(err)
	}
	if err := s.MatchPlan("m", read(dir)); err != nil {
		t.Fatalf("the plan ingested, a row updated since: %v", err)
	}
	if err := s.MatchPlan("m", read(retrained)); err == nil || !strings.Contains(err.Error(), `table "a" of other content`) {
		t.Fatalf("a retrained plan: %v, want other content of table a", err)
	}
	if _, err := s.Ingest(ctx, retrained, IngestOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := s.MatchPlan("m", read(retrained)); err != nil {
		t.Fatalf("the retrained plan ingested: %v", err)
	}
}

// TestMatchDTypes: prism ingest --if-changed --dtype ingests the same
// plan again when the store holds it in another dtype (another set of
// physical tables), and leaves it when it holds it so.
func TestMatchDTypes(t *testing.T) {
	ctx := context.Background()
	dir := writePlan(t, "m", []*testTable{{name: "a", rows: 4, dim: 2, seed: 1}, {name: "b", rows: 3, dim: 2, seed: 2}})
	s, _ := openMem(t, nil)
	if err := s.MatchDTypes("m", IngestOptions{}); !errors.Is(err, ErrUnknownModel) {
		t.Fatalf("an empty store: %v, want ErrUnknownModel", err)
	}
	if _, err := s.Ingest(ctx, dir, IngestOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		o    IngestOptions
		want string // "" matches
	}{
		{IngestOptions{}, ""},
		{IngestOptions{DType: Float32}, ""},
		{IngestOptions{DType: Int8}, `holds table "a" as float32, not int8`},
		{IngestOptions{TableDTypes: map[string]DType{"b": Float16}}, `holds table "b" as float32, not float16`},
		{IngestOptions{DType: Int8, TableDTypes: map[string]DType{"a": Float32, "b": Float32}}, ""},
	} {
		err := s.MatchDTypes("m", tc.o)
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%+v: %v, want %q", tc.o, err, tc.want)
		}
	}
	if _, err := s.Ingest(ctx, dir, IngestOptions{DType: Int8}); err != nil {
		t.Fatal(err)
	}
	if err := s.MatchDTypes("m", IngestOptions{DType: Int8}); err != nil {
		t.Fatalf("ingested as int8: %v", err)
	}
}

// TestRecordHotBytes: the size is kept across a restart, as an ingest's
// IngestOptions.HotBytes is.
func TestRecordHotBytes(t *testing.T) {
	s, fs := openMem(t, nil)
	if err := s.RecordHotBytes(0); err == nil {
		t.Fatal("a size of 0 was recorded")
	}
	if err := s.RecordHotBytes(3 << 20); err != nil {
		t.Fatal(err)
	}
	s = reopen(t, s, Options{}, fs)
	if s.cat.HotBytes != 3<<20 {
		t.Fatalf("recorded %d after a restart, want %d", s.cat.HotBytes, 3<<20)
	}
}
