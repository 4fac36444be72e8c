package router

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"sync"
	"syscall"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"google.golang.org/protobuf/proto"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/internal/diskfull"
	"github.com/prism-serve/prism/internal/inuse"
	"github.com/prism-serve/prism/internal/pebblecheck"
)

// updateLog keeps the sequencer's update logs in a Pebble folder
// (Options.UpdateLogDir), so a restarted router still holds the recent
// updates of each model and catches up a worker that missed them.
//
// It mirrors, per model, what the sequencer keeps in memory: the state
// (next, committed, floor, then the diverged marks: their count and
// each worker id, its length first, and seq; a log of an earlier
// release ends after floor) under "s"+model, and each numbered update
// floor+1 .. next under "e"+uvarint(len(model))+model+seq (8 bytes, big
// endian, so a model's entries sort by seq), and the outcome of each
// such update the sequence decided (logChange.Outcomes: one byte, 1
// applied, 0xff refused as bad input) under "o" and the same suffix. A
// log of an earlier release has no outcomes (each is learnt again from
// the first answer to its replay); an earlier release refuses a log
// holding them, as it refuses any key it does not write. The sequencer asks for
// every change with a msgPersist; the driver writes those of one step in
// one synced batch (write) before it sends or answers anything of that
// step. Trimming drops the same entries the in-memory log drops (the
// byte budget), in the same batch.
type updateLog struct {
	mu     sync.Mutex
	db     *pebble.DB
	fs     vfs.FS
	dir    string
	closed bool
}

// updateLogMemTable is the update log's memtable size (Pebble's default).
const updateLogMemTable = 4 << 20

// restoredModel is one model's log as read back at start.
type restoredModel struct {
	model                  string
	next, committed, floor int64
	log                    []*prismv1.ApplyUpdateRequest
	// diverged are the marks logChange.Diverged wrote (nil: none).
	diverged map[string]int64
	// outcomes are those logChange.Outcomes wrote of the updates in log
	// (nil: none).
	outcomes map[int64]int8
}

// openUpdateLog opens (or makes) the update log in dir on fs (nil: the
// operating system's).
func openUpdateLog(dir string, fs vfs.FS) (*updateLog, error) {
	if fs == nil {
		fs = vfs.Default
	}
	if _, err := fs.Stat(dir); err == nil {
		if err := pebblecheck.Check(fs, dir); errors.Is(err, pebblecheck.ErrSettingsOnly) {
			return nil, fmt.Errorf("open update log %q: %w", dir, err)
		} else if err != nil {
			return nil, fmt.Errorf("open update log %q: %w; the log was not opened. Restore the folder, or remove it: the restarted router then takes the workers' numbering, and a worker behind them is mended by a copy of an up-to-date worker's store", dir, err)
		}
	}
	// A damaged block read later fails that read (the write or
	// heartbeat rewriting the log says so) rather than taking Pebble's
	// default, the logger's Fatalf: the router would exit at every read.
	listener := &pebble.EventListener{DataCorruption: func(info pebble.DataCorruptionInfo) {
		detail := "no detail"
		if info.Details != nil {
			detail, _, _ = strings.Cut(info.Details.Error(), "\n")
		}
		pebble.DefaultLogger.Errorf("update log %q: %s is damaged (%s): restore the folder, or remove it with the router stopped (the restarted router then takes the workers' numbering)", dir, info.Path, detail)
	}}
	db, err := pebble.Open(dir, &pebble.Options{FS: diskfull.Wait(fs, dir, "update log", updateLogMemTable, pebble.DefaultLogger.Errorf), Logger: quietPebble{}, FormatMajorVersion: pebble.FormatNewest, MemTableSize: updateLogMemTable, EventListener: listener})
	if err != nil {
		return nil, fmt.Errorf("open update log %q: %w", dir, inuse.Explain(err))
	}
	// Every block of the log's table files, read once (the log is
	// --update-log-bytes at most): a damaged one found here is refused
	// with what to do, before any of the log is restored.
	damaged, err := pebblecheck.Tables(context.Background(), fs, dir, nil)
	if err == nil && len(damaged) > 0 {
		err = fmt.Errorf("%w; the log was not restored. Restore the folder, or remove it: the restarted router then takes the workers' numbering, and a worker behind them is mended by a copy of an up-to-date worker's store", damaged[0])
	}
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("open update log %q: %w", dir, err)
	}
	if err := ownKeysOnly(db); err != nil {
		db.Close()
		return nil, fmt.Errorf("open update log %q: %w", dir, err)
	}
	return &updateLog{db: db, fs: fs, dir: dir}, nil
}

// storeKeyPrefix starts every key of an embedding store's metadata
// (cpuserve/store keys.go: table id 0, 4 bytes).
const storeKeyPrefix = "\x00\x00\x00\x00"

// ownKeysOnly refuses a folder holding keys the update log does not
// write: its keys are "e...", "o..." and "s..." only. Pointed at an embedding
// store's folder (--update-log-dir given a worker's --db), the router
// would otherwise add its log to the store's keys and start with an
// empty log, silently.
func ownKeysOnly(db *pebble.DB) error {
	it, err := db.NewIter(nil)
	if err != nil {
		return err
	}
	defer it.Close()
	// nil, not []byte(""), for the first key: pebble's invariants
	// (on under -race) read key[0] of any non-nil seek key, and an empty
	// one panicked opening every update log in race builds.
	for _, from := range [][]byte{nil, []byte("f"), []byte("p"), []byte("t")} {
		if !it.SeekGE(from) {
			continue
		}
		k := it.Key()
		if k[0] == 'e' || k[0] == 'o' || k[0] == 's' {
			continue
		}
		if strings.HasPrefix(string(k), storeKeyPrefix) {
			return errors.New("the folder holds an embedding store (prism ingest, serve embedding --db), not an update log: give --update-log-dir a folder of its own")
		}
		return fmt.Errorf("the folder holds key %q, which no update log writes: give --update-log-dir a folder of its own", k)
	}
	return it.Error()
}

func stateKey(model string) []byte { return append([]byte("s"), model...) }

func entryKey(model string, seq int64) []byte { return logKey('e', model, seq) }

func outcomeKey(model string, seq int64) []byte { return logKey('o', model, seq) }

func logKey(kind byte, model string, seq int64) []byte {
	k := binary.AppendUvarint([]byte{kind}, uint64(len(model)))
	k = append(k, model...)
	return binary.BigEndian.AppendUint64(k, uint64(seq))
}

// write applies the msgPersist messages among msgs in one synced batch.
func (l *updateLog) write(msgs []message) error {
	if !slices.ContainsFunc(msgs, func(m message) bool { return m.Type == msgPersist }) {
		return nil // nothing to write (a step that only sends or answers)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return errors.New("update log closed")
	}
	b := l.db.NewBatch()
	defer b.Close()
	for _, m := range msgs {
		if m.Type != msgPersist {
			continue
		}
		c := m.Persist
		for _, key := range []func(string, int64) []byte{entryKey, outcomeKey} {
			switch n := c.Floor - c.DropFrom; {
			case n > 64:
				if err := b.DeleteRange(key(m.Model, c.DropFrom+1), key(m.Model, c.Floor+1), nil); err != nil {
					return err
				}
			case n > 0:
				for seq := c.DropFrom + 1; seq <= c.Floor; seq++ {
					if err := b.Delete(key(m.Model, seq), nil); err != nil {
						return err
					}
				}
			}
		}
		entries := slices.Clip(c.Entries) // a rewrite's; an append copies
		if c.Entry != nil {
			entries = append(entries, c.Entry)
		}
		for _, e := range entries {
			v, err := proto.Marshal(e)
			if err != nil {
				return err
			}
			if err := b.Set(entryKey(m.Model, e.GetSeq()), v, nil); err != nil {
				return err
			}
		}
		for _, seq := range slices.Sorted(maps.Keys(c.Outcomes)) {
			if seq <= c.Floor || seq > c.Next {
				continue // trimmed meanwhile (or never logged)
			}
			if err := b.Set(outcomeKey(m.Model, seq), []byte{byte(c.Outcomes[seq])}, nil); err != nil {
				return err
			}
		}
		var st []byte
		st = binary.AppendUvarint(st, uint64(c.Next))
		st = binary.AppendUvarint(st, uint64(c.Committed))
		st = binary.AppendUvarint(st, uint64(c.Floor))
		if len(c.Diverged) > 0 {
			st = binary.AppendUvarint(st, uint64(len(c.Diverged)))
			for _, id := range slices.Sorted(maps.Keys(c.Diverged)) {
				st = binary.AppendUvarint(st, uint64(len(id)))
				st = append(st, id...)
				st = binary.AppendUvarint(st, uint64(c.Diverged[id]))
			}
		}
		if err := b.Set(stateKey(m.Model), st, nil); err != nil {
			return err
		}
	}
	if b.Empty() {
		return nil
	}
	if err := l.room(int(b.Len())); err != nil {
		return err
	}
	return b.Commit(pebble.Sync)
}

// room refuses a write of n bytes when the log's disk lacks room for it
// and a flush of the memtable (diskfull.Room): Pebble would end the
// process at the failed write (the router, Recommend and all, died at
// the first update once the disk filled). Refused here, the write fails
// alone (writeFailed: the model takes no updates until a heartbeat's
// rewrite is written) and the router goes on serving Recommend.
func (l *updateLog) room(n int) error {
	return diskfull.Room(l.fs, l.dir, "update log", n, updateLogMemTable, syscall.ENOSPC)
}

// load reads every model's log back. Its entries are the contiguous run
// ending at next (a batch that failed to write leaves a gap, below which
// the entries cannot be replayed: the floor moves up to it).
func (l *updateLog) load() ([]restoredModel, error) {
	it, err := l.db.NewIter(&pebble.IterOptions{LowerBound: []byte("s"), UpperBound: []byte("t")})
	if err != nil {
		return nil, err
	}
	var out []restoredModel
	for it.First(); it.Valid(); it.Next() {
		r := restoredModel{model: string(it.Key()[1:])}
		v := it.Value()
		var nums [3]int64
		for i := range nums {
			n, k := binary.Uvarint(v)
			if k <= 0 || n > math.MaxInt64 {
				it.Close()
				return nil, fmt.Errorf("update log: state of model %q does not decode", r.model)
			}
			nums[i], v = int64(n), v[k:]
		}
		r.next, r.committed, r.floor = nums[0], nums[1], nums[2]
		if r.committed > r.next || r.floor > r.next {
			// Never written so (the sequencer keeps both at or below
			// next): a torn or foreign value, refused rather than
			// restored into a sequence that acknowledges updates it never
			// numbered (FuzzUpdateLogState).
			it.Close()
			return nil, fmt.Errorf("update log: state of model %q out of order (next %d, acknowledged %d, floor %d)", r.model, r.next, r.committed, r.floor)
		}
		var ok bool
		if r.diverged, ok = divergedMarks(v); !ok {
			it.Close()
			return nil, fmt.Errorf("update log: diverged marks of model %q do not decode", r.model)
		}
		out = append(out, r)
	}
	if err := it.Close(); err != nil {
		return nil, err
	}
	for i := range out {
		r := &out[i]
		it, err := l.db.NewIter(&pebble.IterOptions{LowerBound: entryKey(r.model, r.floor+1), UpperBound: entryKey(r.model, r.next+1)})
		if err != nil {
			return nil, err
		}
		want := r.floor + 1
		for it.First(); it.Valid(); it.Next() {
			seq := int64(binary.BigEndian.Uint64(it.Key()[len(it.Key())-8:]))
			e := &prismv1.ApplyUpdateRequest{}
			if err := proto.Unmarshal(it.Value(), e); err != nil || e.GetSeq() != seq {
				it.Close()
				return nil, fmt.Errorf("update log: update %d of model %q does not decode", seq, r.model)
			}
			if seq != want {
				r.log = r.log[:0] // a gap: only what follows it can be replayed
			}
			r.log = append(r.log, e)
			want = seq + 1
		}
		if err := it.Close(); err != nil {
			return nil, err
		}
		if want != r.next+1 {
			r.log = nil // the latest is missing: nothing can be replayed
		}
		r.floor = r.next - int64(len(r.log))
		if r.outcomes, err = l.loadOutcomes(r.model, r.floor, r.next); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// loadOutcomes reads back the outcomes of model's updates floor+1 ..
// next (nil: none written).
func (l *updateLog) loadOutcomes(model string, floor, next int64) (map[int64]int8, error) {
	it, err := l.db.NewIter(&pebble.IterOptions{LowerBound: outcomeKey(model, floor+1), UpperBound: outcomeKey(model, next+1)})
	if err != nil {
		return nil, err
	}
	var out map[int64]int8
	for it.First(); it.Valid(); it.Next() {
		seq := int64(binary.BigEndian.Uint64(it.Key()[len(it.Key())-8:]))
		v := it.Value()
		if len(v) != 1 || (int8(v[0]) != 1 && int8(v[0]) != -1) {
			it.Close()
			return nil, fmt.Errorf("update log: the outcome of update %d of model %q does not decode", seq, model)
		}
		if out == nil {
			out = map[int64]int8{}
		}
		out[seq] = int8(v[0])
	}
	return out, it.Close()
}

// divergedMarks decodes the diverged marks that follow a state's
// numbers (none: a log of an earlier release, or no mark).
func divergedMarks(v []byte) (map[string]int64, bool) {
	if len(v) == 0 {
		return nil, true
	}
	n, k := binary.Uvarint(v)
	if k <= 0 || n > uint64(len(v)) {
		return nil, false
	}
	v = v[k:]
	out := make(map[string]int64, n)
	for range n {
		l, k := binary.Uvarint(v)
		if k <= 0 || l > uint64(len(v)-k) {
			return nil, false
		}
		id := string(v[k : k+int(l)])
		v = v[k+int(l):]
		seq, k := binary.Uvarint(v)
		if k <= 0 {
			return nil, false
		}
		v = v[k:]
		out[id] = int64(seq)
	}
	return out, len(v) == 0
}

// Close closes the folder; a write after it fails.
func (l *updateLog) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
	return l.db.Close()
}

// quietPebble keeps Pebble's routine notes out of the router's log.
type quietPebble struct{}

func (quietPebble) Infof(string, ...any)              {}
func (quietPebble) Errorf(format string, args ...any) { pebble.DefaultLogger.Errorf(format, args...) }
func (quietPebble) Fatalf(format string, args ...any) { pebble.DefaultLogger.Fatalf(format, args...) }
