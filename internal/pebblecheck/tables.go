package pebblecheck

import (
	"context"
	"errors"
	"fmt"
	iofs "io/fs"
	"slices"
	"strings"

	"github.com/cockroachdb/pebble/v2/sstable"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// Tables reads every block of every table file (*.sst) in folder dir
// and checks it against its checksum: the damage (bit rot on the disk
// it was read from, a torn write) that Pebble finds only when a read
// reaches the block, which may be long after a copy of the file has
// been taken for whole. It returns each damaged file; err is for the
// folder that could not be listed, or ctx ended (it stops then). A
// file gone while the check ran (a live store's compaction removed it)
// is passed over. done, if set, is called after each file with the
// bytes checked of total.
func Tables(ctx context.Context, fsys vfs.FS, dir string, done func(checked, total int64)) (damaged []*DamagedError, err error) {
	names, err := fsys.List(dir)
	if err != nil {
		return nil, err
	}
	slices.Sort(names)
	var tables []string
	var sizes []int64
	var total int64
	for _, n := range names {
		if !strings.HasSuffix(n, ".sst") {
			continue
		}
		st, err := fsys.Stat(fsys.PathJoin(dir, n))
		if errors.Is(err, iofs.ErrNotExist) {
			continue
		} else if err != nil {
			return nil, err
		}
		if st.IsDir() {
			continue
		}
		tables = append(tables, n)
		sizes = append(sizes, st.Size())
		total += st.Size()
	}
	var checked int64
	for i, n := range tables {
		if err := ctx.Err(); err != nil {
			return damaged, err
		}
		err := Table(ctx, fsys, fsys.PathJoin(dir, n))
		var d *DamagedError
		switch {
		case errors.As(err, &d):
			damaged = append(damaged, d)
		case errors.Is(err, iofs.ErrNotExist):
		case err != nil:
			return damaged, err
		}
		checked += sizes[i]
		if done != nil {
			done(checked, total)
		}
	}
	return damaged, nil
}

// DamagedError is Table's (and Tables') error for a damaged file.
type DamagedError struct {
	// Path is the damaged table file.
	Path string
	Err  error
}

func (e *DamagedError) Error() string {
	return fmt.Sprintf("table file %s is damaged: %v", e.Path, e.Err)
}

func (e *DamagedError) Unwrap() error { return e.Err }

// Table checks every block of the table file at path against its
// checksum (and that the file parses as a table at all: its footer,
// index and properties). A file Pebble's reader panics on (a key
// schema it does not know, in properties whose checksum holds) is
// damaged too.
func Table(ctx context.Context, fsys vfs.FS, path string) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = &DamagedError{Path: path, Err: fmt.Errorf("%v", p)}
		}
	}()
	f, err := fsys.Open(path)
	if err != nil {
		return err // not damage: the caller's to say
	}
	readable, err := sstable.NewSimpleReadable(f)
	if err != nil {
		f.Close()
		return err
	}
	r, err := sstable.NewReader(ctx, readable, sstable.ReaderOptions{})
	if err != nil {
		readable.Close()
		return &DamagedError{Path: path, Err: err}
	}
	defer r.Close()
	if err := r.ValidateBlockChecksums(); err != nil {
		return &DamagedError{Path: path, Err: err}
	}
	return nil
}
