// Package pebblecheck finds damage to a Pebble database's own files that
// Pebble opens over without a word, losing data: a lost marker of the
// current MANIFEST, a MANIFEST record that does not check with records
// after it. Call Check before pebble.Open of a database that may exist.
package pebblecheck

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"slices"
	"strconv"
	"strings"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/record"
	"github.com/cockroachdb/pebble/v2/vfs"
)

// Pebble's MANIFEST is a log of records in 32 KiB blocks, each record in
// chunks with a 7-byte header: a masked CRC-32C of the chunk's type and
// payload, the payload's length and the chunk's type (record.go in
// pebble/record; the legacy format, which the MANIFEST is written in).
const (
	manifestBlock      = 32 << 10
	manifestHeader     = 7
	manifestFullChunk  = 1
	manifestFirstChunk = 2
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

func maskedCRC(b []byte) uint32 {
	c := crc32.Update(0, castagnoli, b)
	return (c>>15 | c<<17) + 0xa282ead8
}

// Check returns what is wrong with the Pebble database in dir, if it
// is damaged in a way Pebble would open over and lose data (nil when
// there is no database there, or none of that damage: pebble.Open says
// what else is wrong).
func Check(fsys vfs.FS, dir string) error {
	if err := checkMarker(fsys, dir); err != nil {
		return err
	}
	if err := checkOptions(fsys, dir); err != nil {
		return err
	}
	return checkManifest(fsys, dir)
}

// ErrSettingsOnly is in Check's error for a damaged OPTIONS file: the
// data is whole, and removing the file is the mend.
var ErrSettingsOnly = errors.New("it records only Pebble's settings; remove it, and the next open writes it anew")

// checkOptions names the OPTIONS file Pebble would refuse the database
// for (garbage in it, a torn write): Pebble's own error names neither
// the file nor that it holds only settings (Pebble writes a new one at
// every open for writing), so removing it is the mend.
func checkOptions(fsys vfs.FS, dir string) error {
	names, err := fsys.List(dir)
	if err != nil {
		return nil
	}
	latest, num := "", uint64(0)
	for _, n := range names {
		rest, ok := strings.CutPrefix(n, "OPTIONS-")
		if !ok {
			continue
		}
		v, err := strconv.ParseUint(rest, 10, 64)
		if err != nil {
			continue
		}
		if latest == "" || v > num {
			latest, num = n, v
		}
	}
	if latest == "" {
		return nil
	}
	path := fsys.PathJoin(dir, latest)
	f, err := fsys.Open(path)
	if err != nil {
		return nil // pebble.Open says why
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, 1<<20))
	if err != nil {
		return nil
	}
	o := &pebble.Options{}
	o.EnsureDefaults()
	if err := o.CheckCompatibility(dir, string(b)); err != nil {
		return fmt.Errorf("%s is damaged, or another program's (%v): %w", path, err, ErrSettingsOnly)
	}
	return nil
}

// checkMarker refuses a folder that holds a database's files but no
// marker of its current MANIFEST (Pebble's CURRENT: a file named
// marker.manifest.N.MANIFEST-M), lost or deleted. Pebble would open it
// as no database at all, start an empty one over it (its
// MANIFEST-000001 written anew) and delete every table file as
// obsolete, nothing said. A database never past its first MANIFEST and
// without table files (a creation cut short) passes.
func checkMarker(fsys vfs.FS, dir string) error {
	desc, err := pebble.Peek(dir, fsys)
	if err != nil || desc.Exists {
		return nil // pebble.Open says what is wrong, if anything
	}
	names, err := fsys.List(dir)
	if err != nil {
		return nil
	}
	var tables, manifests []string
	for _, n := range names {
		switch {
		case strings.HasSuffix(n, ".sst"):
			tables = append(tables, n)
		case strings.HasPrefix(n, "MANIFEST-"):
			manifests = append(manifests, n)
		}
	}
	if len(tables) == 0 && len(manifests) <= 1 {
		return nil
	}
	slices.Sort(manifests)
	newest := "none"
	if len(manifests) > 0 {
		newest = manifests[len(manifests)-1]
	}
	return fmt.Errorf("the folder holds a Pebble database's files (%d table files, MANIFEST files %v) but no marker.manifest.* naming its current MANIFEST (opened, it would have been started anew and its files deleted; to try the newest MANIFEST, create the empty file %s)", len(tables), manifests, fsys.PathJoin(dir, "marker.manifest.000001."+newest))
}

// checkManifest refuses a database whose current MANIFEST holds a record
// that does not check (bit rot, a torn write) followed by records that
// do. Pebble reads a MANIFEST up to its first bad record and takes the
// rest for the torn tail of a crash, which can only be its last record
// (Pebble syncs each before going on): it opens the database without
// the table files the later records add and deletes them as obsolete,
// their keys lost and nothing said. A bad last record, the tail a crash leaves, is Pebble's to
// ignore, as it does.
func checkManifest(fsys vfs.FS, dir string) error {
	name := CurrentManifest(fsys, dir)
	if name == "" {
		return nil // no database, or no marker: checkMarker's
	}
	path := fsys.PathJoin(dir, name)
	f, err := fsys.Open(path)
	if err != nil {
		return nil // pebble.Open says why
	}
	defer f.Close()
	rr := record.NewReader(f, 0)
	var bad int64
	for {
		off := rr.Offset()
		r, err := rr.Next()
		if err == nil {
			_, err = io.Copy(io.Discard, r)
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			if !record.IsInvalidRecord(err) {
				return nil
			}
			bad = off
			break
		}
	}
	st, err := f.Stat()
	if err != nil {
		return nil
	}
	rest := make([]byte, st.Size()-bad)
	if _, err := f.ReadAt(rest, bad); err != nil && err != io.EOF {
		return nil
	}
	if at, ok := validChunkAfter(rest, bad); ok {
		return fmt.Errorf("%s is damaged: the record at byte %d does not check, and a whole record follows at byte %d (a crash tears only the last; opened, the database would lose the table files the records after it add, and they would be deleted)", path, bad, at)
	}
	return nil
}

// validChunkAfter looks in rest, the MANIFEST from the bad record at
// offset base on, for the start of a record whose chunk checks (a full
// or first chunk): anywhere in the bad record's block (its length may
// be what is damaged), and along the chunks of each later block, which
// start at the block's start.
func validChunkAfter(rest []byte, base int64) (int64, bool) {
	ok := func(p int64) bool { // p: an offset into rest
		if p+manifestHeader > int64(len(rest)) {
			return false
		}
		h := rest[p:]
		typ := h[6]
		n := int64(binary.LittleEndian.Uint16(h[4:6]))
		inBlock := manifestBlock - (base+p)%manifestBlock
		if (typ != manifestFullChunk && typ != manifestFirstChunk) || manifestHeader+n > inBlock || p+manifestHeader+n > int64(len(rest)) {
			return false
		}
		return binary.LittleEndian.Uint32(h[0:4]) == maskedCRC(h[6:manifestHeader+n])
	}
	firstBlockEnd := manifestBlock - base%manifestBlock
	for p := int64(1); p < firstBlockEnd && p < int64(len(rest)); p++ {
		if ok(p) {
			return base + p, true
		}
	}
	for blk := firstBlockEnd; blk < int64(len(rest)); blk += manifestBlock {
		for p := blk; p+manifestHeader <= blk+manifestBlock && p+manifestHeader <= int64(len(rest)); {
			if ok(p) {
				return base + p, true
			}
			n := int64(binary.LittleEndian.Uint16(rest[p+4 : p+6]))
			if rest[p+6] < manifestFullChunk || rest[p+6] > 4 {
				break
			}
			p += manifestHeader + n
		}
	}
	return 0, false
}

// CurrentManifest is the file name of the MANIFEST the store's marker
// names ("" when there is none).
func CurrentManifest(fsys vfs.FS, dir string) string {
	names, err := fsys.List(dir)
	if err != nil {
		return ""
	}
	best, iter := "", ""
	for _, n := range names {
		rest, ok := strings.CutPrefix(n, "marker.manifest.")
		if !ok {
			continue
		}
		it, value, ok := strings.Cut(rest, ".")
		if !ok || !strings.HasPrefix(value, "MANIFEST-") {
			continue
		}
		if it > iter { // zero-padded iteration numbers
			best, iter = value, it
		}
	}
	return best
}
