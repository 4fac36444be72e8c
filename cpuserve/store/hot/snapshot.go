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
	b := make([]byte, 0, len(snapshotMagic)+4*binary.MaxVarintLen64+2*len(s.Keys)+8*len(s.Sketch)+4)
	b = append(b, snapshotMagic...)
	b = binary.AppendUvarint(b, uint64(s.Dim))
	b = binary.AppendUvarint(b, uint64(s.Slots))
	b = binary.AppendUvarint(b, uint64(len(s.Keys)))
	prev := uint64(0)
	for _, k := range s.Keys {
		b = binary.AppendUvarint(b, k-prev)
		prev = k
	}
	b = binary.AppendUvarint(b, uint64(s.Additions))
	b = binary.AppendUvarint(b, uint64(len(s.Sketch)))
	for _, w := range s.Sketch {
		b = binary.LittleEndian.AppendUint64(b, w)
	}
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli)), nil
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
