package hot

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"slices"
)

// Snapshot is what a warm restart of a class needs: the keys it holds and
// its frequency sketch. Rows are not part of it; the store reads them
// back from Pebble (they may have been updated since), hottest first.
type Snapshot struct {
	// Dim is the class's width code (Class.Width).
	Dim   int
	Slots int
	// Keys are the resident keys, ascending once SortKeys has run (and
	// as UnmarshalBinary returns them).
	Keys []uint64
	// Sketch is the frequency sketch's words and additions since its last
	// halving; nil for a class without a sketch (a complete one).
	Sketch    []uint64
	Additions int
}

// Snapshot copies the class's resident keys (in slot order: SortKeys
// sorts them, after the caller has let go of the lock) and sketch.
// Caller holds RLock or Lock.
func (c *Class) Snapshot() Snapshot {
	s := Snapshot{Dim: c.Width(), Slots: c.slots, Keys: slices.Clone(c.slotKey[:c.used])}
	if c.sk != nil {
		s.Sketch = slices.Clone(c.sk.words)
		s.Additions = c.sk.additions
	}
	return s
}

// SortKeys puts the keys in ascending order, as MarshalBinary wants them
// (a million keys take about 0.2 s: not under the class's lock).
func (s *Snapshot) SortKeys() { slices.Sort(s.Keys) }

// RestoreSketch adopts the snapshot's sketch, so admission compares
// candidates with the residents as it did before the restart; each
// counter keeps the larger of its saved value and what lookups have
// counted since Open. False (and nothing changed) when the class has no
// sketch or one of another size: a tier resized across the restart
// starts counting afresh. Caller holds Lock.
func (c *Class) RestoreSketch(s *Snapshot) bool {
	if c.sk == nil || len(s.Sketch) != len(c.sk.words) || s.Dim != c.Width() {
		return false
	}
	for i, saved := range s.Sketch {
		now := c.sk.words[i]
		var w uint64
		for n := uint(0); n < 64; n += 4 {
			w |= max(saved>>n&15, now>>n&15) << n
		}
		c.sk.words[i] = w
	}
	c.sk.additions = min(max(s.Additions, c.sk.additions), c.sk.sampleSize-1)
	return true
}

// Hottest returns the snapshot's keys by their estimated frequency in its
// sketch, highest first (ties by key): the order a restart reads them in,
// so the rows that answer most lookups are back first. Without a sketch,
// the keys in ascending order.
func (s *Snapshot) Hottest() []uint64 {
	if len(s.Sketch) == 0 || len(s.Sketch)&(len(s.Sketch)-1) != 0 {
		return slices.Clone(s.Keys)
	}
	sk := &sketch{words: s.Sketch, mask: uint64(len(s.Sketch) - 1)}
	type ranked struct {
		key uint64
		est int
	}
	r := make([]ranked, len(s.Keys))
	for i, k := range s.Keys {
		r[i] = ranked{k, sk.estimate(Hash(k))}
	}
	slices.SortStableFunc(r, func(a, b ranked) int { return cmp.Compare(b.est, a.est) })
	keys := make([]uint64, len(r))
	for i, x := range r {
		keys[i] = x.key
	}
	return keys
}

// snapshotMagic starts an encoded snapshot (format version 1).
const snapshotMagic = "PHS1"

// MaxSnapshotKeys bounds the keys a decoded snapshot may claim, so a
// corrupt length cannot ask for an unbounded allocation.
const MaxSnapshotKeys = 1 << 31

// MarshalBinary encodes the snapshot: magic, dim, slots, the keys as
// ascending deltas (uvarints), additions, the sketch's words
// (little-endian), and a CRC-32C of all that.
func (s *Snapshot) MarshalBinary() ([]byte, error) {
	if !slices.IsSorted(s.Keys) {
		return nil, errors.New("hot snapshot: keys not ascending")
	}
	out := make([]byte, 0, len(snapshotMagic)+4*binary.MaxVarintLen64+2*len(s.Keys)+8*len(s.Sketch)+4)
	w := &partWriter{size: 64 << 10, emit: func(p []byte) error { out = append(out, p...); return nil }}
	err := encodeSnapshot(w, s.Dim, s.Slots, s.Keys, s.Additions, len(s.Sketch), func(off int, dst []uint64) {
		copy(dst, s.Sketch[off:])
	})
	return out, err
}

// WriteSnapshot encodes the class's snapshot as MarshalBinary encodes it,
// handing emit the encoding in order, in parts of partBytes (the last
// shorter); emit may not keep a part past its return. It holds the
// class's read lock to copy the resident keys, and again for each chunk
// of the sketch it copies, never while emit runs, so a save costs a copy
// of the keys (8 bytes a resident row) and partBytes, not a copy of the
// sketch and the whole encoding. The sketch is read as lookups count,
// which a frequency estimate can afford. It returns how many keys it
// wrote; with none it emits nothing. An error from emit ends it.
func (c *Class) WriteSnapshot(partBytes int, emit func(part []byte) error) (keys int, err error) {
	c.RLock()
	dim, slots, additions := c.Width(), c.slots, 0
	ks := slices.Clone(c.slotKey[:c.used])
	sk := c.sk
	if sk != nil {
		additions = sk.additions
	}
	c.RUnlock()
	if len(ks) == 0 {
		return 0, nil
	}
	slices.Sort(ks)
	nwords := 0
	if sk != nil {
		nwords = len(sk.words)
	}
	w := &partWriter{size: max(partBytes, 1), emit: emit}
	return len(ks), encodeSnapshot(w, dim, slots, ks, additions, nwords, func(off int, dst []uint64) {
		c.RLock()
		copy(dst, sk.words[off:]) // a class's sketch is never replaced nor resized once made
		c.RUnlock()
	})
}

// snapshotSketchChunk is how many sketch words an encoding copies at a
// time (under the class's read lock, for WriteSnapshot).
const snapshotSketchChunk = 16 << 10

// encodeSnapshot writes MarshalBinary's encoding to w; words copies the
// sketch's words from off into dst.
func encodeSnapshot(w *partWriter, dim, slots int, keys []uint64, additions, nwords int, words func(off int, dst []uint64)) error {
	w.write([]byte(snapshotMagic))
	w.uvarint(uint64(dim))
	w.uvarint(uint64(slots))
	w.uvarint(uint64(len(keys)))
	prev := uint64(0)
	for _, k := range keys {
		w.uvarint(k - prev)
		prev = k
	}
	w.uvarint(uint64(additions))
	w.uvarint(uint64(nwords))
	if nwords > 0 {
		chunk := make([]uint64, min(nwords, snapshotSketchChunk))
		raw := make([]byte, 8*len(chunk))
		for off := 0; off < nwords && w.err == nil; off += len(chunk) {
			n := min(len(chunk), nwords-off)
			words(off, chunk[:n])
			for i, x := range chunk[:n] {
				binary.LittleEndian.PutUint64(raw[8*i:], x)
			}
			w.write(raw[:8*n])
		}
	}
	w.sum()
	w.summed = true
	var sum [4]byte
	binary.LittleEndian.PutUint32(sum[:], w.crc)
	w.write(sum[:])
	w.flush()
	return w.err
}

// partWriter cuts what is written to it into parts of size bytes for
// emit, keeping the CRC-32C of everything written before summed is set.
type partWriter struct {
	buf    []byte
	size   int
	crc    uint32
	crcd   int // bytes at the head of buf already in crc
	summed bool
	emit   func([]byte) error
	err    error
}

func (w *partWriter) write(p []byte) {
	for len(p) > 0 && w.err == nil {
		if w.buf == nil {
			w.buf = make([]byte, 0, w.size)
		}
		n := min(len(p), w.size-len(w.buf))
		w.buf = append(w.buf, p[:n]...)
		p = p[n:]
		if len(w.buf) == w.size {
			w.flush()
		}
	}
}

func (w *partWriter) uvarint(v uint64) {
	if w.buf != nil && w.size-len(w.buf) > binary.MaxVarintLen64 {
		w.buf = binary.AppendUvarint(w.buf, v) // the common case: no copy
		return
	}
	var b [binary.MaxVarintLen64]byte
	w.write(b[:binary.PutUvarint(b[:], v)])
}

// sum adds the bytes of buf not yet summed to crc, unless the checksum
// has been written.
func (w *partWriter) sum() {
	if !w.summed {
		w.crc = crc32.Update(w.crc, castagnoli, w.buf[w.crcd:])
		w.crcd = len(w.buf)
	}
}

func (w *partWriter) flush() {
	if len(w.buf) > 0 && w.err == nil {
		w.sum()
		w.err = w.emit(w.buf)
		w.buf, w.crcd = w.buf[:0], 0
	}
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// ErrSnapshot is wrapped by every error of UnmarshalBinary.
var ErrSnapshot = errors.New("hot snapshot: corrupt")

// UnmarshalBinary decodes what MarshalBinary wrote, checking its CRC,
// every length against the bytes present, and that the keys ascend.
func (s *Snapshot) UnmarshalBinary(b []byte) error {
	if len(b) < len(snapshotMagic)+4 || string(b[:len(snapshotMagic)]) != snapshotMagic {
		return fmt.Errorf("%w: no snapshot header", ErrSnapshot)
	}
	body := b[:len(b)-4]
	if crc32.Checksum(body, castagnoli) != binary.LittleEndian.Uint32(b[len(b)-4:]) {
		return fmt.Errorf("%w: checksum mismatch", ErrSnapshot)
	}
	r := body[len(snapshotMagic):]
	next := func(what string) (uint64, error) {
		v, n := binary.Uvarint(r)
		if n <= 0 {
			return 0, fmt.Errorf("%w: bad %s", ErrSnapshot, what)
		}
		r = r[n:]
		return v, nil
	}
	dim, err := next("dim")
	if err != nil {
		return err
	}
	slots, err := next("slots")
	if err != nil {
		return err
	}
	nkeys, err := next("key count")
	if err != nil {
		return err
	}
	if dim > 1<<30 || !ValidWidth(int(dim)) || slots > MaxSnapshotKeys || nkeys > slots || nkeys > uint64(len(r)) {
		return fmt.Errorf("%w: dim %d, slots %d, %d keys in %d bytes", ErrSnapshot, dim, slots, nkeys, len(r))
	}
	keys := make([]uint64, nkeys)
	prev := uint64(0)
	for i := range keys {
		d, err := next("key")
		if err != nil {
			return err
		}
		if i > 0 && d == 0 || prev+d < prev {
			return fmt.Errorf("%w: keys not ascending", ErrSnapshot)
		}
		prev += d
		keys[i] = prev
	}
	adds, err := next("additions")
	if err != nil {
		return err
	}
	nw, err := next("sketch length")
	if err != nil {
		return err
	}
	if nw > uint64(len(r))/8 || nw*8 != uint64(len(r)) || nw&(nw-1) != 0 || adds > 1<<62 {
		return fmt.Errorf("%w: sketch of %d words in %d bytes", ErrSnapshot, nw, len(r))
	}
	var words []uint64
	if nw > 0 {
		words = make([]uint64, nw)
		for i := range words {
			words[i] = binary.LittleEndian.Uint64(r[8*i:])
		}
	}
	*s = Snapshot{Dim: int(dim), Slots: int(slots), Keys: keys, Sketch: words, Additions: int(adds)}
	return nil
}

// Slots is how many rows the class can hold; Used how many it holds.
// Caller holds RLock or Lock.
func (c *Class) Slots() int { return c.slots }
func (c *Class) Used() int  { return c.used }
