// Package storecopy receives a copy of a serving embedding worker's
// store (prismv1.EmbeddingTier/Snapshot) into another worker's store
// folder: prism store copy, the mend for a worker whose copy of a model
// diverged from its peers' or fell further behind than the router's
// update log reaches.
//
// The copy is written into the folder's staged copy (store.StagedDir),
// each file checked against the manifest's size and its CRC-32C,
// synced, and opened as a store (read-only) before it is marked
// complete; the store's next open for writing swaps it in (see
// cpuserve/store/snapshot.go), at once when no process holds the
// store, else at its worker's restart. A copy cut short leaves an
// incomplete staged folder, which no open swaps in and the next copy
// replaces: the store it was meant to mend is untouched until then.
package storecopy

import (
	"context"
	"errors"
	"fmt"
	"io"
	iofs "io/fs"
	"strings"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/cpuserve/store"
	"github.com/prism-serve/prism/internal/pebblecheck"
)

// MaxFiles bounds a manifest: a store of that many files is not one
// Pebble keeps (its files are 64 MiB and up once compacted).
const MaxFiles = 1 << 20

// Stream is the receiving end of a Snapshot call.
type Stream interface {
	Recv() (*prismv1.SnapshotChunk, error)
}

// Options are a Receive's.
type Options struct {
	// FS is where the store folder is (vfs.Default when nil).
	FS vfs.FS
	// Progress, if set, is called as bytes arrive: done of total (the
	// bytes of files kept from an earlier copy count as they are kept).
	Progress func(done, total int64)
	// Check, if set, is called as the files an earlier copy left in the
	// staged folder are read for their checksums: done of total.
	Check func(done, total int64)
	// Verify, if set, is called as the copy's table files are read back
	// for their blocks' checksums, once all are in: done of total.
	Verify func(done, total int64)
	// Free, if set, is the bytes free on the store folder's disk; the
	// copy is refused when the manifest's bytes do not fit (nil: asked
	// of FS).
	Free func(dir string) (uint64, error)
	// Rate, if positive (at least MinRate), bounds the sender's reads of
	// its files for the copy to that many bytes a second
	// (SnapshotRequest.rate: the sender paces them).
	Rate int64
	// Accept, if set, judges the copy received (its models: Result)
	// before it is marked complete: an error refuses it, and it is left
	// incomplete (its files kept for the next copy), so no open swaps it
	// in. A worker mending itself checks the copy holds what it must.
	Accept func(Result) error
	// Context, if set, ends a Receive early (its checksums of what an
	// earlier copy left, which may be a whole store): the stream's own
	// context ends the rest.
	Context context.Context
	// AllowDiverged takes a copy whose own store marks a model
	// diverged (refused otherwise: it would not mend anything), and
	// one lacking a model the store it replaces holds, or holding
	// another shard of it (another number, or the same number of
	// another sharding).
	AllowDiverged bool
}

// ModelState is what the received copy holds of one model.
type ModelState struct {
	Name    string
	Version int
	// Applied is the last update the copy holds (0: none).
	Applied int64
	// Diverged is the update at which the copy's own mark says it
	// diverged (0: none): a copy of a store that is itself diverged.
	Diverged int64
	// Shard of Shards is the shard of a sharded model's tables the copy
	// holds (Shards 0: the whole model).
	Shard, Shards int
	// Sharding is the fingerprint of the sharding the copy's shard was
	// ingested for ("" for the whole model, or a store of an earlier
	// release): a plan sharded again into as many shards places other
	// tables and rows under the same shard number.
	Sharding string
}

// Result is what Receive did.
type Result struct {
	// Source is the store folder the worker named (its manifest).
	Source string
	Files  int
	Bytes  int64
	Models []ModelState
	// Staged is the folder holding the complete copy
	// (store.StagedDirName in the store folder).
	Staged string
	// Replacing is what the store being replaced holds, when it could
	// be read (no process holding it); nil otherwise.
	Replacing []ModelState
	// Reused is the files (and their bytes) kept from an earlier copy,
	// not sent again.
	Reused      int
	ReusedBytes int64
}

// Open starts the Snapshot call with req (prismv1's
// EmbeddingTierClient.Snapshot, in a closure).
type Open func(req *prismv1.SnapshotRequest) (Stream, error)

// Receive writes the copy a Snapshot call (started by open) sends into
// store folder dst's staged copy and marks it complete; it does not
// swap it in. dst is made if missing. A copy already staged (complete or
// not) is replaced, but its files that the new copy has too (same name,
// size and checksum: an SST the sender still holds) are kept, not sent
// again (a copy cut short goes on where it stopped). One another Receive
// is writing is an error, as is a swap under way.
func Receive(open Open, dst string, o Options) (Result, error) {
	fs := o.FS
	if fs == nil {
		fs = vfs.Default
	}
	staged := fs.PathJoin(dst, store.StagedDirName)
	if err := fs.MkdirAll(staged, 0o755); err != nil {
		return Result{}, fmt.Errorf("copy into %s: %w", dst, err)
	}
	// The staged folder's own entry (and the store folder's, made here
	// when missing) outlive a crash, as the files in it will.
	for _, d := range []string{fs.PathDir(dst), dst} {
		if err := store.SyncDir(fs, d); err != nil {
			return Result{}, fmt.Errorf("copy into %s: %w", dst, err)
		}
	}
	lock, err := fs.Lock(fs.PathJoin(staged, store.StagedLockName))
	if err != nil {
		return Result{}, fmt.Errorf("copy into %s: could not take the copy's lock (another prism store copy writing there, or the store swapping a staged copy in): %w", dst, err)
	}
	defer lock.Close()
	if _, err := fs.Stat(fs.PathJoin(dst, store.SwapJournalName)); err == nil {
		return Result{}, fmt.Errorf("copy into %s: the store holds a swap of a staged copy cut short; open the store (start its worker, or prism store versions MODEL --db %s) to finish it first", dst, dst)
	}
	res := Result{Staged: staged}
	// What the store being replaced holds, if no process holds it.
	res.Replacing, _ = inspect(fs, dst)
	ctx := o.Context
	if ctx == nil {
		ctx = context.Background()
	}
	have, err := held(ctx, fs, staged, o.Check)
	if err != nil {
		return res, fmt.Errorf("copy into %s: read what an earlier copy left: %w", dst, err)
	}
	stream, err := open(&prismv1.SnapshotRequest{Have: have, Rate: o.Rate})
	if err != nil {
		return res, fmt.Errorf("copy into %s: %w", dst, err)
	}
	first, err := stream.Recv()
	if err != nil {
		return res, fmt.Errorf("copy into %s: %w", dst, err)
	}
	m := first.GetManifest()
	if m == nil {
		return res, fmt.Errorf("copy into %s: the stream did not start with a manifest", dst)
	}
	files, total, err := checkManifest(m)
	if err != nil {
		return res, fmt.Errorf("copy into %s: %w", dst, err)
	}
	// Not complete from here on, whatever was staged before (a sender
	// that refused, or a wrong address, left it as it was); what the
	// new copy does not name goes.
	keep := map[string]bool{}
	for _, f := range files {
		keep[f.GetName()] = true
	}
	if err := clearStaged(fs, staged, keep); err != nil {
		return res, fmt.Errorf("copy into %s: clear the copy staged before: %w", dst, err)
	}
	res.Source, res.Files, res.Bytes = m.GetStore(), len(files), total
	free := o.Free
	if free == nil {
		free = func(dir string) (uint64, error) {
			u, err := fs.GetDiskUsage(dir)
			return u.AvailBytes, err
		}
	}
	haveOf := map[string]*prismv1.SnapshotFile{}
	for _, h := range have {
		haveOf[h.GetName()] = h
	}
	// What the disk must still take: a file staged already under a name
	// is rewritten in its place, or kept.
	var need int64
	for _, f := range files {
		need += max(0, f.GetSize()-haveOf[f.GetName()].GetSize())
	}
	if avail, err := free(staged); err == nil && uint64(need) > avail {
		return res, fmt.Errorf("copy into %s: the copy needs %d more bytes and the disk has %d free", dst, need, avail)
	}
	var done int64
	for i, f := range files {
		if err := receiveFile(stream, fs, staged, int32(i), f, haveOf[f.GetName()], &res, func(n int64) {
			done += n
			if o.Progress != nil {
				o.Progress(done, total)
			}
		}); err != nil {
			return res, fmt.Errorf("copy into %s: %s: %w", dst, f.GetName(), err)
		}
	}
	if extra, err := stream.Recv(); err != io.EOF {
		if err == nil {
			return res, fmt.Errorf("copy into %s: the stream goes on past its manifest's files (file %d)", dst, extra.GetFile())
		}
		return res, fmt.Errorf("copy into %s: %w", dst, err)
	}
	if err := store.SyncDir(fs, staged); err != nil {
		return res, fmt.Errorf("copy into %s: %w", dst, err)
	}
	// Each file's checksum above is of its bytes as the sender read
	// them: a block damaged on the sender's disk (bit rot its own reads
	// have not reached yet) came with it, and opening a store reads few
	// blocks. Every block is read back here, before the copy can count
	// as complete.
	damaged, err := pebblecheck.Tables(ctx, fs, staged, o.Verify)
	if ctx.Err() != nil {
		return res, fmt.Errorf("copy into %s: %w", dst, ctx.Err())
	} else if err != nil {
		return res, fmt.Errorf("copy into %s: check the copy's table files: %w", dst, err)
	}
	if len(damaged) > 0 {
		// Not kept for a next copy to take as received whole.
		for _, d := range damaged {
			_ = fs.Remove(d.Path)
		}
		return res, fmt.Errorf("copy into %s: %w%s; the store copied (%s) holds the damage, unless a file kept from an earlier copy was damaged here: nothing staged, copy another worker (and mend that one)", dst, damaged[0], more(len(damaged)-1), res.Source)
	}
	if res.Models, err = inspect(fs, staged); err != nil {
		return res, fmt.Errorf("copy into %s: the copy received does not open as a store: %w", dst, err)
	}
	if err := mends(res, o.AllowDiverged); err != nil {
		return res, fmt.Errorf("copy into %s: %w; nothing staged (--allow-diverged takes it anyway)", dst, err)
	}
	if o.Accept != nil {
		if err := o.Accept(res); err != nil {
			return res, fmt.Errorf("copy into %s: not taken: %w; nothing staged", dst, err)
		}
	}
	c, err := fs.Create(fs.PathJoin(staged, store.StagedCompleteName), vfs.WriteCategoryUnspecified)
	if err != nil {
		return res, fmt.Errorf("copy into %s: %w", dst, err)
	}
	if err := c.Sync(); err != nil {
		c.Close()
		return res, fmt.Errorf("copy into %s: %w", dst, err)
	}
	if err := c.Close(); err != nil {
		return res, fmt.Errorf("copy into %s: %w", dst, err)
	}
	if err := store.SyncDir(fs, staged); err != nil {
		return res, fmt.Errorf("copy into %s: %w", dst, err)
	}
	return res, nil
}

// more is " (and n more)" when n > 0.
func more(n int) string {
	if n == 0 {
		return ""
	}
	return fmt.Sprintf(" (and %d more)", n)
}

// clearStaged removes what the staged folder holds but its lock and
// the files keep names, the complete mark first.
func clearStaged(fs vfs.FS, staged string, keep map[string]bool) error {
	if err := fs.Remove(fs.PathJoin(staged, store.StagedCompleteName)); err != nil && !errors.Is(err, iofs.ErrNotExist) {
		return err
	}
	if err := store.SyncDir(fs, staged); err != nil {
		return err
	}
	names, err := fs.List(staged)
	if err != nil {
		return err
	}
	for _, n := range names {
		if n == store.StagedLockName || keep[n] {
			continue
		}
		if err := fs.RemoveAll(fs.PathJoin(staged, n)); err != nil {
			return err
		}
	}
	return nil
}

// mends refuses a copy that would not mend the store: one whose own
// marks say a model diverged, or one lacking a model the store it
// replaces holds or holding another shard of it (another shard's
// worker, a worker of the plan sharded again, another model set),
// unless allowed.
func mends(res Result, allow bool) error {
	if allow {
		return nil
	}
	held := map[string]ModelState{}
	for _, m := range res.Models {
		held[m.Name] = m
		if m.Diverged > 0 {
			return fmt.Errorf("the worker copied is itself diverged: its store marks %s diverged at update %d (copy a worker prism status shows serving)", m.Name, m.Diverged)
		}
	}
	var lacking []string
	for _, m := range res.Replacing {
		c, ok := held[m.Name]
		switch {
		case !ok:
			lacking = append(lacking, m.Name)
		case c.Shard != m.Shard || c.Shards != m.Shards:
			lacking = append(lacking, fmt.Sprintf("%s %s (the copy holds %s)", m.Name, shardName(m.Shard, m.Shards), shardName(c.Shard, c.Shards)))
		case m.Sharding != "" && c.Sharding != "" && m.Sharding != c.Sharding:
			lacking = append(lacking, fmt.Sprintf("%s %s of sharding %s (the copy holds that shard of sharding %s)", m.Name, shardName(m.Shard, m.Shards), m.Sharding, c.Sharding))
		}
	}
	if len(lacking) > 0 {
		return fmt.Errorf("the copy lacks model(s) %s, which the store it replaces holds (copy a worker serving the same models, and shards)", strings.Join(lacking, ", "))
	}
	return nil
}

// shardName names shard k of n ("the whole model" when n is 0).
func shardName(k, n int) string {
	if n == 0 {
		return "the whole model"
	}
	return fmt.Sprintf("shard %d/%d", k, n)
}

// checkManifest refuses a manifest whose names could leave the staged
// folder, repeat, or clash with the copy's own files.
func checkManifest(m *prismv1.SnapshotManifest) ([]*prismv1.SnapshotFile, int64, error) {
	files := m.GetFiles()
	if len(files) == 0 {
		return nil, 0, errors.New("the manifest lists no files")
	}
	if len(files) > MaxFiles {
		return nil, 0, fmt.Errorf("the manifest lists %d files, more than %d", len(files), MaxFiles)
	}
	seen := make(map[string]bool, len(files))
	var total int64
	for _, f := range files {
		n := f.GetName()
		if n == "" || n == "." || n == ".." || len(n) > 255 || strings.ContainsAny(n, "/\\\x00") {
			return nil, 0, fmt.Errorf("the manifest names a file %q: not a file name", n)
		}
		if store.ReservedName(n) {
			return nil, 0, fmt.Errorf("the manifest names a file %q, a name the copy or the store keeps for itself", n)
		}
		if seen[n] {
			return nil, 0, fmt.Errorf("the manifest names %q twice", n)
		}
		seen[n] = true
		if f.GetSize() < 0 || total+f.GetSize() < total {
			return nil, 0, fmt.Errorf("the manifest gives %q %d bytes", n, f.GetSize())
		}
		total += f.GetSize()
	}
	return files, total, nil
}

// receiveFile writes file i of the manifest from its chunks, or keeps
// the one an earlier copy left (had, the caller's SnapshotRequest.have
// entry of its name) when the sender says it is that file.
func receiveFile(stream Stream, fs vfs.FS, dir string, i int32, f *prismv1.SnapshotFile, had *prismv1.SnapshotFile, res *Result, progress func(n int64)) error {
	first, err := stream.Recv()
	if err == io.EOF {
		return fmt.Errorf("the stream ended at byte 0 of %d", f.GetSize())
	} else if err != nil {
		return err
	}
	if first.GetReused() {
		switch {
		case first.GetFile() != i:
			return fmt.Errorf("a chunk of file %d where file %d's were due", first.GetFile(), i)
		case had == nil || had.GetSize() != f.GetSize() || had.GetCrc32C() != first.GetCrc32C() || len(first.GetData()) > 0 || !first.GetEof():
			return errors.New("the sender kept a file this copy does not hold as it says")
		}
		// Synced before the copy counts as complete: the copy that left
		// it may have died before its sync (its bytes only in the page
		// cache, which held for the checksum).
		k, err := fs.Open(fs.PathJoin(dir, f.GetName()))
		if err != nil {
			return err
		}
		err = k.Sync()
		if cerr := k.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
		res.Reused++
		res.ReusedBytes += f.GetSize()
		progress(f.GetSize())
		return nil
	}
	w, err := fs.Create(fs.PathJoin(dir, f.GetName()), vfs.WriteCategoryUnspecified)
	if err != nil {
		return err
	}
	closed := false
	defer func() {
		if !closed {
			w.Close()
		}
	}()
	var off int64
	var sum uint32
	for c := first; ; {
		switch {
		case c.GetManifest() != nil:
			return errors.New("a second manifest")
		case c.GetFile() != i:
			return fmt.Errorf("a chunk of file %d where file %d's were due", c.GetFile(), i)
		case c.GetOffset() != off:
			return fmt.Errorf("a chunk at byte %d where byte %d was due", c.GetOffset(), off)
		case off+int64(len(c.GetData())) > f.GetSize():
			return fmt.Errorf("chunks past the manifest's %d bytes", f.GetSize())
		}
		// Summed before the write: a writer may scribble on what it was
		// given (Pebble's in-memory files do, in race builds).
		sum = CRC32C(sum, c.GetData())
		if _, err := w.Write(c.GetData()); err != nil {
			return err
		}
		off += int64(len(c.GetData()))
		progress(int64(len(c.GetData())))
		if !c.GetEof() {
			if c, err = stream.Recv(); err == io.EOF {
				return fmt.Errorf("the stream ended at byte %d of %d", off, f.GetSize())
			} else if err != nil {
				return err
			}
			continue
		}
		if off != f.GetSize() {
			return fmt.Errorf("the file ended at byte %d of %d", off, f.GetSize())
		}
		if sum != c.GetCrc32C() {
			return fmt.Errorf("checksum %08x, the sender's %08x: corrupted on the way", sum, c.GetCrc32C())
		}
		if err := w.Sync(); err != nil {
			return err
		}
		closed = true
		return w.Close()
	}
}

// inspect opens the store in dir read-only and says what it holds
// (an error when there is none, or a process holds it).
func inspect(fs vfs.FS, dir string) ([]ModelState, error) {
	s, err := store.Open(dir, &store.Options{FS: fs, HotBytes: -1, MustExist: true, ReadOnly: true})
	if err != nil {
		return nil, err
	}
	defer s.Close()
	marks, err := s.Diverged()
	if err != nil {
		return nil, err
	}
	var out []ModelState
	for _, name := range s.Models() {
		seq, err := s.AppliedSeq(name)
		if err != nil {
			return nil, err
		}
		ref, sharded, err := s.Shard(name)
		if err != nil {
			return nil, err
		}
		ms := ModelState{Name: name, Version: s.ActiveVersion(name), Applied: seq, Diverged: marks[name]}
		if sharded {
			ms.Shard, ms.Shards, ms.Sharding = ref.Shard, ref.Shards, ref.Sharding
		}
		out = append(out, ms)
	}
	return out, nil
}

// held lists the files an earlier copy left in the staged folder, each
// with its size and checksum (read whole: check reports the bytes).
func held(ctx context.Context, fs vfs.FS, staged string, check func(done, total int64)) ([]*prismv1.SnapshotFile, error) {
	names, err := fs.List(staged)
	if err != nil {
		return nil, err
	}
	var out []*prismv1.SnapshotFile
	var total, done int64
	for _, n := range names {
		if store.ReservedName(n) {
			continue
		}
		st, err := fs.Stat(fs.PathJoin(staged, n))
		if err != nil || st.IsDir() {
			continue // not offered: the copy clears or rewrites it
		}
		out = append(out, &prismv1.SnapshotFile{Name: n, Size: st.Size()})
		total += st.Size()
	}
	buf := make([]byte, 1<<20)
	readable := out[:0]
	for _, f := range out {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		sum, n, err := checksum(ctx, fs, fs.PathJoin(staged, f.Name), buf, func(n int) {
			done += int64(n)
			if check != nil {
				check(done, total)
			}
		})
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if err != nil || n != f.Size {
			continue // unreadable (or changed): not offered
		}
		f.Crc32C = sum
		readable = append(readable, f)
	}
	return readable, nil
}

// checksum reads file path whole: its CRC-32C and length; it stops when
// ctx ends.
func checksum(ctx context.Context, fs vfs.FS, path string, buf []byte, read func(int)) (uint32, int64, error) {
	r, err := fs.Open(path)
	if err != nil {
		return 0, 0, err
	}
	defer r.Close()
	return Checksum(ctxReader{ctx, r}, buf, read)
}

// ctxReader is r until ctx ends.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// DropIncomplete removes the staged copy in store folder dst unless it
// is complete (the store's next open swaps that one in): a copy cut
// short that no run will go on with, which would keep its bytes on a
// volume sized for one store. It holds the copy's lock meanwhile
// (another copy writing there is an error); false when there was none
// to drop. fs nil: vfs.Default.
func DropIncomplete(dst string, fs vfs.FS) (bool, error) {
	if fs == nil {
		fs = vfs.Default
	}
	staged := fs.PathJoin(dst, store.StagedDirName)
	if _, err := fs.Stat(staged); err != nil {
		return false, nil
	}
	if _, err := fs.Stat(fs.PathJoin(staged, store.StagedCompleteName)); err == nil {
		return false, nil
	}
	lock, err := fs.Lock(fs.PathJoin(staged, store.StagedLockName))
	if err != nil {
		return false, fmt.Errorf("drop the incomplete copy in %s: could not take the copy's lock (another prism store copy writing there?): %w", staged, err)
	}
	defer lock.Close()
	if _, err := fs.Stat(fs.PathJoin(staged, store.StagedCompleteName)); err == nil {
		return false, nil // completed meanwhile
	}
	if err := fs.RemoveAll(staged); err != nil {
		return false, fmt.Errorf("drop the incomplete copy in %s: %w", staged, err)
	}
	return true, store.SyncDir(fs, dst)
}
