package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// copyStore builds the two stores of a mend on fs: "good", whose copy
// of model m holds updates 1..3, and "bad", marked diverged at 1 (it
// applied update 1 otherwise). Both closed.
func copyStores(t *testing.T, fs vfs.FS) {
	t.Helper()
	plan := writePlan(t, "m", []*testTable{{name: "a", rows: 10, dim: 2, seed: 1}})
	for _, db := range []string{"good", "bad"} {
		s, err := Open(db, &Options{FS: fs})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Ingest(context.Background(), plan, IngestOptions{}); err != nil {
			t.Fatal(err)
		}
		n := int64(3)
		if db == "bad" {
			n = 1
		}
		for seq := int64(1); seq <= n; seq++ {
			v := float32(seq)
			if db == "bad" {
				v = -1
			}
			if _, err := s.UpsertSeq("m", "a", []int64{1}, []float32{v, 0}, seq); err != nil {
				t.Fatal(err)
			}
		}
		if db == "bad" {
			if _, err := s.MarkDiverged("m", 1); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// stage writes checkpoint c into store folder dst's staged copy, as
// prism store copy does (without its checks), and marks it complete.
func stage(t *testing.T, fs vfs.FS, c *Checkpoint, dst string) {
	t.Helper()
	in := fs.PathJoin(dst, stagedDir)
	if err := fs.MkdirAll(in, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range c.Files {
		r, err := c.Open(f.Name)
		if err != nil {
			t.Fatal(err)
		}
		w, err := fs.Create(fs.PathJoin(in, f.Name), vfs.WriteCategoryUnspecified)
		if err != nil {
			t.Fatal(err)
		}
		if n, err := io.Copy(w, r); err != nil || n != f.Size {
			t.Fatalf("copy %s: %d bytes, %v; want %d", f.Name, n, err, f.Size)
		}
		r.Close()
		if err := w.Sync(); err != nil {
			t.Fatal(err)
		}
		w.Close()
	}
	w, err := fs.Create(fs.PathJoin(in, stagedComplete), vfs.WriteCategoryUnspecified)
	if err != nil {
		t.Fatal(err)
	}
	w.Close()
}

// held is what store folder db holds of model m: the applied update,
// the diverged mark and row 1.
func held(t *testing.T, fs vfs.FS, db string, readOnly bool) string {
	t.Helper()
	s, err := Open(db, &Options{FS: fs, ReadOnly: readOnly, MustExist: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	seq, err := s.AppliedSeq("m")
	if err != nil {
		t.Fatal(err)
	}
	marks, err := s.Diverged()
	if err != nil {
		t.Fatal(err)
	}
	out := make([]float32, 2)
	if err := s.Lookup("m", []TableLookup{{Table: "a", IDs: []int64{1}, Out: out}}); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("seq %d marks %v row1 %v", seq, marks, out)
}

// TestCopyStagedSwap: a checkpoint of an up-to-date store, staged into
// a diverged store's folder while that store is open, is swapped in by
// the store's next open for writing, not before: the mended store holds
// the good one's updates and no mark, and the diverged store's files are
// kept in the folder the swap names (nothing lost), a store that opens
// as it was.
func TestCopyStagedSwap(t *testing.T) {
	fs := vfs.NewMem()
	copyStores(t, fs)
	want := held(t, fs, "good", true)
	wantOld := held(t, fs, "bad", true)
	if want == wantOld {
		t.Fatalf("the stores hold the same: %s", want)
	}

	good, err := Open("good", &Options{FS: fs})
	if err != nil {
		t.Fatal(err)
	}
	defer good.Close()
	c, err := good.Checkpoint()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := good.Checkpoint(); !errors.Is(err, ErrCheckpointBusy) {
		t.Fatalf("a second checkpoint while one is open: %v, want ErrCheckpointBusy", err)
	}
	bad, err := Open("bad", &Options{FS: fs})
	if err != nil {
		t.Fatal(err)
	}
	stage(t, fs, c, "bad")
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := fs.Stat(c.Dir); err == nil {
		t.Fatalf("checkpoint folder %s left after Close", c.Dir)
	}
	c2, err := good.Checkpoint()
	if err != nil {
		t.Fatalf("a checkpoint after the last one closed: %v", err)
	}
	c2.Close()

	// In use: the staged copy waits.
	if _, err := Open("bad", &Options{FS: fs}); err == nil {
		t.Fatal("a second open of a store in use succeeded")
	}
	if _, ok := bad.Swapped(); ok {
		t.Fatal("swapped while open")
	}
	if err := bad.Close(); err != nil {
		t.Fatal(err)
	}
	// A read-only open does not swap.
	if got := held(t, fs, "bad", true); got != wantOld {
		t.Fatalf("read-only open: %s, want the old store's %s", got, wantOld)
	}

	s, err := Open("bad", &Options{FS: fs})
	if err != nil {
		t.Fatal(err)
	}
	rep, ok := s.Swapped()
	s.Close()
	if !ok || rep.Files == 0 || !strings.HasPrefix(rep.Replaced, fs.PathJoin("bad", replacedPrefix)) {
		t.Fatalf("Swapped: %+v, %v", rep, ok)
	}
	if got := held(t, fs, "bad", false); got != want {
		t.Fatalf("mended store: %s, want the good one's %s", got, want)
	}
	if got := held(t, fs, rep.Replaced, true); got != wantOld {
		t.Fatalf("replaced store %s: %s, want %s", rep.Replaced, got, wantOld)
	}
	names, _ := fs.List("bad")
	for _, n := range names {
		if n == stagedDir || n == swapJournal {
			t.Errorf("%s left in the store folder after the swap", n)
		}
	}
}

// failRename fails every Rename after the first ok.
type failRename struct {
	vfs.FS
	ok *int
}

var errInjected = errors.New("injected")

func (f failRename) Rename(from, to string) error {
	if *f.ok == 0 {
		return errInjected
	}
	*f.ok--
	return f.FS.Rename(from, to)
}

// TestCopySwapResumes: a swap stopped at every one of its renames (the
// journal's included) is finished by the next open, which gives the
// good store's content, the old store's files all in one replaced
// folder, and no file of either lost.
func TestCopySwapResumes(t *testing.T) {
	for k := 0; ; k++ {
		fs := vfs.NewMem()
		copyStores(t, fs)
		want := held(t, fs, "good", true)
		wantOld := held(t, fs, "bad", true)
		before, _ := fs.List("bad")
		stageGood(t, fs)

		ok := k
		s, err := Open("bad", &Options{FS: failRename{FS: fs, ok: &ok}})
		if err == nil {
			s.Close()
			if k == 0 {
				t.Fatal("no rename failed")
			}
			t.Logf("the swap takes %d renames", k)
			return
		}
		if !errors.Is(err, errInjected) {
			t.Fatalf("rename %d: %v", k, err)
		}
		if got := held(t, fs, "bad", false); got != want {
			t.Fatalf("stopped at rename %d, reopened: %s, want %s", k, got, want)
		}
		names, _ := fs.List("bad")
		var replaced []string
		for _, n := range names {
			if strings.HasPrefix(n, replacedPrefix) {
				replaced = append(replaced, n)
			}
		}
		if len(replaced) != 1 {
			t.Fatalf("stopped at rename %d: replaced folders %v", k, replaced)
		}
		old, _ := fs.List(fs.PathJoin("bad", replaced[0]))
		for _, n := range before {
			if n != lockFile && !slices.Contains(old, n) {
				t.Errorf("stopped at rename %d: the old store's %s is not in %s (%v)", k, n, replaced[0], old)
			}
		}
		if got := held(t, fs, fs.PathJoin("bad", replaced[0]), true); got != wantOld {
			t.Fatalf("stopped at rename %d: replaced store %s, want %s", k, got, wantOld)
		}
	}
}

// TestCopySwapBadJournal: a journal that is not one is an error that
// names the folders, and the store is not opened over a half swap.
func TestCopySwapBadJournal(t *testing.T) {
	fs := vfs.NewMem()
	copyStores(t, fs)
	f, err := fs.Create(fs.PathJoin("bad", swapJournal), vfs.WriteCategoryUnspecified)
	if err != nil {
		t.Fatal(err)
	}
	io.WriteString(f, "3 ../elsewhere\n")
	f.Close()
	_, err = Open("bad", &Options{FS: fs})
	if err == nil || !strings.Contains(err.Error(), "is not a swap journal") {
		t.Fatalf("open over a bad journal: %v", err)
	}
}

// TestCheckpointLeftoversRemoved: a checkpoint folder a process left
// (it died sending one) is removed by the next open for writing.
func TestCheckpointLeftoversRemoved(t *testing.T) {
	fs := vfs.NewMem()
	copyStores(t, fs)
	s, err := Open("good", &Options{FS: fs})
	if err != nil {
		t.Fatal(err)
	}
	c, err := s.Checkpoint()
	if err != nil {
		t.Fatal(err)
	}
	s.Close() // without c.Close
	s, err = Open("good", &Options{FS: fs})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
	if _, err := fs.Stat(c.Dir); err == nil {
		t.Fatalf("%s left after an open", c.Dir)
	}
}

// stageGood stages a checkpoint of "good" into "bad" (copyStores).
func stageGood(t *testing.T, fs vfs.FS) { t.Helper(); stageGoodIn(t, fs, "bad") }

// stageGoodIn stages a checkpoint of "good" in store folder dst.
func stageGoodIn(t *testing.T, fs vfs.FS, dst string) {
	t.Helper()
	good, err := Open("good", &Options{FS: fs})
	if err != nil {
		t.Fatal(err)
	}
	defer good.Close()
	c, err := good.Checkpoint()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	stage(t, fs, c, dst)
}

// TestCopySwapsKeepEachStore: two swaps within one second (or a clock
// set back) keep each replaced store in a folder of its own, each
// opening as it was; a volume's lost+found (and hidden entries) in the
// store folder stay where they are.
func TestCopySwapsKeepEachStore(t *testing.T) {
	fs := vfs.NewMem()
	copyStores(t, fs)
	if err := fs.MkdirAll(fs.PathJoin("bad", "lost+found"), 0o700); err != nil {
		t.Fatal(err)
	}
	f, _ := fs.Create(fs.PathJoin("bad", ".keep"), vfs.WriteCategoryUnspecified)
	f.Close()
	wantOld := held(t, fs, "bad", true)
	want := held(t, fs, "good", true)
	var kept []string
	for i := 0; i < 2; i++ {
		stageGood(t, fs)
		s, err := swapOpen(fs, "bad", "20261201T000000Z")
		if err != nil {
			t.Fatal(err)
		}
		rep, ok := s.Swapped()
		s.Close()
		if !ok {
			t.Fatalf("swap %d: none", i)
		}
		kept = append(kept, rep.Replaced)
	}
	if kept[0] == kept[1] {
		t.Fatalf("both swaps kept their stores in %s", kept[0])
	}
	if got := held(t, fs, kept[0], true); got != wantOld {
		t.Fatalf("first replaced store: %s, want %s", got, wantOld)
	}
	if got := held(t, fs, kept[1], true); got != want {
		t.Fatalf("second replaced store: %s, want %s", got, want)
	}
	for _, n := range []string{"lost+found", ".keep"} {
		if _, err := fs.Stat(fs.PathJoin("bad", n)); err != nil {
			t.Errorf("%s moved by the swap: %v", n, err)
		}
	}
}

// swapOpen opens store folder dir for writing as Open does, the swap
// stamped stamp.
func swapOpen(fs vfs.FS, dir, stamp string) (*Store, error) {
	swapStamp = func() string { return stamp }
	defer func() { swapStamp = defaultSwapStamp }()
	return Open(dir, &Options{FS: fs})
}

// TestCopySwapWaitsForCopyUnderWay: while a prism store copy holds the
// staged folder (it is replacing the staged copy), an open serves the
// store as it is and swaps nothing; the next open after it swaps.
func TestCopySwapWaitsForCopyUnderWay(t *testing.T) {
	fs := vfs.NewMem()
	copyStores(t, fs)
	stageGood(t, fs)
	l, err := fs.Lock(fs.PathJoin("bad", stagedDir, stagedLock))
	if err != nil {
		t.Fatal(err)
	}
	s, err := Open("bad", &Options{FS: fs})
	if err != nil {
		t.Fatalf("open while a copy is under way: %v", err)
	}
	_, ok := s.Swapped()
	s.Close()
	if ok {
		t.Fatal("swapped while a copy holds the staged folder")
	}
	l.Close()
	if got, want := held(t, fs, "bad", false), held(t, fs, "good", true); got != want {
		t.Fatalf("after the copy: %s, want %s", got, want)
	}
}

// TestCopySwapMissingMark: a swap under way whose staged copy lost its
// complete mark (removed by hand) is refused, naming both folders,
// instead of finishing into an empty store.
func TestCopySwapMissingMark(t *testing.T) {
	fs := vfs.NewMem()
	copyStores(t, fs)
	stageGood(t, fs)
	ok := 3 // the journal's rename, then two of the store's files
	if _, err := Open("bad", &Options{FS: failRename{FS: fs, ok: &ok}}); !errors.Is(err, errInjected) {
		t.Fatalf("open with failing renames: %v", err)
	}
	if err := fs.Remove(fs.PathJoin("bad", stagedDir, stagedComplete)); err != nil {
		t.Fatal(err)
	}
	_, err := Open("bad", &Options{FS: fs})
	if err == nil || !strings.Contains(err.Error(), "lacks its COMPLETE mark") {
		t.Fatalf("open over a half swap without the mark: %v", err)
	}
}

// TestLastMend: the time RecordMend wrote, none before, an error for a
// file that is not one; a swap leaves the record where it is (the
// operator removes replaced-<time> folders without losing it), and a
// copy may not carry one.
func TestLastMend(t *testing.T) {
	fs := vfs.NewMem()
	copyStores(t, fs)
	if _, ok, err := LastMend(fs, "bad"); ok || err != nil {
		t.Fatalf("before any mend: %v %v", ok, err)
	}
	at := time.Date(2026, 12, 1, 4, 39, 0, 0, time.UTC)
	if err := RecordMend(fs, "bad", at); err != nil {
		t.Fatal(err)
	}
	stageGood(t, fs)
	s, err := swapOpen(fs, "bad", "20261201T043900Z")
	if err != nil {
		t.Fatal(err)
	}
	rep, ok := s.Swapped()
	s.Close()
	if !ok || rep.Replaced == "" {
		t.Fatalf("swap: %+v %v", rep, ok)
	}
	if got, ok, err := LastMend(fs, "bad"); !ok || err != nil || !got.Equal(at) {
		t.Fatalf("after the swap: %v %v %v, want %v", got, ok, err, at)
	}
	if _, err := fs.Stat(fs.PathJoin(rep.Replaced, mendStamp)); err == nil {
		t.Fatal("the swap moved the mend's record with the replaced store")
	}
	if err := fs.RemoveAll(rep.Replaced); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := LastMend(fs, "bad"); !ok {
		t.Fatal("removing the replaced store forgot the mend")
	}
	if !ReservedName(mendStamp) {
		t.Fatalf("a copy may carry %s", mendStamp)
	}
	f, _ := fs.Create(fs.PathJoin("bad", mendStamp), vfs.WriteCategoryUnspecified)
	f.Write([]byte("yesterday\n"))
	f.Close()
	if _, _, err := LastMend(fs, "bad"); err == nil || !strings.Contains(err.Error(), "not a time") {
		t.Fatalf("a record that is not a time: %v", err)
	}
	// A copy into a folder holding no store (a new replica's seed) keeps
	// no folder.
	if err := fs.MkdirAll("new", 0o755); err != nil {
		t.Fatal(err)
	}
	stageGoodIn(t, fs, "new")
	s, err = swapOpen(fs, "new", "20261201T044000Z")
	if err != nil {
		t.Fatal(err)
	}
	rep, ok = s.Swapped()
	s.Close()
	if !ok || rep.Replaced != "" || rep.Files == 0 || rep.Kept() != "the folder held no store before" {
		t.Fatalf("the seed's swap: %+v %v (%s)", rep, ok, rep.Kept())
	}
	if names, _ := fs.List("new"); slices.ContainsFunc(names, func(n string) bool { return strings.HasPrefix(n, replacedPrefix) }) {
		t.Fatalf("the seed left %v", names)
	}
	if got := held(t, fs, "new", true); got != held(t, fs, "good", true) {
		t.Fatalf("the seeded store: %s", got)
	}
}
