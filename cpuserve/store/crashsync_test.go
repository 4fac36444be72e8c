package store

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/prism-serve/prism/internal/crashfs"
)

// TestCrashAtEverySync cuts the power before every sync the store asks
// of its file system (a crash clone of a crashable in-memory FS taken as
// each sync begins: what was synced before it, or that plus part of the
// unsynced bytes) and after every acknowledged step, through a run of an
// ingest in many chunks, sequenced upserts, the ingest of another model
// whose tables the second version of the first then shares, that
// version's ingest (activated: its switch copies the shared tables and
// carries the updates), a rollback and the drop of the second version,
// with upserts between. Each clone, reopened, must hold every
// acknowledged update (AppliedSeq and the rows), serve the version
// acknowledged active (either one while a switch was under way) whole
// with a prefix of the updates on top, keep the other model's rows, and
// an interrupted ingest, run again, must finish from where it stopped and
// serve its tables whole.
func TestCrashAtEverySync(t *testing.T) {
	ctx := context.Background()
	v1 := []*testTable{{name: "a", rows: 240, dim: 4, seed: 21}, {name: "b", rows: 120, dim: 8, seed: 22}}
	v2 := []*testTable{{name: "a", rows: 240, dim: 4, seed: 31}, {name: "b", rows: 120, dim: 8, seed: 22}}
	base := map[int][]*testTable{1: v1, 2: v2}
	plans := map[int]string{1: writePlan(t, "m", v1), 2: writePlan(t, "m", v2)}
	const sstBytes = 1 << 10 // a few dozen rows an SST: many chunks

	type update struct {
		table string
		id    int64
		row   []float32
	}
	var updates []update // updates[k-1] is seq k
	// step is what the run had acknowledged when a clone was taken.
	type step struct {
		acked int64 // updates acknowledged
		// active is m's version acknowledged active (0: none yet); to,
		// while a switch to another is under way, that one.
		active, to int
		// ingesting is the ingest under way ("": none), as "m 1", "o 2".
		ingesting string
		model     bool // m's first ingest returned
		o         bool // o's ingest returned
	}
	cut := crashfs.New[step](true, 5)
	r := rand.New(rand.NewPCG(5, 5))
	take, set := cut.Take, cut.Set
	fs := cut.FS()
	open := func(fs vfs.FS) (*Store, error) {
		return Open("db", &Options{FS: fs, HotBytes: 16 << 10, Preload: PreloadOff})
	}
	s, err := open(fs)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	cut.Arm(true)
	ingest := func(model string, v int) {
		set(func(c *step) {
			c.ingesting = fmt.Sprintf("%s %d", model, v)
			if model == "m" && c.active != 0 {
				c.to = v
			}
		})
		if _, err := s.Ingest(ctx, plans[v], IngestOptions{Model: model, SSTBytes: sstBytes}); err != nil {
			t.Fatal(err)
		}
		set(func(c *step) {
			c.ingesting = ""
			switch model {
			case "o":
				c.o = true
			default:
				c.model, c.active, c.to = true, v, 0
			}
		})
		take(fmt.Sprintf("after ingest %s %d", model, v))
	}
	upserts := func(n int) {
		for range n {
			u := update{table: "a", id: int64(r.IntN(240))}
			if r.IntN(3) == 0 {
				u.table, u.id = "b", int64(r.IntN(120))
			}
			u.row = fill(map[string]int{"a": 4, "b": 8}[u.table], float32(len(updates)+1))
			if _, err := s.UpsertSeq("m", u.table, []int64{u.id}, u.row, int64(len(updates)+1)); err != nil {
				t.Fatal(err)
			}
			updates = append(updates, u)
			set(func(c *step) { c.acked++ })
			take(fmt.Sprintf("after update %d", len(updates)))
		}
	}
	ingest("m", 1)
	upserts(6)
	ingest("o", 2) // o's tables: the content of m's version 2
	ingest("m", 2) // shares o's tables: its switch copies them
	upserts(6)
	set(func(c *step) { c.to = 1 })
	if err := s.Rollback("m"); err != nil {
		t.Fatal(err)
	}
	set(func(c *step) { c.active, c.to = 1, 0 })
	take("after rollback")
	upserts(4)
	if err := s.DropVersion(ctx, "m", 2); err != nil {
		t.Fatal(err)
	}
	take("after drop")
	upserts(2)
	cut.Arm(false)

	// want is version v's rows with updates 1..k on top.
	want := func(v int, k int64) map[string][]float32 {
		w := map[string][]float32{}
		for _, tt := range base[v] {
			w[tt.name] = append([]float32(nil), tt.data...)
		}
		for _, u := range updates[:k] {
			copy(w[u.table][u.id*int64(len(u.row)):], u.row)
		}
		return w
	}
	resumed := 0
	clones := cut.Clones()
	for _, c := range clones {
		func() {
			cs, err := open(c.FS)
			if err != nil {
				t.Fatalf("%s: reopen: %v", c.Point, err)
			}
			defer cs.Close()
			k, err := cs.AppliedSeq("m")
			if err != nil {
				t.Fatal(err)
			}
			if k < c.State.acked || k > c.State.acked+1 {
				t.Fatalf("%s: AppliedSeq %d, %d updates acknowledged", c.Point, k, c.State.acked)
			}
			check := func(what string, settled bool, st step) {
				where := fmt.Sprintf("%s: %s", c.Point, what)
				if _, err := cs.Tables("m"); err != nil {
					if st.model {
						t.Fatalf("%s: model m lost after its ingest returned: %v", where, err)
					}
				} else {
					vs, err := cs.Versions("m")
					if err != nil {
						t.Fatalf("%s: %v", where, err)
					}
					v := 0
					for _, vi := range vs {
						if vi.Active {
							v = vi.N
						}
					}
					if v > 2 {
						// An ingest run again after a crash that left its
						// version holding copies (of tables shared with o)
						// adds a version of the same plan.
						v = 2
					}
					if st.active != 0 && v != st.active && v != st.to {
						t.Fatalf("%s: version %d active, acknowledged: %d (switching to %d)", where, v, st.active, st.to)
					}
					w := want(v, k)
					for _, tt := range base[v] {
						checkAllRows(t, cs, "m", tt.name, tt.dim, w[tt.name], fmt.Sprintf("%s: version %d, AppliedSeq %d", where, v, k))
					}
				}
				if _, err := cs.Tables("o"); err == nil {
					for _, tt := range v2 {
						checkAllRows(t, cs, "o", tt.name, tt.dim, tt.data, where+": model o")
					}
				} else if st.o {
					t.Fatalf("%s: model o lost after its ingest returned: %v", where, err)
				}
				if settled { // else the interrupted ingest's tables are left ingesting
					checkNoStrayTables(t, cs, where)
				}
			}
			check("reopened", c.State.ingesting == "", c.State)
			if c.State.ingesting == "" {
				return
			}
			// The interrupted ingest, run again, finishes.
			var model string
			var v int
			fmt.Sscanf(c.State.ingesting, "%s %d", &model, &v)
			rep, err := cs.Ingest(ctx, plans[v], IngestOptions{Model: model, SSTBytes: sstBytes})
			if err != nil {
				t.Fatalf("%s: ingest %s again: %v", c.Point, c.State.ingesting, err)
			}
			for _, tr := range rep.Tables {
				if tr.ResumedAt > 0 {
					resumed++
				}
			}
			st := c.State
			if model == "o" {
				st.o = true
			} else {
				st.model, st.active, st.to = true, v, 0
			}
			check("ingest "+c.State.ingesting+" run again", true, st)
		}()
	}
	if resumed == 0 {
		t.Errorf("no ingest run again resumed a table")
	}
	t.Logf("%d crash clones checked (%d syncs), %d tables resumed, %d table copies", len(clones), cut.Syncs(), resumed, s.Metrics().TableCopies)
}

// TestCrashLeavesNoUnreachableRows: a crash after a change commits a
// catalog that forgets tables (a dropped version's, an interrupted
// ingest another ingest abandons) and before their rows are deleted
// leaves rows no catalog names; nothing would ever delete them (a table
// id is never used again), so a table's worth of space was lost for good.
// Open deletes them.
func TestCrashLeavesNoUnreachableRows(t *testing.T) {
	ctx := context.Background()
	v1 := []*testTable{{name: "a", rows: 200, dim: 4, seed: 41}}
	v2 := []*testTable{{name: "a", rows: 200, dim: 4, seed: 42}}
	v3 := []*testTable{{name: "a", rows: 200, dim: 4, seed: 43}}
	for _, tc := range []struct {
		name string
		run  func(t *testing.T, s *Store, c *crashfs.Cutter[struct{}])
	}{
		{"drop-version", func(t *testing.T, s *Store, c *crashfs.Cutter[struct{}]) {
			if _, err := s.Ingest(ctx, writePlan(t, "m", v2), IngestOptions{NoActivate: true}); err != nil {
				t.Fatal(err)
			}
			c.Arm(true)
			if err := s.DropVersion(ctx, "m", 2); err != nil {
				t.Fatal(err)
			}
		}},
		{"abandoned-ingest", func(t *testing.T, s *Store, c *crashfs.Cutter[struct{}]) {
			// An ingest cut short (cancelled, as by a crash) and another
			// plan's ingest, which abandons it.
			ictx, cancel := context.WithCancel(ctx)
			_, err := s.Ingest(ictx, writePlan(t, "m", v2), IngestOptions{NoActivate: true, SSTBytes: 1 << 10,
				Progress: func(done, total int64) {
					if done > total/2 {
						cancel()
					}
				}})
			if err == nil {
				t.Fatal("the cancelled ingest finished")
			}
			c.Arm(true)
			if _, err := s.Ingest(ctx, writePlan(t, "m", v3), IngestOptions{NoActivate: true}); err != nil {
				t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := crashfs.New[struct{}](false, 0)
			fs := c.FS()
			s, err := Open("db", &Options{FS: fs, HotBytes: -1})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if _, err := s.Ingest(ctx, writePlan(t, "m", v1), IngestOptions{}); err != nil {
				t.Fatal(err)
			}
			tc.run(t, s, c)
			c.Arm(false)
			if len(c.Clones()) == 0 {
				t.Fatal("no sync to crash at")
			}
			for i, cl := range c.Clones() {
				fs := cl.FS
				cs, err := Open("db", &Options{FS: fs, HotBytes: -1})
				if err != nil {
					t.Fatalf("crash before sync %d: reopen: %v", i, err)
				}
				checkAllRows(t, cs, "m", "a", 4, v1[0].data, fmt.Sprintf("crash before sync %d", i))
				checkNoUnreachableRows(t, cs, fmt.Sprintf("crash before sync %d of %d", i, len(c.Clones())))
				cs.Close()
			}
		})
	}
}

// checkNoUnreachableRows: every row key belongs to a table of the
// catalog (in any state).
func checkNoUnreachableRows(t *testing.T, s *Store, what string) {
	t.Helper()
	s.catMu.Lock()
	defer s.catMu.Unlock()
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: []byte{0, 0, 0, 1}})
	if err != nil {
		t.Fatal(err)
	}
	defer it.Close()
	for ok := it.First(); ok; ok = it.Next() {
		if id := binary.BigEndian.Uint32(it.Key()); s.cat.Tables[id] == nil {
			t.Fatalf("%s: rows of table %d, which the catalog does not have", what, id)
		}
	}
}

// TestCrashResumedIngestQuantized: an int8 ingest cut at every sync and
// run again ends as an uninterrupted one does: the same stored rows and
// the same accuracy loss record (carried across the crash with the
// ingest's progress).
func TestCrashResumedIngestQuantized(t *testing.T) {
	ctx := context.Background()
	tabs := []*testTable{{name: "a", rows: 300, dim: 8, seed: 51}, {name: "b", rows: 100, dim: 4, seed: 52}}
	p := writePlan(t, "m", tabs)
	io := IngestOptions{DType: Int8, SSTBytes: 1 << 9}
	read := func(s *Store) (map[string][]float32, map[string]Loss) {
		rows, loss := map[string][]float32{}, map[string]Loss{}
		for _, tt := range tabs {
			ids := make([]int64, tt.rows)
			for i := range ids {
				ids[i] = int64(i)
			}
			r := TableLookup{Table: tt.name, IDs: ids, Pooling: PoolNone, Out: make([]float32, len(ids)*tt.dim)}
			if err := s.Lookup("m", []TableLookup{r}); err != nil {
				t.Fatal(err)
			}
			rows[tt.name] = r.Out
		}
		s.catMu.Lock()
		defer s.catMu.Unlock()
		for tn, vt := range s.cat.Models["m"].Versions[s.cat.Models["m"].Active].Tables {
			loss[tn] = *s.cat.Tables[vt.Phys].Loss
		}
		return rows, loss
	}
	ref, _ := openMem(t, &Options{HotBytes: -1})
	if _, err := ref.Ingest(ctx, p, io); err != nil {
		t.Fatal(err)
	}
	wantRows, wantLoss := read(ref)

	c := crashfs.New[struct{}](false, 0)
	fs := c.FS()
	s, err := Open("db", &Options{FS: fs, HotBytes: -1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	c.Arm(true)
	if _, err := s.Ingest(ctx, p, io); err != nil {
		t.Fatal(err)
	}
	c.Arm(false)
	resumed := 0
	for i, cl := range c.Clones() {
		fs := cl.FS
		func() {
			cs, err := Open("db", &Options{FS: fs, HotBytes: -1})
			if err != nil {
				t.Fatalf("crash before sync %d: reopen: %v", i, err)
			}
			defer cs.Close()
			rep, err := cs.Ingest(ctx, p, io)
			if err != nil {
				t.Fatalf("crash before sync %d: ingest again: %v", i, err)
			}
			for _, tr := range rep.Tables {
				if tr.ResumedAt > 0 {
					resumed++
				}
			}
			rows, loss := read(cs)
			for _, tt := range tabs {
				if !slicesEqual(rows[tt.name], wantRows[tt.name]) {
					t.Fatalf("crash before sync %d: table %s's rows differ from an uninterrupted ingest's", i, tt.name)
				}
				if loss[tt.name] != wantLoss[tt.name] {
					t.Fatalf("crash before sync %d: table %s's loss %+v, an uninterrupted ingest's %+v", i, tt.name, loss[tt.name], wantLoss[tt.name])
				}
			}
		}()
	}
	if resumed == 0 {
		t.Errorf("no ingest run again resumed a table")
	}
	t.Logf("%d crashes, %d tables resumed", len(c.Clones()), resumed)
}
