package router

import (
	"maps"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
)

// The update log reads back what the persists wrote: the numbers, the
// entries floor+1 .. next, trimmed ones gone; a gap left by a failed
// write moves the floor up to it.
func TestUpdateLogRoundTrip(t *testing.T) {
	fs := vfs.NewMem()
	l, err := openUpdateLog("log", fs)
	if err != nil {
		t.Fatal(err)
	}
	entry := func(seq int64) *prismv1.ApplyUpdateRequest {
		return &prismv1.ApplyUpdateRequest{Seq: seq, Update: &prismv1.UpdateRequest{Model: "m/1", Table: "t", Ids: []int64{seq}, Rows: make([]byte, 4)}}
	}
	persist := func(model string, c logChange) message {
		return message{Type: msgPersist, Model: model, Persist: &c}
	}
	// Two models whose names share a prefix, in one batch and in several.
	if err := l.write([]message{
		persist("m/1", logChange{Next: 1, Entry: entry(1)}),
		persist("m/10", logChange{Next: 1, Committed: 1, Entry: entry(1)}),
		{Type: msgLog},
	}); err != nil {
		t.Fatal(err)
	}
	for seq := int64(2); seq <= 5; seq++ {
		// The byte budget keeps three: seq-3 leaves as seq joins.
		floor := max(0, seq-3)
		if err := l.write([]message{persist("m/1", logChange{Next: seq, Committed: seq - 1, Floor: floor, DropFrom: max(0, floor-1), Entry: entry(seq)})}); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := l.write([]message{persist("m/1", logChange{Next: 6})}); err == nil {
		t.Fatal("a write after Close succeeded")
	}
	if l, err = openUpdateLog("log", fs); err != nil {
		t.Fatal(err)
	}
	got, err := l.load()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].model != "m/1" || got[1].model != "m/10" {
		t.Fatalf("models read back: %+v", got)
	}
	if r := got[0]; r.next != 5 || r.committed != 4 || r.floor != 2 || len(r.log) != 3 || r.log[0].GetSeq() != 3 || r.log[2].GetSeq() != 5 {
		t.Fatalf("m/1 read back: next %d committed %d floor %d, %d entries", r.next, r.committed, r.floor, len(r.log))
	}
	if r := got[1]; r.next != 1 || r.committed != 1 || r.floor != 0 || len(r.log) != 1 {
		t.Fatalf("m/10 read back: %+v", r)
	}
	// Update 6 was never written (its batch failed), 7 was: only 7 can be
	// replayed.
	if err := l.write([]message{persist("m/1", logChange{Next: 7, Committed: 7, Floor: 2, DropFrom: 2, Entry: entry(7)})}); err != nil {
		t.Fatal(err)
	}
	if got, err = l.load(); err != nil {
		t.Fatal(err)
	}
	if r := got[0]; r.next != 7 || r.floor != 6 || len(r.log) != 1 || r.log[0].GetSeq() != 7 {
		t.Fatalf("after a gap: next %d floor %d, %d entries", r.next, r.floor, len(r.log))
	}
	l.Close()
}

// A worker that missed updates before the router restarted is caught up
// after it from the update log, in a real folder and on Pebble's
// in-memory file system. (With the log in memory it stays stale:
// TestUpdatesStaleWorkerAfterRouterRestart.)
func TestUpdateLogAcrossRouterRestart(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    func(t *testing.T) Options
	}{
		{"dir", func(t *testing.T) Options { return Options{UpdateLogDir: t.TempDir()} }},
		{"memfs", func(*testing.T) Options { return Options{UpdateLogDir: "log", UpdateLogFS: vfs.NewMem()} }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := tc.o(t)
			o.UpdateQuorum = QuorumOne
			a, b := &seqCN{}, &seqCN{}
			rig := newUpdateRig(t, o, a, b)
			if _, err := rig.update("t", 1, 10); err != nil {
				t.Fatal(err)
			}
			b.setDown(true)
			for v := range 3 {
				if _, err := rig.update("t", 2, float32(20+v)); err != nil {
					t.Fatal(err)
				}
			}
			rig.r.Close()
			if a.held() != 4 || b.held() != 1 {
				t.Fatalf("before the restart: a %d b %d", a.held(), b.held())
			}
			b.setDown(false)

			rig = newStartingRig(t, o, a, b)
			defer rig.r.Close()
			if got := rig.servers(); len(got) != 0 {
				t.Fatalf("in the restarted router's startup window lookups went to %v", got)
			}
			rig.settle()
			if got := rig.servers(); !got[0] || got[1] {
				t.Fatalf("after the window, before the catch-up, lookups went to %v", got)
			}
			rig.tick()
			if b.held() != 4 || b.row(2) != 22 || b.row(1) != 10 {
				t.Fatalf("after the restart b holds %d, rows %v %v", b.held(), b.row(1), b.row(2))
			}
			if got := rig.servers(); !got[0] || !got[1] {
				t.Fatalf("the caught-up worker does not serve: %v", got)
			}
			if n := rig.logs.count("misses updates the router no longer holds"); n != 0 {
				t.Fatalf("a worker was reported stale %d times", n)
			}
			// The numbering goes on from the log.
			if r, err := rig.update("t", 3, 1); err != nil || r.GetWorkers() != 2 || a.held() != 5 {
				t.Fatalf("update after the restart: %v %v, a holds %d", r, err, a.held())
			}
		})
	}
}

// An update the router cannot write to its log is neither sent nor
// acknowledged.
func TestUpdateLogWriteFails(t *testing.T) {
	a := &seqCN{}
	rig := newUpdateRig(t, Options{UpdateLogDir: "log", UpdateLogFS: vfs.NewMem()}, a)
	if _, err := rig.update("t", 1, 1); err != nil {
		t.Fatal(err)
	}
	rig.r.upd.ulog.Close() // every write fails from now on
	_, err := rig.update("t", 1, 2)
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "update log") {
		t.Fatalf("update with a failing log: %v", err)
	}
	rig.r.upd.wait()
	if a.held() != 1 || a.row(1) != 1 {
		t.Fatalf("an update the log lacks was sent: a holds %d, row %v", a.held(), a.row(1))
	}
}

// The quorum over RPC: majority of three takes two, all takes three; an
// update below it is Unavailable and still reaches every worker.
func TestUpdateQuorum(t *testing.T) {
	a, b, c := &seqCN{}, &seqCN{}, &seqCN{}
	rig := newUpdateRig(t, Options{}, a, b, c) // the default: majority
	c.setDown(true)
	if r, err := rig.update("t", 1, 1); err != nil || r.GetWorkers() != 2 {
		t.Fatalf("majority, one of three down: %v %v", r, err)
	}
	b.setDown(true)
	_, err := rig.update("t", 1, 2)
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "held by 1 of 3") {
		t.Fatalf("majority, two of three down: %v", err)
	}
	if got := rig.servers(); !got[0] || !got[1] || got[2] {
		t.Fatalf("an unacknowledged update changed who serves: %v", got)
	}
	b.setDown(false)
	c.setDown(false)
	rig.tick()
	if a.held() != 2 || b.held() != 2 || c.held() != 2 || c.row(1) != 2 {
		t.Fatalf("after the catch-up: %d %d %d", a.held(), b.held(), c.held())
	}

	x, y := &seqCN{}, &seqCN{}
	rig = newUpdateRig(t, Options{UpdateQuorum: QuorumAll}, x, y)
	y.setDown(true)
	if _, err := rig.update("t", 1, 1); status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "held by 1 of 2") {
		t.Fatalf("all, one of two down: %v", err)
	}
	y.setDown(false)
	rig.tick()
	if r, err := rig.update("t", 1, 2); err != nil || r.GetWorkers() != 2 {
		t.Fatalf("all, both up: %v %v", r, err)
	}
}

// An update whose log write failed reaches no worker, not even by the
// catch-up at the next heartbeat, so a router restarted from the log
// cannot hand its number to another update (the reviewer's
// reproduction): quorum one, the log on the in-memory file system.
func TestUpdateLogWriteFailureNeverSent(t *testing.T) {
	fs := vfs.NewMem()
	o := Options{UpdateLogDir: "log", UpdateLogFS: fs, UpdateQuorum: QuorumOne}
	a, b := &seqCN{}, &seqCN{}
	rig := newUpdateRig(t, o, a, b)
	if r, err := rig.update("t", 1, 1); err != nil || r.GetWorkers() != 2 {
		t.Fatalf("update 1: %v %v", r, err)
	}
	b.setDown(true)
	rig.r.upd.ulog.Close() // every write fails from now on
	if _, err := rig.update("t", 1, 2); status.Code(err) != codes.Unavailable {
		t.Fatalf("update 2 with a failing log: %v", err)
	}
	rig.r.upd.wait()
	rig.tick()
	if a.held() != 1 || a.row(1) != 1 {
		t.Errorf("after a heartbeat a worker was sent the update the log lacks: a holds %d, row %v", a.held(), a.row(1))
	}
	// A second update is refused too while the log cannot be written.
	if _, err := rig.update("t", 1, 3); status.Code(err) != codes.Unavailable {
		t.Errorf("update 3 with a failing log: %v", err)
	}
	rig.r.upd.wait()
	if a.held() != 1 {
		t.Errorf("a holds %d after update 3, want 1", a.held())
	}
	rig.r.Close()

	// The router restarts from the log while a is away; b is back.
	b.setDown(false)
	rig = newStartingRig(t, o, b)
	defer rig.r.Close()
	rig.settle()
	if r, err := rig.update("t", 1, 99); err != nil || r.GetWorkers() != 1 {
		t.Fatalf("update after the restart: %v %v", r, err)
	}
	// a returns, announcing what it holds: it may serve only with the
	// acknowledged row.
	rig.add(a)
	rig.tick()
	if got := rig.servers(); got[1] && a.row(1) != 99 {
		t.Fatalf("a serves row 1 = %v (holds update %d), acknowledged: 99", a.row(1), a.held())
	}
	if a.row(1) != 99 || b.row(1) != 99 {
		t.Fatalf("after the catch-up: a row %v (seq %d), b row %v (seq %d)", a.row(1), a.held(), b.row(1), b.held())
	}
}

// A folder holding keys the update log does not write is refused, an
// embedding store's by name; one holding the log's own keys, whatever
// the model names, opens.
func TestUpdateLogOwnKeysOnly(t *testing.T) {
	for _, tc := range []struct {
		name string
		keys []string
		want string // "": opens
	}{
		{"empty", nil, ""},
		{"a log", []string{"s\x00model", "e\x05model\x00\x00\x00\x00\x00\x00\x00\x01", "szz"}, ""},
		// cpuserve/store keys.go: the catalog, under table id 0.
		{"an embedding store", []string{"\x00\x00\x00\x00catalog", "\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x00"}, "holds an embedding store"},
		{"a store's rows only", []string{"\x00\x00\x00\x00updseq/m"}, "holds an embedding store"},
		{"something between", []string{"s1", "g"}, `holds key "g"`},
		{"a log with outcomes", []string{"e1", "o\x05model\x00\x00\x00\x00\x00\x00\x00\x01", "s1"}, ""},
		{"something between outcomes and states", []string{"e1", "o1", "p", "s1"}, `holds key "p"`},
		{"something after", []string{"e1", "u"}, `holds key "u"`},
		{"something before", []string{"a", "e1"}, `holds key "a"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := vfs.NewMem()
			db, err := pebble.Open("dir", &pebble.Options{FS: fs})
			if err != nil {
				t.Fatal(err)
			}
			for _, k := range tc.keys {
				if err := db.Set([]byte(k), []byte("v"), nil); err != nil {
					t.Fatal(err)
				}
			}
			if err := db.Close(); err != nil {
				t.Fatal(err)
			}
			l, err := openUpdateLog("dir", fs)
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				l.Close()
				return
			}
			if err == nil {
				l.Close()
				t.Fatalf("opened; want %q", tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("%v; want %q", err, tc.want)
			}
		})
	}
}

// The diverged marks a persist carries are read back with the numbers
// (a router restarted before a diverged worker was told its mark keeps
// it out: divergedrestart.txt); a later persist without them clears
// them, and a state of an earlier release (the numbers alone) reads
// back with none.
func TestUpdateLogDivergedMarks(t *testing.T) {
	fs := vfs.NewMem()
	l, err := openUpdateLog("log", fs)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { l.Close() }()
	entry := &prismv1.ApplyUpdateRequest{Seq: 1, Update: &prismv1.UpdateRequest{Model: "m", Table: "t", Ids: []int64{1}, Rows: make([]byte, 4)}}
	marks := map[string]int64{"embedding/host/7/1700000000000000000": 1, "w2": 1 << 40}
	for _, c := range []struct {
		name  string
		write logChange
		want  map[string]int64
	}{
		{"marks", logChange{Next: 1, Committed: 1, Entry: entry, Diverged: marks}, marks},
		{"none", logChange{Next: 1, Committed: 1}, nil},
	} {
		if err := l.write([]message{{Type: msgPersist, Model: "m", Persist: &c.write}}); err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		if l, err = openUpdateLog("log", fs); err != nil {
			t.Fatal(err)
		}
		got, err := l.load()
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if len(got) != 1 || got[0].next != 1 || got[0].committed != 1 || len(got[0].log) != 1 || !maps.Equal(got[0].diverged, c.want) {
			t.Fatalf("%s: read back %+v, want marks %v", c.name, got, c.want)
		}
	}
	for _, c := range []struct {
		state []byte
		ok    bool
	}{
		{[]byte{1, 1, 0}, true},             // an earlier release's: no marks
		{[]byte{1, 1, 0, 1, 2, 'w'}, false}, // an id cut short
		{[]byte{1, 1, 0, 1, 1, 'w', 1, 9}, false},
	} {
		if err := l.db.Set(stateKey("m"), c.state, pebble.Sync); err != nil {
			t.Fatal(err)
		}
		got, err := l.load()
		if (err == nil) != c.ok || (c.ok && got[0].diverged != nil) {
			t.Fatalf("state %v: %+v, %v", c.state, got, err)
		}
	}
}

// The outcomes a persist carries are read back for the entries the log
// still holds: one trimmed (or dropped by an adoption) goes with its
// entry, and a value that is neither applied nor refused does not load.
func TestUpdateLogOutcomes(t *testing.T) {
	fs := vfs.NewMem()
	l, err := openUpdateLog("log", fs)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { l.Close() }()
	entry := func(seq int64) *prismv1.ApplyUpdateRequest {
		return &prismv1.ApplyUpdateRequest{Seq: seq, Update: &prismv1.UpdateRequest{Model: "m", Table: "t", Ids: []int64{seq}, Rows: make([]byte, 4)}}
	}
	reopen := func() []restoredModel {
		t.Helper()
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		if l, err = openUpdateLog("log", fs); err != nil {
			t.Fatal(err)
		}
		got, err := l.load()
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	for _, c := range []struct {
		name   string
		writes []logChange
		want   map[int64]int8
	}{
		{"none decided", []logChange{{Next: 1, Entry: entry(1)}}, nil},
		{"decided with the next entry", []logChange{
			{Next: 2, Entry: entry(2)},
			{Next: 3, Committed: 2, Entry: entry(3), Outcomes: map[int64]int8{1: 1, 2: -1}},
		}, map[int64]int8{1: 1, 2: -1}},
		{"a later decision, and one of an update never logged", []logChange{
			{Next: 3, Committed: 3, Outcomes: map[int64]int8{3: 1, 9: 1}},
		}, map[int64]int8{1: 1, 2: -1, 3: 1}},
		{"trimmed with its entry", []logChange{{Next: 3, Committed: 3, Floor: 1, DropFrom: 0}}, map[int64]int8{2: -1, 3: 1}},
		{"a rewrite of every outcome", []logChange{{Next: 3, Committed: 3, Floor: 1, DropFrom: 1, Rewrite: 1, Outcomes: map[int64]int8{2: -1, 3: 1}}}, map[int64]int8{2: -1, 3: 1}},
		{"adopted: the log dropped", []logChange{{Next: 200, Committed: 200, Floor: 200, DropFrom: 1}}, nil},
	} {
		for i := range c.writes {
			if err := l.write([]message{{Type: msgPersist, Model: "m", Persist: &c.writes[i]}}); err != nil {
				t.Fatalf("%s: %v", c.name, err)
			}
		}
		got := reopen()
		if len(got) != 1 || !maps.Equal(got[0].outcomes, c.want) {
			t.Fatalf("%s: read back %+v, want outcomes %v", c.name, got, c.want)
		}
	}
	if err := l.write([]message{{Type: msgPersist, Model: "m", Persist: &logChange{Next: 201, Committed: 200, Floor: 200, Entry: entry(201)}}}); err != nil {
		t.Fatal(err)
	}
	for _, v := range [][]byte{{0}, {2}, {1, 1}, nil} {
		if err := l.db.Set(outcomeKey("m", 201), v, pebble.Sync); err != nil {
			t.Fatal(err)
		}
		if got, err := l.load(); err == nil || !strings.Contains(err.Error(), "outcome of update 201") {
			t.Fatalf("outcome %v: %+v, %v; want it refused", v, got, err)
		}
	}
}

// FuzzUpdateLogState: whatever bytes a model's state holds on disk (a
// torn or foreign write, another release's format), load refuses it
// with an error or reads numbers in order (0 <= floor <= next,
// 0 <= committed <= next) and entries floor+1 .. next, never a panic.
func FuzzUpdateLogState(f *testing.F) {
	f.Add([]byte{1, 1, 0})
	f.Add([]byte{3, 2, 1, 1, 2, 'w', '1', 1})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, 1, 0})
	f.Add([]byte{2, 5, 0})
	f.Fuzz(func(t *testing.T, state []byte) {
		l, err := openUpdateLog("log", vfs.NewMem())
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		for seq := int64(1); seq <= 3; seq++ {
			if err := l.write([]message{{Type: msgPersist, Model: "m", Persist: &logChange{Next: seq, Committed: seq, Entry: &prismv1.ApplyUpdateRequest{Seq: seq, Update: &prismv1.UpdateRequest{Model: "m", Table: "t", Ids: []int64{seq}, Rows: make([]byte, 4)}}, Outcomes: map[int64]int8{seq: 1}}}}); err != nil {
				t.Fatal(err)
			}
		}
		if err := l.db.Set(stateKey("m"), state, pebble.Sync); err != nil {
			t.Fatal(err)
		}
		got, err := l.load()
		if err != nil {
			return
		}
		for _, r := range got {
			if r.floor < 0 || r.floor > r.next || r.committed < 0 || r.committed > r.next {
				t.Fatalf("state %v read back as floor %d, committed %d, next %d", state, r.floor, r.committed, r.next)
			}
			for i, e := range r.log {
				if e.GetSeq() != r.floor+1+int64(i) {
					t.Fatalf("state %v: entry %d has seq %d, floor %d", state, i, e.GetSeq(), r.floor)
				}
			}
			for seq := range r.outcomes {
				if seq <= r.floor || seq > r.next {
					t.Fatalf("state %v: an outcome of update %d outside %d .. %d", state, seq, r.floor+1, r.next)
				}
			}
		}
	})
}
