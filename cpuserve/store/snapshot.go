package store

import (
	"errors"
	"fmt"
	"io"
	iofs "io/fs"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// A store is copied whole from a serving worker to mend another's (one
// whose copy of a model diverged from its peers', or that fell further
// behind than the router's update log reaches):
//
//  1. the serving worker takes a Pebble checkpoint (Checkpoint: hard
//     links to its immutable files, the live ones copied, at one
//     instant) under its folder and streams its files
//     (prismv1.EmbeddingTier/Snapshot);
//  2. prism store copy writes them into StagedDir of the store it
//     mends, a folder inside it, checks each file's size and checksum,
//     opens what it wrote as a store, and only then marks it complete
//     (StagedComplete);
//  3. the next Open for writing of that store swaps the complete copy in
//     (swapStaged): the store's own files move into a folder
//     "replaced-<time>" inside it (kept: nothing is lost; the operator
//     removes it), the copy's files move up. Each step is a rename
//     within the folder, so a folder that is a volume's mount point (a
//     Kubernetes PersistentVolume) works, and a journal file makes the
//     swap finish after a crash halfway (Open redoes the phase it
//     records).
//
// The copy command swaps at once when no process holds the store; with
// its worker running it stages the copy, and the worker's restart
// swaps it in.

const (
	// checkpointPrefix names the folders a Checkpoint writes in the
	// store's folder; Open removes any (a process that died sending one).
	checkpointPrefix = "copy-out-"
	// stagedDir is the folder prism store copy writes a copy into.
	stagedDir = "copy-in"
	// stagedComplete, in stagedDir, says the copy is whole and checked.
	stagedComplete = "COMPLETE"
	// stagedLock, in stagedDir, is the file a copy under way holds
	// locked, so a second one into the same store fails.
	stagedLock = "copy.lock"
	// swapJournal records a swap under way: its phase and the folder
	// the store's own files move to.
	swapJournal = "copy-swap"
	// replacedPrefix names the folders a swap moves a store's files to.
	replacedPrefix = "replaced-"
	// mendStamp records when a worker mending itself last staged a copy
	// (RecordMend); the swap leaves it in place.
	mendStamp = "copy-mended"
	// lockFile is Pebble's lock, which stays where it is.
	lockFile = "LOCK"
)

// ErrCheckpointBusy is returned by Checkpoint while another one is open.
var ErrCheckpointBusy = errors.New("a copy of this store is being sent already; one at a time")

// The names prism store copy (cpuserve/storecopy) writes under.
const (
	StagedDirName      = stagedDir
	StagedCompleteName = stagedComplete
	StagedLockName     = stagedLock
	SwapJournalName    = swapJournal
)

// CheckpointFile is one file of a Checkpoint: its name in Dir and size.
type CheckpointFile struct {
	Name string
	Size int64
}

// Checkpoint is a consistent copy of the store in a folder of its own,
// open until Close removes it.
type Checkpoint struct {
	Dir   string
	Files []CheckpointFile
	fs    vfs.FS
	busy  *atomic.Bool
}

// Open opens one of the checkpoint's files for reading.
func (c *Checkpoint) Open(name string) (vfs.File, error) {
	return c.fs.Open(c.fs.PathJoin(c.Dir, name))
}

// Close removes the checkpoint's folder.
func (c *Checkpoint) Close() error {
	if c.busy == nil {
		return nil
	}
	err := c.fs.RemoveAll(c.Dir)
	c.busy.Store(false)
	c.busy = nil
	return err
}

// Checkpoint takes a consistent copy of the whole store (every model,
// version, applied update, mark and warm-restart snapshot at one
// instant) into a folder inside the store's: Pebble's checkpoint, whose
// immutable files are hard links (a copy where the file system has
// none), after syncing its write-ahead log. One at a time
// (ErrCheckpointBusy): a checkpoint keeps files a compaction has
// replaced on the disk while it is open.
func (s *Store) Checkpoint() (*Checkpoint, error) {
	if err := s.enter(); err != nil {
		return nil, err
	}
	defer s.ops.Done()
	if !s.checkpointing.CompareAndSwap(false, true) {
		return nil, ErrCheckpointBusy
	}
	fs := s.opts.FS
	s.checkpointN++
	dir := fs.PathJoin(s.dir, fmt.Sprintf("%s%d", checkpointPrefix, s.checkpointN))
	c := &Checkpoint{Dir: dir, fs: fs, busy: &s.checkpointing}
	_ = fs.RemoveAll(dir)
	if err := s.db.Checkpoint(dir, pebble.WithFlushedWAL()); err != nil {
		c.Close()
		return nil, fmt.Errorf("checkpoint store %q: %w", s.dir, err)
	}
	names, err := fs.List(dir)
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("checkpoint store %q: %w", s.dir, err)
	}
	slices.Sort(names)
	for _, n := range names {
		st, err := fs.Stat(fs.PathJoin(dir, n))
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("checkpoint store %q: %w", s.dir, err)
		}
		if st.IsDir() {
			continue
		}
		c.Files = append(c.Files, CheckpointFile{Name: n, Size: st.Size()})
	}
	return c, nil
}

// removeCheckpoints removes the checkpoints a process that died while
// sending one left in store folder dir.
func removeCheckpoints(fs vfs.FS, dir string) {
	names, _ := fs.List(dir)
	for _, n := range names {
		if strings.HasPrefix(n, checkpointPrefix) {
			_ = fs.RemoveAll(fs.PathJoin(dir, n))
		}
	}
}

// Dir is the store's folder.
func (s *Store) Dir() string { return s.dir }

// SwapReport is what Open's swap of a staged copy did.
type SwapReport struct {
	// Replaced is the folder, inside the store's, that holds the
	// store's files from before the swap; "" when the folder held no
	// store (a new replica's first copy).
	Replaced string
	// Files is the copy's files moved in.
	Files   int
	swapped bool
}

// Kept says where the store's files from before the swap are.
func (r SwapReport) Kept() string {
	if r.Replaced == "" {
		return "the folder held no store before"
	}
	return "its files from before are in " + r.Replaced
}

// Swapped is the swap of a staged copy this Open made, if any.
func (s *Store) Swapped() (SwapReport, bool) { return s.swapped, s.swapped.swapped }

// swapStamp names a swap's replaced folder: the time, to the second
// (tests fix it).
var swapStamp = defaultSwapStamp

func defaultSwapStamp() string { return time.Now().UTC().Format(swapStampLayout) }

// swapStampLayout is the time format of a replaced folder's name.
const swapStampLayout = "20060102T150405Z"

// RecordMend writes, durably, that a worker mending itself (prism serve
// embedding --mend) staged a copy of another worker's store in the store
// folder dir at t: a file the swap leaves where it is (mendStamp), so
// operators may remove the replaced-<time> folders without losing it.
func RecordMend(fs vfs.FS, dir string, t time.Time) error {
	return writeWhole(fs, dir, mendStamp, t.UTC().Format(time.RFC3339)+"\n")
}

// LastMend is when a worker mending itself last staged a copy in the
// store folder dir (RecordMend), and false when it never did: it copies
// again only some time after, so a worker whose build answers updates
// otherwise than its peers' (and diverges again after each copy) does
// not copy a store after each update.
func LastMend(fs vfs.FS, dir string) (time.Time, bool, error) {
	f, err := fs.Open(fs.PathJoin(dir, mendStamp))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return time.Time{}, false, nil
		}
		return time.Time{}, false, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, 128))
	if err != nil {
		return time.Time{}, false, err
	}
	t, err := time.Parse(time.RFC3339, strings.TrimSpace(string(b)))
	if err != nil {
		return time.Time{}, false, fmt.Errorf("%s: %q is not a time (remove the file to forget the last mend)", fs.PathJoin(dir, mendStamp), b)
	}
	return t, true, nil
}

// swapStaged swaps a complete staged copy (StagedDir) into the store
// folder dir, or finishes a swap a crash interrupted; it does nothing
// when there is neither, or when a prism store copy holds the staged
// folder (a copy under way: this open serves the store as it is). stamp
// names the folder the store's own files move to. The caller holds the
// folder's lock (Open): no process has the store open.
func swapStaged(fs vfs.FS, dir, stamp string) (SwapReport, error) {
	journal := fs.PathJoin(dir, swapJournal)
	staged := fs.PathJoin(dir, stagedDir)
	complete := fs.PathJoin(staged, stagedComplete)
	phase, replaced, err := readJournal(fs, journal)
	if err != nil {
		return SwapReport{}, err
	}
	if phase == 0 {
		if _, err := fs.Stat(complete); err != nil {
			return SwapReport{}, nil // nothing staged, or a copy not yet whole
		}
	}
	if _, err := fs.Stat(staged); err == nil {
		// The copy's own lock, so no prism store copy writes (or clears)
		// the staged files while they move. A copy holds it only briefly
		// once a swap is under way (it then sees the journal and stops).
		l, err := lockStaged(fs, staged, phase > 0)
		if err != nil {
			return SwapReport{}, fmt.Errorf("swap in the copy staged in %s: %w", staged, err)
		}
		if l == nil {
			return SwapReport{}, nil // a copy under way replaces this one
		}
		defer l.Close()
		if _, err := fs.Stat(complete); err != nil {
			if phase == 0 {
				return SwapReport{}, nil // cleared by a copy meanwhile
			}
			if phase == 1 || nonEmpty(fs, staged) {
				// Only the swap's last step removes the mark (with the
				// whole folder): someone else removed it, maybe files too.
				return SwapReport{}, fmt.Errorf("a swap of a staged copy is under way (%s) but %s lacks its %s mark; the store's own files are in %s and the copy's in %s: finish by hand, or remove %s to open the store as it was",
					journal, staged, stagedComplete, fs.PathJoin(dir, replaced), staged, journal)
			}
		}
	} else if phase == 1 {
		return SwapReport{}, fmt.Errorf("a swap of a staged copy is under way (%s) but its copy %s is gone; the store's own files are in %s: move them back and remove %s",
			journal, staged, fs.PathJoin(dir, replaced), journal)
	}
	if phase == 0 {
		// A folder of its own: two swaps in one second (or a clock set
		// back) must not mix two stores' files.
		replaced = replacedPrefix + stamp
		for k := 2; ; k++ {
			if _, err := fs.Stat(fs.PathJoin(dir, replaced)); err != nil {
				break
			}
			replaced = fmt.Sprintf("%s%s-%d", replacedPrefix, stamp, k)
		}
		phase = 1
		if err := writeJournal(fs, dir, phase, replaced); err != nil {
			return SwapReport{}, err
		}
	}
	wrap := func(err error) error {
		return fmt.Errorf("swap in the copy staged in %s (the next open goes on with it): %w", staged, err)
	}
	if phase == 1 {
		// The store's own entries move aside: its files, and the folders
		// the store makes (nothing else a folder may hold: a volume's
		// lost+found, hidden files, earlier swaps' folders).
		to := fs.PathJoin(dir, replaced)
		if err := fs.MkdirAll(to, 0o755); err != nil {
			return SwapReport{}, wrap(err)
		}
		names, err := fs.List(dir)
		if err != nil {
			return SwapReport{}, wrap(err)
		}
		for _, n := range names {
			if !storeEntry(fs, dir, n) {
				continue
			}
			if err := fs.Rename(fs.PathJoin(dir, n), fs.PathJoin(to, n)); err != nil {
				return SwapReport{}, wrap(err)
			}
		}
		if err := SyncDir(fs, to); err != nil {
			return SwapReport{}, wrap(err)
		}
		phase = 2
		if err := writeJournal(fs, dir, phase, replaced); err != nil {
			return SwapReport{}, wrap(err)
		}
	}
	names, err := fs.List(staged)
	if err != nil && !errors.Is(err, iofs.ErrNotExist) {
		return SwapReport{}, wrap(err)
	}
	moved := 0
	for _, n := range names {
		if n == stagedComplete || n == stagedLock || n == lockFile {
			continue
		}
		if err := fs.Rename(fs.PathJoin(staged, n), fs.PathJoin(dir, n)); err != nil {
			return SwapReport{}, wrap(err)
		}
		moved++
	}
	if err := SyncDir(fs, dir); err != nil {
		return SwapReport{}, wrap(err)
	}
	if err := fs.RemoveAll(staged); err != nil {
		return SwapReport{}, wrap(err)
	}
	if err := fs.Remove(journal); err != nil {
		return SwapReport{}, wrap(err)
	}
	if err := SyncDir(fs, dir); err != nil {
		return SwapReport{}, wrap(err)
	}
	kept := fs.PathJoin(dir, replaced)
	if names, err := fs.List(kept); err == nil && len(names) == 0 {
		// The folder held no store (a new replica's seed): nothing to
		// keep.
		if err := fs.Remove(kept); err == nil {
			kept = ""
		}
	}
	return SwapReport{Replaced: kept, Files: moved, swapped: true}, nil
}

// lockStaged takes the staged folder's lock: nil, nil when a copy holds
// it, unless wait (a swap under way, which must finish): then it tries
// for up to two seconds.
func lockStaged(fs vfs.FS, staged string, wait bool) (io.Closer, error) {
	for i := 0; ; i++ {
		l, err := fs.Lock(fs.PathJoin(staged, stagedLock))
		if err == nil {
			return l, nil
		}
		if !wait {
			return nil, nil
		}
		if i == 20 {
			return nil, fmt.Errorf("the copy's lock %s stays held (a prism store copy writing there?): %w", stagedLock, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// storeEntry says whether entry n of store folder dir is the store's
// own, to move aside: a file (Pebble's, but its LOCK), or a folder the
// store makes (ingest staging, checkpoints being sent).
func storeEntry(fs vfs.FS, dir, n string) bool {
	switch {
	case swapKeeps(n):
		return false
	case storeFolder(n):
		return true
	}
	st, err := fs.Stat(fs.PathJoin(dir, n))
	return err == nil && !st.IsDir()
}

// swapKeeps says whether entry n of a store folder is one a swap leaves
// where it is: its own (journal, the staged copy, earlier swaps' kept
// stores, the last mend's time), Pebble's lock, and what a volume holds besides the store
// (lost+found, hidden entries).
func swapKeeps(n string) bool {
	return n == swapJournal || n == swapJournal+".tmp" || n == mendStamp || n == mendStamp+".tmp" || n == stagedDir || n == lockFile ||
		strings.HasPrefix(n, ".") || strings.HasPrefix(n, replacedPrefix) || n == "lost+found"
}

// storeFolder says whether entry n of a store folder is a folder the
// store makes (ingest staging, checkpoints being sent).
func storeFolder(n string) bool { return n == stagingDir || strings.HasPrefix(n, checkpointPrefix) }

// ReservedName says whether a file named n may not be part of a copy:
// a name the swap leaves in place or treats as a folder, or one the
// staged folder keeps for itself.
func ReservedName(n string) bool {
	return swapKeeps(n) || storeFolder(n) || n == stagedComplete || n == stagedLock
}

func nonEmpty(fs vfs.FS, dir string) bool {
	names, _ := fs.List(dir)
	for _, n := range names {
		if n != stagedLock && n != lockFile {
			return true
		}
	}
	return false
}

// The journal is one line, "PHASE FOLDER", written to a temporary file,
// synced and renamed over the last (the folder synced after).
func readJournal(fs vfs.FS, path string) (phase int, replaced string, err error) {
	f, err := fs.Open(path)
	if errors.Is(err, iofs.ErrNotExist) {
		return 0, "", nil // no swap under way
	} else if err != nil {
		return 0, "", fmt.Errorf("read %s: %w", path, err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, 1<<10))
	if err != nil {
		return 0, "", fmt.Errorf("read %s: %w", path, err)
	}
	if _, err := fmt.Sscanf(string(b), "%d %s", &phase, &replaced); err != nil || (phase != 1 && phase != 2) ||
		!strings.HasPrefix(replaced, replacedPrefix) || strings.ContainsAny(replaced, `/\`) {
		return 0, "", fmt.Errorf("%s: %q is not a swap journal (want \"1|2 %s...\"); the store folder holds a half-done swap of a staged copy: the store's own files are in the %s* folder, the copy's in %s",
			path, b, replacedPrefix, replacedPrefix, stagedDir)
	}
	return phase, replaced, nil
}

// writeJournal records a swap's phase and replaced folder (writeWhole).
func writeJournal(fs vfs.FS, dir string, phase int, replaced string) error {
	return writeWhole(fs, dir, swapJournal, fmt.Sprintf("%d %s\n", phase, replaced))
}

// writeWhole writes content as file name in dir, whole or not at all:
// into name.tmp, synced, renamed over name, the folder synced.
func writeWhole(fs vfs.FS, dir, name, content string) error {
	tmp := fs.PathJoin(dir, name+".tmp")
	f, err := fs.Create(tmp, vfs.WriteCategoryUnspecified)
	if err != nil {
		return err
	}
	if _, err := io.WriteString(f, content); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := fs.Rename(tmp, fs.PathJoin(dir, name)); err != nil {
		return err
	}
	return SyncDir(fs, dir)
}

// SyncDir syncs folder dir (its entries' names) on fs.
func SyncDir(fs vfs.FS, dir string) error {
	d, err := fs.OpenDir(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}
