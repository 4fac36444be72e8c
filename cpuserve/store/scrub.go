package store

import (
	"context"
	"errors"
	"fmt"
	iofs "io/fs"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/prism-serve/prism/internal/pebblecheck"
)

// ScrubReport is what one Scrub read.
type ScrubReport struct {
	// Files and Bytes are the table files checked and their size.
	Files int
	Bytes int64
	// Damaged are the files whose blocks did not check (each reported
	// as a read's damage is).
	Damaged []string
}

// Scrub reads every block of the store's live table files and checks it
// against its checksum, at most rate bytes a second (0: unpaced), as
// storage systems scrub their disks: a lookup finds a damaged block only
// when it reads it, and rows nobody looks up (or that the hot tier
// holds) would carry the damage into the next copy of the store, or be
// found only when the last good replica is gone. A damaged file is
// reported as a lookup's read reports one: logged naming the file and
// its tables, counted (Metrics.Corruptions), Damaged, Options.OnDamage
// (the self-mend's cue). A file a compaction removes meanwhile is passed
// over. It stops when ctx ends.
func (s *Store) Scrub(ctx context.Context, rate int64) (ScrubReport, error) {
	if err := s.enter(); err != nil {
		return ScrubReport{}, err
	}
	defer s.ops.Done()
	levels, err := s.db.SSTables()
	if err != nil {
		return ScrubReport{}, fmt.Errorf("scrub store %q: %w", s.dir, err)
	}
	type file struct {
		name   string
		lo, hi []byte
		size   uint64
	}
	var files []file
	seen := map[string]bool{}
	for _, level := range levels {
		for _, t := range level {
			name := fmt.Sprintf("%s.sst", t.BackingSSTNum)
			if seen[name] {
				continue // virtual tables share their backing file
			}
			seen[name] = true
			files = append(files, file{name, t.Smallest.UserKey, t.Largest.UserKey, t.Size})
		}
	}
	var rep ScrubReport
	fs := pacedFS{FS: s.opts.FS, pace: newPacer(ctx, rate)}
	for _, f := range files {
		if err := ctx.Err(); err != nil {
			return rep, err
		}
		path := s.opts.FS.PathJoin(s.dir, f.name)
		err := pebblecheck.Table(ctx, fs, path)
		if ctx.Err() != nil {
			return rep, ctx.Err()
		}
		var d *pebblecheck.DamagedError
		switch {
		case errors.As(err, &d):
			info := pebble.DataCorruptionInfo{Path: path, Details: d.Err}
			info.Bounds.Start, info.Bounds.End.Key = f.lo, f.hi
			s.reportDamage(info)
			rep.Damaged = append(rep.Damaged, path)
		case errors.Is(err, iofs.ErrNotExist):
			continue // compacted away meanwhile
		case err != nil:
			return rep, fmt.Errorf("scrub store %q: %w", s.dir, err)
		}
		rep.Files++
		rep.Bytes += int64(f.size)
		s.scrubbed.Add(int64(f.size))
	}
	s.lastScrub.Store(time.Now().UnixNano())
	return rep, nil
}

// pacer bounds reads to rate bytes a second over its life (0: none),
// sleeping the reader; it stops sleeping when ctx ends.
type pacer struct {
	ctx   context.Context
	rate  int64
	start time.Time
	n     int64
}

func newPacer(ctx context.Context, rate int64) *pacer {
	return &pacer{ctx: ctx, rate: rate, start: time.Now()}
}

func (p *pacer) read(n int) {
	if p.rate <= 0 || n <= 0 {
		return
	}
	p.n += int64(n)
	due := p.start.Add(time.Duration(float64(p.n) / float64(p.rate) * float64(time.Second)))
	if d := time.Until(due); d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-p.ctx.Done():
		}
	}
}

// pacedFS opens files whose reads the pacer bounds.
type pacedFS struct {
	vfs.FS
	pace *pacer
}

func (f pacedFS) Open(name string, opts ...vfs.OpenOption) (vfs.File, error) {
	file, err := f.FS.Open(name, opts...)
	if err != nil {
		return nil, err
	}
	return pacedFile{File: file, pace: f.pace}, nil
}

type pacedFile struct {
	vfs.File
	pace *pacer
}

func (f pacedFile) ReadAt(p []byte, off int64) (int, error) {
	n, err := f.File.ReadAt(p, off)
	f.pace.read(n)
	return n, err
}

func (f pacedFile) Read(p []byte) (int, error) {
	n, err := f.File.Read(p)
	f.pace.read(n)
	return n, err
}
