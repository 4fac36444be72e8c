package store

import (
	"context"
	"fmt"

	"github.com/cockroachdb/pebble/v2/objstorage/objstorageprovider"
	"github.com/cockroachdb/pebble/v2/sstable"
)

// sstSink writes rows into SST files in the staging folder and ingests
// each into Pebble when the caller flushes it (durable when Ingest
// returns). Ingest and the copy-on-write of a shared table both fill
// tables this way. The caller owns it from newSSTSink to its last flush.
type sstSink struct {
	s      *Store
	prefix string // file names: prefix-NNNNNN.sst
	seq    int
	w      *sstable.Writer
	path   string
	// Rows and Bytes (keys and values) since the last flush.
	Rows, Bytes int64
}

// newSSTSink makes the staging folder and a sink whose files are named
// after prefix.
func (s *Store) newSSTSink(prefix string) (*sstSink, error) {
	if err := s.opts.FS.MkdirAll(s.opts.FS.PathJoin(s.dir, stagingDir), 0o755); err != nil {
		return nil, err
	}
	return &sstSink{s: s, prefix: prefix}, nil
}

// set adds key/value (keys in increasing order), opening a file first if
// none is open.
func (k *sstSink) set(key, val []byte) error {
	if k.w == nil {
		fs := k.s.opts.FS
		k.path = fs.PathJoin(k.s.dir, stagingDir, fmt.Sprintf("%s-%06d.sst", k.prefix, k.seq))
		k.seq++
		f, err := fs.Create(k.path, "")
		if err != nil {
			return fmt.Errorf("write sst: %w", err)
		}
		wo := k.s.popts.MakeWriterOptions(6, k.s.db.FormatMajorVersion().MaxTableFormat())
		k.w = sstable.NewWriter(objstorageprovider.NewFileWritable(f), wo)
	}
	if err := k.w.Set(key, val); err != nil {
		return fmt.Errorf("write sst: %w", err)
	}
	k.Rows++
	k.Bytes += int64(len(key) + len(val))
	return nil
}

// discard closes and removes the file being written, if any: a fill
// that failed or was cancelled keeps no file open (the store's process
// lives on, and each failed ingest held one more descriptor).
func (k *sstSink) discard() {
	if k.w == nil {
		return
	}
	_ = k.w.Close()
	k.w = nil
	_ = k.s.opts.FS.Remove(k.path)
}

// flush closes the open file, if any, and ingests it.
func (k *sstSink) flush(ctx context.Context) error {
	if k.w == nil {
		return nil
	}
	if err := k.w.Close(); err != nil {
		return fmt.Errorf("write sst: %w", err)
	}
	k.w = nil
	if k.s.closed.Load() {
		return ErrClosed
	}
	if err := k.s.db.Ingest(ctx, []string{k.path}); err != nil {
		return fmt.Errorf("ingest sst: %w", err)
	}
	_ = k.s.opts.FS.Remove(k.path)
	k.Rows, k.Bytes = 0, 0
	return nil
}
