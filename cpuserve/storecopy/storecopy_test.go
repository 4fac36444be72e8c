package storecopy

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"google.golang.org/protobuf/proto"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/cpuserve/store"
	"github.com/prism-serve/prism/internal/tablefile"
	"github.com/prism-serve/prism/plan"
	"github.com/prism-serve/prism/sharding"
)

// sliceStream replays chunks, then io.EOF.
type sliceStream []*prismv1.SnapshotChunk

func (s *sliceStream) Recv() (*prismv1.SnapshotChunk, error) {
	if len(*s) == 0 {
		return nil, io.EOF
	}
	c := (*s)[0]
	*s = (*s)[1:]
	return c, nil
}

// fromSlice is an Open answering with s whatever is asked.
func fromSlice(s *sliceStream) Open {
	return func(*prismv1.SnapshotRequest) (Stream, error) { return s, nil }
}

// testPlan writes a plan folder for model m, one table a of 8 rows of
// 2 (plan.json and its table file, as prism partition writes them).
func testPlan(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "tables"), 0o755); err != nil {
		t.Fatal(err)
	}
	const rows, dim = 8, 2
	vals := make([]float32, rows*dim)
	for i := range vals {
		vals[i] = float32(i)
	}
	file := tablefile.FileName("a")
	meta, err := tablefile.Write(filepath.Join(dir, file), "a", dim, vals, nil)
	if err != nil {
		t.Fatal(err)
	}
	p := &plan.Plan{Version: plan.Version, Model: plan.ModelInfo{Name: "m"}, DenseModel: "dense.onnx",
		Outputs: []plan.TensorInfo{{Name: "score", DType: "float32", Shape: []int64{1}}},
		Inputs:  []plan.TensorInfo{{Name: "ids_a", DType: "int64", Shape: []int64{}, Sides: []plan.Side{plan.CPU}}},
		Tables: []plan.Table{{Name: "a", File: file, Rows: meta.Rows, Dim: meta.Dim, DType: "float32", SHA256: meta.SHA256,
			Lookups: []plan.Lookup{{Input: "ids_a", Bag: 1, Pooling: plan.PoolSum, Output: "emb_a"}}}},
	}
	if err := plan.Write(dir, p); err != nil {
		t.Fatal(err)
	}
	return dir
}

// ingest adds model m (testPlan) to s.
func ingest(t testing.TB, s *store.Store) {
	t.Helper()
	if _, err := s.Ingest(context.Background(), testPlan(t), store.IngestOptions{}); err != nil {
		t.Fatal(err)
	}
}

// chunksOf is the Snapshot stream of checkpoint c, in chunks of size.
func chunksOf(t testing.TB, fs vfs.FS, c *store.Checkpoint, size int) []*prismv1.SnapshotChunk {
	t.Helper()
	m := &prismv1.SnapshotManifest{Store: "src"}
	out := []*prismv1.SnapshotChunk{{Manifest: m}}
	for i, f := range c.Files {
		m.Files = append(m.Files, &prismv1.SnapshotFile{Name: f.Name, Size: f.Size})
		r, err := c.Open(f.Name)
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(r)
		r.Close()
		if err != nil {
			t.Fatal(err)
		}
		for off := 0; ; off += size {
			end := min(off+size, len(b))
			ch := &prismv1.SnapshotChunk{File: int32(i), Offset: int64(off), Data: b[off:end], Eof: end == len(b)}
			if ch.Eof {
				ch.Crc32C = crc32.Checksum(b, castagnoli)
			}
			out = append(out, ch)
			if ch.Eof {
				break
			}
		}
	}
	return out
}

// source makes a store "src" on fs holding model m with updates 1..3
// (rows written by UpsertSeq over an ingested table) and returns the
// chunks of a checkpoint of it.
func source(t testing.TB, fs vfs.FS) []*prismv1.SnapshotChunk {
	t.Helper()
	s, err := store.Open("src", &store.Options{FS: fs})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ingest(t, s)
	for seq := int64(1); seq <= 3; seq++ {
		if _, err := s.UpsertSeq("m", "a", []int64{1}, []float32{float32(seq), 0}, seq); err != nil {
			t.Fatal(err)
		}
	}
	c, err := s.Checkpoint()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return chunksOf(t, fs, c, 1000)
}

func clone(cs []*prismv1.SnapshotChunk) []*prismv1.SnapshotChunk {
	out := make([]*prismv1.SnapshotChunk, len(cs))
	for i, c := range cs {
		out[i] = proto.Clone(c).(*prismv1.SnapshotChunk)
	}
	return out
}

// damageTable flips a byte of the first table file (*.sst) in the
// stream cs, as the sender's disk would have, its chunks' checksum
// being of the bytes as damaged.
func damageTable(cs []*prismv1.SnapshotChunk) []*prismv1.SnapshotChunk {
	file := int32(-1)
	for i, f := range cs[0].GetManifest().GetFiles() {
		if strings.HasSuffix(f.GetName(), ".sst") {
			file = int32(i)
			break
		}
	}
	if file < 0 {
		panic("no table file in the stream")
	}
	var sum uint32
	flipped := false
	for _, c := range cs[1:] {
		if c.GetFile() != file {
			continue
		}
		if !flipped && len(c.Data) > 10 {
			c.Data[10] ^= 0x5a // in the first data block
			flipped = true
		}
		sum = crc32.Update(sum, castagnoli, c.Data)
		if c.Eof {
			c.Crc32C = sum
		}
	}
	return cs
}

// firstData is the index of the first chunk with data.
func firstData(cs []*prismv1.SnapshotChunk) int {
	for i, c := range cs {
		if len(c.GetData()) > 1 {
			return i
		}
	}
	panic("no data")
}

// TestReceive: a checkpoint's stream is staged whole and complete, and
// the store's next open swaps it in; each way a stream can be wrong (a
// name leaving the folder, a gap, a flipped bit, a cut, a tail, a copy
// that is not a store, a disk too small) is refused naming it, leaves
// no complete copy, and the store opens as it was.
func TestReceive(t *testing.T) {
	base := vfs.NewMem()
	good := source(t, base)
	cases := []struct {
		name string
		edit func([]*prismv1.SnapshotChunk) []*prismv1.SnapshotChunk
		free uint64
		want string // error substring; "" for success
	}{
		{name: "whole", edit: func(c []*prismv1.SnapshotChunk) []*prismv1.SnapshotChunk { return c }},
		{name: "no manifest", edit: func(c []*prismv1.SnapshotChunk) []*prismv1.SnapshotChunk { return c[1:] }, want: "did not start with a manifest"},
		{name: "parent", edit: func(c []*prismv1.SnapshotChunk) []*prismv1.SnapshotChunk {
			c[0].Manifest.Files[0].Name = "../x"
			return c
		}, want: "not a file name"},
		{name: "reserved", edit: func(c []*prismv1.SnapshotChunk) []*prismv1.SnapshotChunk {
			c[0].Manifest.Files[0].Name = store.StagedCompleteName
			return c
		}, want: "keeps for itself"},
		{name: "reserved copy-in", edit: func(c []*prismv1.SnapshotChunk) []*prismv1.SnapshotChunk {
			c[0].Manifest.Files[0].Name = "copy-in"
			return c
		}, want: "keeps for itself"},
		{name: "reserved copy-swap", edit: func(c []*prismv1.SnapshotChunk) []*prismv1.SnapshotChunk {
			c[0].Manifest.Files[0].Name = "copy-swap"
			return c
		}, want: "keeps for itself"},
		{name: "reserved replaced-1", edit: func(c []*prismv1.SnapshotChunk) []*prismv1.SnapshotChunk {
			c[0].Manifest.Files[0].Name = "replaced-1"
			return c
		}, want: "keeps for itself"},
		{name: "reserved copy-out-1", edit: func(c []*prismv1.SnapshotChunk) []*prismv1.SnapshotChunk {
			c[0].Manifest.Files[0].Name = "copy-out-1"
			return c
		}, want: "keeps for itself"},
		{name: "reserved .hidden", edit: func(c []*prismv1.SnapshotChunk) []*prismv1.SnapshotChunk {
			c[0].Manifest.Files[0].Name = ".hidden"
			return c
		}, want: "keeps for itself"},
		{name: "reserved lost+found", edit: func(c []*prismv1.SnapshotChunk) []*prismv1.SnapshotChunk {
			c[0].Manifest.Files[0].Name = "lost+found"
			return c
		}, want: "keeps for itself"},
		{name: "reserved ingest-staging", edit: func(c []*prismv1.SnapshotChunk) []*prismv1.SnapshotChunk {
			c[0].Manifest.Files[0].Name = "ingest-staging"
			return c
		}, want: "keeps for itself"},
		{name: "reserved LOCK", edit: func(c []*prismv1.SnapshotChunk) []*prismv1.SnapshotChunk {
			c[0].Manifest.Files[0].Name = "LOCK"
			return c
		}, want: "keeps for itself"},
		{name: "reserved copy.lock", edit: func(c []*prismv1.SnapshotChunk) []*prismv1.SnapshotChunk {
			c[0].Manifest.Files[0].Name = "copy.lock"
			return c
		}, want: "keeps for itself"},
		{name: "twice", edit: func(c []*prismv1.SnapshotChunk) []*prismv1.SnapshotChunk {
			c[0].Manifest.Files[1].Name = c[0].Manifest.Files[0].Name
			return c
		}, want: "twice"},
		{name: "negative size", edit: func(c []*prismv1.SnapshotChunk) []*prismv1.SnapshotChunk {
			c[0].Manifest.Files[0].Size = -1
			return c
		}, want: "-1 bytes"},
		{name: "empty", edit: func(c []*prismv1.SnapshotChunk) []*prismv1.SnapshotChunk {
			c[0].Manifest.Files = nil
			return c[:1]
		}, want: "no files"},
		{name: "bit flipped", edit: func(c []*prismv1.SnapshotChunk) []*prismv1.SnapshotChunk {
			c[firstData(c)].Data[0] ^= 1
			return c
		}, want: "corrupted on the way"},
		{name: "damaged at the sender", edit: func(c []*prismv1.SnapshotChunk) []*prismv1.SnapshotChunk {
			// A table file's block damaged on the sender's disk (bit
			// rot its reads had not reached): sent as read, its
			// checksum the sender's of the damaged bytes.
			return damageTable(c)
		}, want: "is damaged"},
		{name: "gap", edit: func(c []*prismv1.SnapshotChunk) []*prismv1.SnapshotChunk {
			i := firstData(c)
			c[i].Offset++
			return c
		}, want: "where byte 0 was due"},
		{name: "wrong file", edit: func(c []*prismv1.SnapshotChunk) []*prismv1.SnapshotChunk {
			c[1].File = 1
			return c
		}, want: "where file 0's were due"},
		{name: "reused unheld", edit: func(c []*prismv1.SnapshotChunk) []*prismv1.SnapshotChunk {
			// The sender says the caller holds file 0 already; it does not.
			c[1] = &prismv1.SnapshotChunk{File: 0, Eof: true, Reused: true}
			return c
		}, want: "does not hold as it says"},
		{name: "cut", edit: func(c []*prismv1.SnapshotChunk) []*prismv1.SnapshotChunk { return c[:len(c)-1] }, want: "the stream ended"},
		{name: "tail", edit: func(c []*prismv1.SnapshotChunk) []*prismv1.SnapshotChunk {
			return append(c, &prismv1.SnapshotChunk{File: 7})
		}, want: "goes on past"},
		{name: "short file", edit: func(c []*prismv1.SnapshotChunk) []*prismv1.SnapshotChunk {
			c[0].Manifest.Files[0].Size++
			return c
		}, want: "ended at byte"},
		{name: "long file", edit: func(c []*prismv1.SnapshotChunk) []*prismv1.SnapshotChunk {
			c[0].Manifest.Files[0].Size--
			return c
		}, want: "past the manifest"},
		{name: "no room", edit: func(c []*prismv1.SnapshotChunk) []*prismv1.SnapshotChunk { return c }, free: 10, want: "the disk has 10 free"},
		{name: "not a store", edit: func(c []*prismv1.SnapshotChunk) []*prismv1.SnapshotChunk {
			// One file, well sent, that no store is made of.
			b := []byte("not a pebble")
			return []*prismv1.SnapshotChunk{
				{Manifest: &prismv1.SnapshotManifest{Files: []*prismv1.SnapshotFile{{Name: "junk", Size: int64(len(b))}}}},
				{Data: b, Eof: true, Crc32C: crc32.Checksum(b, castagnoli)},
			}
		}, want: "does not open as a store"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fs := vfs.NewMem()
			// The store to mend: m with update 1 only, and a copy staged
			// complete by an earlier run that this one replaces.
			dst, err := store.Open("dst", &store.Options{FS: fs})
			if err != nil {
				t.Fatal(err)
			}
			ingest(t, dst)
			if _, err := dst.UpsertSeq("m", "a", []int64{1}, []float32{-1, 0}, 1); err != nil {
				t.Fatal(err)
			}
			dst.Close()
			s := sliceStream(tc.edit(clone(good)))
			o := Options{FS: fs}
			if tc.free > 0 {
				o.Free = func(string) (uint64, error) { return tc.free, nil }
			}
			var last, total int64
			o.Progress = func(done, tot int64) { last, total = done, tot }
			res, err := Receive(fromSlice(&s), "dst", o)
			if tc.want != "" {
				if err == nil || !strings.Contains(err.Error(), tc.want) {
					t.Fatalf("Receive: %v, want an error with %q", err, tc.want)
				}
				if _, err := fs.Stat(fs.PathJoin("dst", store.StagedDirName, store.StagedCompleteName)); err == nil {
					t.Fatal("a refused copy is marked complete")
				}
				if got := applied(t, fs, "dst"); got != "seq 1 row1 [-1 0]" {
					t.Fatalf("the store after a refused copy: %s", got)
				}
				if tc.name == "damaged at the sender" {
					// The damaged file is not kept for a next copy to
					// take as received whole.
					names, _ := fs.List(fs.PathJoin("dst", store.StagedDirName))
					for _, n := range names {
						if strings.HasSuffix(n, ".sst") && strings.Contains(err.Error(), n) {
							t.Fatalf("the damaged %s is kept in the staged folder", n)
						}
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if last != total || total != res.Bytes || res.Files != len(good[0].Manifest.Files) {
				t.Fatalf("progress %d of %d; result %+v", last, total, res)
			}
			if len(res.Models) != 1 || res.Models[0] != (ModelState{Name: "m", Version: 1, Applied: 3}) {
				t.Fatalf("models %+v", res.Models)
			}
			if got := applied(t, fs, "dst"); got != "seq 3 row1 [3 0]" {
				t.Fatalf("the store after the copy: %s", got)
			}
		})
	}
}

// TestReceiveBusy: a second copy into a store while one holds its
// staged folder is refused, and leaves the first's files alone.
func TestReceiveBusy(t *testing.T) {
	fs := vfs.NewMem()
	good := source(t, fs)
	if err := fs.MkdirAll(fs.PathJoin("dst", store.StagedDirName), 0o755); err != nil {
		t.Fatal(err)
	}
	l, err := fs.Lock(fs.PathJoin("dst", store.StagedDirName, store.StagedLockName))
	if err != nil {
		t.Fatal(err)
	}
	s := sliceStream(clone(good))
	if _, err := Receive(fromSlice(&s), "dst", Options{FS: fs}); err == nil || !strings.Contains(err.Error(), "another prism store copy") {
		t.Fatalf("Receive while another holds the lock: %v", err)
	}
	l.Close()
	s = sliceStream(clone(good))
	if _, err := Receive(fromSlice(&s), "dst", Options{FS: fs}); err != nil {
		t.Fatalf("Receive once the lock is free: %v", err)
	}
}

// applied opens store folder db for writing (swapping a staged copy
// in) and says what it holds of m.
func applied(t *testing.T, fs vfs.FS, db string) string {
	t.Helper()
	s, err := store.Open(db, &store.Options{FS: fs, MustExist: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	seq, err := s.AppliedSeq("m")
	if err != nil {
		t.Fatal(err)
	}
	out := make([]float32, 2)
	if err := s.Lookup("m", []store.TableLookup{{Table: "a", IDs: []int64{1}, Out: out}}); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("seq %d row1 %v", seq, out)
}

// failRename fails every Rename once ok ran out.
type failRename struct {
	vfs.FS
	ok *int
}

func (f failRename) Rename(from, to string) error {
	if *f.ok == 0 {
		return errors.New("injected")
	}
	*f.ok--
	return f.FS.Rename(from, to)
}

// TestReceiveKeepsWhatIsStaged: a copy refused before its manifest (a
// wrong address, a busy or refusing sender) leaves a complete staged
// copy as it was; a copy retried over a swap cut short is refused
// without touching the staged files, and the store's next open finishes
// the swap with the whole copy.
func TestReceiveKeepsWhatIsStaged(t *testing.T) {
	fs := vfs.NewMem()
	good := source(t, fs)
	dst, err := store.Open("dst", &store.Options{FS: fs})
	if err != nil {
		t.Fatal(err)
	}
	ingest(t, dst)
	// Held open (a running worker): the copy is staged, not swapped.
	s := sliceStream(clone(good))
	if _, err := Receive(fromSlice(&s), "dst", Options{FS: fs}); err != nil {
		t.Fatal(err)
	}
	dst.Close()
	complete := fs.PathJoin("dst", store.StagedDirName, store.StagedCompleteName)
	for _, bad := range []sliceStream{nil, {{File: 3}}} {
		if _, err := Receive(fromSlice(&bad), "dst", Options{FS: fs}); err == nil {
			t.Fatal("a stream without a manifest accepted")
		}
		if _, err := fs.Stat(complete); err != nil {
			t.Fatalf("a refused stream cleared the staged copy: %v", err)
		}
	}
	ok := 4
	if _, err := store.Open("dst", &store.Options{FS: failRename{FS: fs, ok: &ok}}); err == nil {
		t.Fatal("open with failing renames succeeded")
	}
	s = sliceStream(clone(good))
	if _, err := Receive(fromSlice(&s), "dst", Options{FS: fs}); err == nil || !strings.Contains(err.Error(), "cut short") {
		t.Fatalf("a copy over a swap cut short: %v", err)
	}
	if got := applied(t, fs, "dst"); got != "seq 3 row1 [3 0]" {
		t.Fatalf("the store after the swap finished: %s", got)
	}
}

// TestReceiveRefusesNoMend: a copy of a store that marks a model
// diverged, or one lacking a model the store it replaces holds, is not
// staged (AllowDiverged takes both).
func TestReceiveRefusesNoMend(t *testing.T) {
	fs := vfs.NewMem()
	src, err := store.Open("src", &store.Options{FS: fs})
	if err != nil {
		t.Fatal(err)
	}
	ingest(t, src)
	if _, err := src.UpsertSeq("m", "a", []int64{1}, []float32{1, 0}, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := src.MarkDiverged("m", 1); err != nil {
		t.Fatal(err)
	}
	c, err := src.Checkpoint()
	if err != nil {
		t.Fatal(err)
	}
	diverged := chunksOf(t, fs, c, 1000)
	c.Close()
	src.Close()
	s := sliceStream(clone(diverged))
	if _, err := Receive(fromSlice(&s), "d1", Options{FS: fs}); err == nil || !strings.Contains(err.Error(), "itself diverged") {
		t.Fatalf("a diverged copy: %v", err)
	}
	s = sliceStream(clone(diverged))
	if _, err := Receive(fromSlice(&s), "d1", Options{FS: fs, AllowDiverged: true}); err != nil {
		t.Fatalf("a diverged copy, allowed: %v", err)
	}

	good := source(t, vfs.NewMem())
	d2, err := store.Open("d2", &store.Options{FS: fs})
	if err != nil {
		t.Fatal(err)
	}
	ingest(t, d2)
	if _, err := d2.Ingest(context.Background(), testPlan(t), store.IngestOptions{Model: "other"}); err != nil {
		t.Fatal(err)
	}
	d2.Close()
	s = sliceStream(clone(good))
	res, err := Receive(fromSlice(&s), "d2", Options{FS: fs})
	if err == nil || !strings.Contains(err.Error(), "lacks model(s) other") || len(res.Replacing) != 2 {
		t.Fatalf("a copy lacking a model: %v (replacing %+v)", err, res.Replacing)
	}
}

// TestReceiveRate: a copy's rate goes to the sender, which paces its
// reads (SnapshotRequest.rate; TestPacer).
func TestReceiveRate(t *testing.T) {
	good := source(t, vfs.NewMem())
	var asked []*prismv1.SnapshotRequest
	if _, err := Receive(honoring(good, &asked), "dst", Options{FS: vfs.NewMem(), Rate: 200 << 20}); err != nil {
		t.Fatal(err)
	}
	if len(asked) != 1 || asked[0].GetRate() != 200<<20 {
		t.Fatalf("asked %v, want one request with rate %d", asked, 200<<20)
	}
}

// honoring is an Open that answers as a worker does: good's chunks, but
// each file the request's have holds as it is (name, size, CRC-32C)
// marked reused instead of sent.
func honoring(good []*prismv1.SnapshotChunk, asked *[]*prismv1.SnapshotRequest) Open {
	return func(req *prismv1.SnapshotRequest) (Stream, error) {
		if asked != nil {
			*asked = append(*asked, req)
		}
		have := map[string]*prismv1.SnapshotFile{}
		for _, h := range req.GetHave() {
			have[h.GetName()] = h
		}
		m := good[0].GetManifest()
		out := sliceStream{good[0]}
		for i, f := range m.GetFiles() {
			var chunks []*prismv1.SnapshotChunk
			var data []byte
			for _, c := range good[1:] {
				if c.GetFile() == int32(i) {
					chunks = append(chunks, c)
					data = append(data, c.GetData()...)
				}
			}
			sum := crc32.Checksum(data, castagnoli)
			if h := have[f.GetName()]; h != nil && h.GetSize() == f.GetSize() && h.GetCrc32C() == sum {
				out = append(out, &prismv1.SnapshotChunk{File: int32(i), Eof: true, Crc32C: sum, Reused: true})
				continue
			}
			out = append(out, chunks...)
		}
		s := sliceStream(clone(out))
		return &s, nil
	}
}

// failSync fails the Sync of files named name.
type failSync struct {
	vfs.FS
	name string
}

type failSyncFile struct{ vfs.File }

func (failSyncFile) Sync() error { return errors.New("injected sync failure") }

func (f failSync) Create(path string, c vfs.DiskWriteCategory) (vfs.File, error) {
	w, err := f.FS.Create(path, c)
	if err == nil && filepath.Base(path) == f.name {
		return failSyncFile{w}, nil
	}
	return w, err
}

// TestReceiveResumes: a copy run again over one a failed sync cut
// short keeps the files it left (the sender is told them and sends
// none of them again), needs disk only for what it still lacks, and
// syncs a kept file before the copy counts as complete: a crash then
// (every unsynced write lost) leaves a whole copy.
func TestReceiveResumes(t *testing.T) {
	good := source(t, vfs.NewMem())
	files := good[0].GetManifest().GetFiles()
	var victim string // the last file with bytes, cut before its sync
	for _, f := range files {
		if f.GetSize() > 0 {
			victim = f.GetName()
		}
	}
	mem := vfs.NewCrashableMem()
	if _, err := Receive(honoring(good, nil), "dst", Options{FS: failSync{FS: mem, name: victim}}); err == nil || !strings.Contains(err.Error(), "injected sync failure") {
		t.Fatalf("first copy: %v", err)
	}
	var asked []*prismv1.SnapshotRequest
	res, err := Receive(honoring(good, &asked), "dst", Options{FS: mem, Free: func(string) (uint64, error) { return 0, nil }})
	if err != nil {
		t.Fatalf("the copy run again, with no disk to spare: %v", err)
	}
	if len(asked) != 1 || len(asked[0].GetHave()) == 0 || res.Reused != len(asked[0].GetHave()) {
		t.Fatalf("asked with %d files held, %d kept", len(asked[0].GetHave()), res.Reused)
	}
	crashed := mem.CrashClone(vfs.CrashCloneCfg{})
	if _, err := crashed.Stat(crashed.PathJoin("dst", store.StagedDirName, store.StagedCompleteName)); err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		st, err := crashed.Stat(crashed.PathJoin("dst", store.StagedDirName, f.GetName()))
		if err != nil || st.Size() != f.GetSize() {
			t.Fatalf("after a crash, the complete copy's %s: %v (%d of %d bytes)", f.GetName(), err, st.Size(), f.GetSize())
		}
	}
}

// TestDropIncomplete: a copy cut short that no run goes on with is
// dropped (its bytes would stay on a volume sized for one store); a
// complete one, which the next open swaps in, is not; one another copy
// holds is an error.
func TestDropIncomplete(t *testing.T) {
	fs := vfs.NewMem()
	if dropped, err := DropIncomplete("dst", fs); err != nil || dropped {
		t.Fatalf("nothing staged: %v, %v", dropped, err)
	}
	good := source(t, fs)
	s := sliceStream(clone(good[:len(good)/2]))
	if _, err := Receive(fromSlice(&s), "dst", Options{FS: fs}); err == nil {
		t.Fatal("half a stream accepted")
	}
	l, err := fs.Lock(fs.PathJoin("dst", store.StagedDirName, store.StagedLockName))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := DropIncomplete("dst", fs); err == nil {
		t.Fatal("dropped a copy another holds")
	}
	l.Close()
	if dropped, err := DropIncomplete("dst", fs); err != nil || !dropped {
		t.Fatalf("an incomplete copy: %v, %v", dropped, err)
	}
	if _, err := fs.Stat(fs.PathJoin("dst", store.StagedDirName)); err == nil {
		t.Fatal("the incomplete copy is still there")
	}
	s = sliceStream(clone(good))
	if _, err := Receive(fromSlice(&s), "dst", Options{FS: fs}); err != nil {
		t.Fatal(err)
	}
	if dropped, err := DropIncomplete("dst", fs); err != nil || dropped {
		t.Fatalf("a complete copy: %v, %v", dropped, err)
	}
}

// TestReceiveAccept: a copy its caller's Accept refuses is left
// incomplete (no open swaps it in) with its files, which the next copy
// names as held; a Receive whose Context has ended reads nothing of
// them.
func TestReceiveAccept(t *testing.T) {
	fs := vfs.NewMem()
	good := source(t, fs)
	s := sliceStream(clone(good))
	var judged Result
	_, err := Receive(fromSlice(&s), "dst", Options{FS: fs, Accept: func(r Result) error {
		judged = r
		return errors.New("lacks model x")
	}})
	if err == nil || !strings.Contains(err.Error(), "not taken: lacks model x") {
		t.Fatalf("a copy refused by Accept: %v", err)
	}
	if len(judged.Models) != 1 || judged.Models[0].Name != "m" || judged.Models[0].Applied != 3 {
		t.Fatalf("Accept judged %+v", judged.Models)
	}
	staged := fs.PathJoin("dst", store.StagedDirName)
	if _, err := fs.Stat(fs.PathJoin(staged, store.StagedCompleteName)); err == nil {
		t.Fatal("a refused copy is marked complete")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	s = sliceStream(clone(good))
	if _, err := Receive(fromSlice(&s), "dst", Options{FS: fs, Context: ctx}); !errors.Is(err, context.Canceled) {
		t.Fatalf("a Receive whose context ended: %v", err)
	}
	var req *prismv1.SnapshotRequest
	s = sliceStream(clone(good))
	res, err := Receive(func(r *prismv1.SnapshotRequest) (Stream, error) { req = r; return &s, nil }, "dst", Options{FS: fs})
	if err != nil {
		t.Fatal(err)
	}
	if len(req.GetHave()) != res.Files {
		t.Fatalf("the next copy named %d files it holds, want the refused copy's %d", len(req.GetHave()), res.Files)
	}
	if _, err := fs.Stat(fs.PathJoin(staged, store.StagedCompleteName)); err != nil {
		t.Fatalf("the next copy is not complete: %v", err)
	}
}

// TestReceiveRefusesOtherShard: a copy into a store holding shard k of
// a sharding must hold that shard of that sharding: another shard, or
// the same shard number of the plan sharded again (other rows under
// it), is refused naming both, unless allowed; the same shard is
// taken.
func TestReceiveRefusesOtherShard(t *testing.T) {
	sharded := func(reverse bool) string {
		dir := testPlan(t)
		p, err := plan.Read(dir)
		if err != nil {
			t.Fatal(err)
		}
		r, err := sharding.Plan(sharding.Tables(p, nil), sharding.Options{Shards: 2, ShardBytes: 40})
		if err != nil {
			t.Fatal(err)
		}
		if p.Sharding, err = sharding.Section(p, r, "uniform"); err != nil {
			t.Fatal(err)
		}
		if tp := p.Sharding.Tables[0]; tp.Placement != plan.RowWise || len(tp.Shards) != 2 {
			t.Fatalf("table a placed %+v, want row-wise over both shards", tp)
		} else if reverse {
			slices.Reverse(tp.Shards)
		}
		if err := plan.Write(dir, p); err != nil {
			t.Fatal(err)
		}
		return dir
	}
	planA, planB := sharded(false), sharded(true)
	fs := vfs.NewMem()
	stream := func(name, dir string, shard int) []*prismv1.SnapshotChunk {
		s, err := store.Open(name, &store.Options{FS: fs})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if _, err := s.Ingest(context.Background(), dir, store.IngestOptions{Shard: &shard}); err != nil {
			t.Fatal(err)
		}
		if name != "src" {
			return nil
		}
		c, err := s.Checkpoint()
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		return chunksOf(t, fs, c, 1000)
	}
	for _, tc := range []struct {
		name  string
		plan  string
		shard int
		want  string
	}{
		{"same shard", planA, 1, ""},
		{"other shard", planA, 0, "m shard 1/2 (the copy holds shard 0/2)"},
		{"other sharding", planB, 1, "of sharding"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_ = fs.RemoveAll("src")
			_ = fs.RemoveAll("dst")
			good := stream("src", tc.plan, tc.shard)
			stream("dst", planA, 1)
			s := sliceStream(clone(good))
			res, err := Receive(fromSlice(&s), "dst", Options{FS: fs})
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Receive: %v (copy %+v, replacing %+v), want an error with %q", err, res.Models, res.Replacing, tc.want)
			}
			s = sliceStream(clone(good))
			if _, err := Receive(fromSlice(&s), "dst", Options{FS: fs, AllowDiverged: true}); err != nil {
				t.Fatalf("allowed: %v", err)
			}
		})
	}
}
