// Package hot is the embedding store's in-memory hot tier: a byte-bounded
// cache of rows in front of Pebble, served as float32.
//
// Layout: one Class per row width code: a dim (rows held as float32), or
// a dim with a packed form (HalfWidth, Int8Width: rows held as the table
// stores them and widened on each hit). A class is a row arena (one
// []float32, fixed-size slots) with an index from a packed (table, row)
// key to a slot, in one of two forms, whichever leaves more of the budget
// to rows (see NewTier):
//
//   - direct: one []int32 per table, slot+1 per row id (0: not
//     resident). A hit is one load from a dense 4-byte-per-row array and
//     one row copy, no hashing or probing; it costs 4 bytes per table row
//     whether resident or not, so it wins when the tier holds more than
//     about an eighth of its tables' rows.
//   - hashed: open addressing (linear probing, backward-shift deletion,
//     no tombstones), 32 bytes per slot at load 1/2; it wins for small
//     tiers in front of large tables.
//
// Gather resolves a whole batch in two passes, all the index loads first
// and then all the row copies, so the cache misses of different ids
// overlap instead of each row waiting on its own index load. A Go map
// keyed by (table, id) measured 0.24-0.32x of a raw gather here.
//
// Policy: TinyLFU admission with sampled-LFU eviction (as Ristretto):
// every access is counted in a 4-bit count-min sketch that is halved
// every 10x capacity accesses; while the class has free slots a missed
// row is admitted outright, afterwards it replaces the least-frequent of
// a few sampled residents only if its own estimated frequency is higher.
// Skewed (Zipf) traffic keeps its head resident; a scan, whose rows are
// each seen once, never beats a resident that was read twice, so it
// passes through without flushing the tier.
//
// Concurrency: readers hold RLock while they copy rows out of the arena;
// recording accesses, admission and updates take Lock. Callers that
// cannot wait (the lookup path) use TryLock and drop the access record of
// that batch when the class is busy, as Caffeine's lossy read buffers do.
package hot

import (
	"math"
	"sync"
	"sync/atomic"
	"unsafe"
)

// Key packs a physical table id and a row id: table in the top 24 bits,
// row in the low 40. Table ids start at 1, so no key is 0 (the empty
// slot marker).
func Key(table uint32, row int64) uint64 { return uint64(table)<<40 | uint64(row) }

// MaxRows is the most rows a table may have under Key's packing.
const MaxRows = 1 << 40

// Hash mixes a key (the murmur3 finaliser); the index and the sketch
// both use it, so callers compute it once per access.
func Hash(key uint64) uint64 {
	h := key
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	h *= 0xc4ceb9fe1a85ec53
	h ^= h >> 33
	return h
}

// slotOverhead is the memory a slot costs besides its row: its key, two
// index entries of 16 bytes (load factor 1/2) and a sketch word.
const slotOverhead = 8 + 32 + 8

type entry struct {
	key  uint64
	slot int32
}

// Stats are a class's policy counters.
type Stats struct {
	Slots, Used                       int64
	Admissions, Rejections, Evictions int64
	Updates                           int64
}

// Class caches the rows of one width.
type Class struct {
	mu    sync.RWMutex
	dim   int
	slots int
	used  int
	// words is the arena's float32 words per row: dim, or the row packed
	// in form's stored layout (HalfWidth, Int8Width).
	words int
	form  form
	// pack is scratch for one packed row (Lock held).
	pack []float32

	arena   []float32
	slotKey []uint64
	idx     []entry
	mask    uint64
	// direct holds the per-table slot maps of a direct class; nil for a
	// hashed class.
	direct map[uint32]*dmap
	sk     *sketch
	rng    uint64
	// recordPhase carries Record's sampling across calls.
	recordPhase int
	// complete: the class was built to hold every row of its tables, so
	// admission never compares frequencies and sk stays nil (see
	// complete.go); preloaded marks the tables Load has filled.
	complete  bool
	preloaded map[uint32]bool

	admissions, rejections, evictions, updates atomic.Int64
}

// NewClass returns a class of rows of width (a dim, or HalfWidth(dim))
// within about budget bytes (rows, index and sketch together); nil if the
// budget holds no row.
func NewClass(width int, budget int64) *Class {
	dim, words, f := splitWidth(width)
	if dim < 1 {
		return nil
	}
	// The index and sketch round up to powers of two; hashedSlots shrinks
	// the slots until the rounded structures fit the budget too.
	slots := hashedSlots(words, budget)
	if slots < 1 {
		return nil
	}
	n := nextPow2(int(2 * slots))
	return &Class{
		dim:     dim,
		words:   words,
		form:    f,
		slots:   int(slots),
		arena:   make([]float32, int(slots)*words),
		slotKey: make([]uint64, slots),
		idx:     make([]entry, n),
		mask:    uint64(n - 1),
		sk:      newSketch(int(slots)),
		rng:     0x9E3779B97F4A7C15,
	}
}

// directSlotBytes is what a slot costs in a direct class besides its row:
// its key and a sketch word (the per-table maps are charged apart).
const directSlotBytes = 8 + 8

// NewDirectClass returns a class of rows of width (as NewClass's) whose
// index is a direct slot map per table, for tables of rows rows in all;
// the maps (4 bytes a row) come out of budget. Nil if the budget holds no
// row.
func NewDirectClass(width int, budget, rows int64) *Class {
	dim, words, f := splitWidth(width)
	if dim < 1 {
		return nil
	}
	slots := directSlots(words, budget, rows)
	if slots < 1 {
		return nil
	}
	return &Class{
		dim:     dim,
		words:   words,
		form:    f,
		slots:   int(slots),
		arena:   make([]float32, int(slots)*words),
		slotKey: make([]uint64, slots),
		direct:  map[uint32]*dmap{},
		sk:      newSketch(int(slots)),
		rng:     0x9E3779B97F4A7C15,
	}
}

// directSlots is how many rows of words arena words a direct class
// within budget holds.
func directSlots(words int, budget, rows int64) int64 {
	slots := min((budget-4*rows)/int64(words*4+directSlotBytes), rows, 1<<31-2)
	for slots > 0 && slots*int64(words*4+8)+int64(nextPow2(max(int(slots), 64)))*8+4*rows > budget {
		slots = slots * 15 / 16
	}
	return slots
}

// hashedSlots is how many rows of words arena words a hashed class
// within budget holds.
func hashedSlots(words int, budget int64) int64 {
	slots := budget / int64(words*4+slotOverhead)
	for slots > 0 && classBytes(words, slots) > budget {
		slots = slots * 15 / 16
	}
	return slots
}

// dmap is a direct class's slot map of one table: slot+1 by row index
// (0: not resident). A table of which the class holds the rows r with
// r mod mod == rem (a row-wise shard's part) indexes row r at r / mod,
// so the map costs 4 bytes a row held, not a row of the whole table.
type dmap struct {
	slots    []int32
	mod, rem int64 // mod 1: every row, at its id
}

// index is row's index in the map; false for a row outside the part or
// past the map.
func (m *dmap) index(row int64) (int64, bool) {
	if m.mod > 1 {
		if row%m.mod != m.rem {
			return 0, false
		}
		row /= m.mod
	}
	return row, row >= 0 && row < int64(len(m.slots))
}

// Attach gives table (of rows rows) its slot map in a direct class; a
// no-op for a hashed class or a table already attached. Rows of a table
// not attached are never admitted to a direct class. Caller holds Lock.
func (c *Class) Attach(table uint32, rows int64) { c.AttachPart(table, rows, 1, 0) }

// AttachPart is Attach for a table of rows rows of which the class may
// hold only the rows r with r mod mod == rem (a row-wise shard's part):
// its slot map holds one entry per such row. Rows outside the part are
// never admitted. Caller holds Lock.
func (c *Class) AttachPart(table uint32, rows, mod, rem int64) {
	if c.direct == nil || c.direct[table] != nil {
		return
	}
	n := rows
	if mod > 1 {
		n = 0
		if rem < rows {
			n = (rows - rem + mod - 1) / mod
		}
	} else {
		mod, rem = 1, 0
	}
	m := make([]int32, n)
	adviseHuge(unsafe.Pointer(unsafe.SliceData(m)), uintptr(len(m))*4)
	c.direct[table] = &dmap{slots: m, mod: mod, rem: rem}
}

// directHolds says whether key's table is attached to the direct class
// and its part holds key's row. Caller holds Lock.
func (c *Class) directHolds(key uint64) bool {
	m := c.direct[uint32(key>>40)]
	if m == nil {
		return false
	}
	_, ok := m.index(int64(key & (1<<40 - 1)))
	return ok
}

// directSet sets key's slot map entry (slot+1, 0: not resident) in a
// direct class.
func (c *Class) directSet(key uint64, v int32) {
	if m := c.direct[uint32(key>>40)]; m != nil {
		if i, ok := m.index(int64(key & (1<<40 - 1))); ok {
			m.slots[i] = v
		}
	}
}

// Direct reports whether the class indexes by per-table slot maps.
func (c *Class) Direct() bool { return c.direct != nil }

// classBytes is the memory of a class of slots rows of words arena words.
func classBytes(words int, slots int64) int64 {
	return slots*int64(words*4+8) + int64(nextPow2(int(2*slots)))*16 + int64(nextPow2(max(int(slots), 64)))*8
}

// Dim is the row width.
func (c *Class) Dim() int { return c.dim }

// Width is the class's width code: Dim, or HalfWidth(Dim) or
// Int8Width(Dim) for a class holding rows in that packed form.
func (c *Class) Width() int {
	switch c.form {
	case formHalf:
		return HalfWidth(c.dim)
	case formInt8:
		return Int8Width(c.dim)
	}
	return c.dim
}

// form is how a class's arena holds a row.
type form uint8

const (
	formFloat32 form = iota // dim float32 words, as served
	formHalf                // IEEE halves, two to a word
	formInt8                // a float32 scale word, then int8s four to a word
)

// Width codes above the dim mark a packed form.
const (
	halfBit  = 1 << 24
	int8Bit  = 1 << 25
	dimLimit = halfBit // a dim is below it
)

// HalfWidth is the width code of a class holding rows of width dim as
// IEEE halves, two to an arena word: for tables stored as float16, whose
// rows are halves exactly, so the class holds twice the rows in the same
// bytes and gives back the very floats a read from the store would.
func HalfWidth(dim int) int { return dim | halfBit }

// minInt8Dim is the narrowest row held as int8: narrower rows save too
// few bytes to be worth the widening (and Gather widens in place, which
// needs room for the packed words in the row's tail).
const minInt8Dim = 8

// Int8Width is the width code of a class holding rows of width dim as a
// table stored as int8 holds them (a float32 scale, then one int8 per
// value, the value being float32(q) * scale): 1 + dim/4 arena words a
// row instead of dim (68 bytes for dim 64 against 256; with the index
// and sketch, 2.5x the rows of a hashed class in the same bytes), and the
// very floats a read from the store decodes to. Rows narrower than
// minInt8Dim stay float32 (Int8Width returns dim).
func Int8Width(dim int) int {
	if dim < minInt8Dim {
		return dim
	}
	return dim | int8Bit
}

// ValidWidth reports whether width is a width code some class may have.
func ValidWidth(width int) bool {
	dim := width & (dimLimit - 1)
	switch width &^ (dimLimit - 1) {
	case 0, halfBit:
		return dim >= 1
	case int8Bit:
		return dim >= minInt8Dim
	}
	return false
}

// splitWidth decodes a width code.
func splitWidth(width int) (dim, words int, f form) {
	switch {
	case width&halfBit != 0:
		dim = width &^ halfBit
		return dim, (dim + 1) / 2, formHalf
	case width&int8Bit != 0:
		dim = width &^ int8Bit
		return dim, 1 + (dim+3)/4, formInt8
	}
	return width, width, formFloat32
}

// prepare readies row for put: an int8 class packs it into c.pack,
// false when it is not a scale times int8s (the form cannot hold it
// exactly); other forms hold every row. Caller holds Lock.
func (c *Class) prepare(row []float32) bool {
	if c.form != formInt8 {
		return true
	}
	if len(c.pack) < c.words {
		c.pack = make([]float32, c.words)
	}
	return packInt8(c.pack[:c.words], row)
}

// put writes row, readied by prepare, into slot's words. Caller holds
// Lock.
func (c *Class) put(slot int, row []float32) {
	dst := c.arena[slot*c.words : (slot+1)*c.words]
	switch c.form {
	case formHalf:
		for i := range dst {
			lo := uint32(F32ToF16(row[2*i]))
			var hi uint32
			if 2*i+1 < len(row) {
				hi = uint32(F32ToF16(row[2*i+1]))
			}
			dst[i] = math.Float32frombits(lo | hi<<16)
		}
	case formInt8:
		copy(dst, c.pack[:c.words])
	default:
		copy(dst, row)
	}
}

// widen is F16ToF32 of h: arithmetic for normal halves (the exponent
// rebiased by 127 - 15), F16Table for zeros, subnormals, infinities and
// NaNs. A table load for every value measured 3.3x a float32 row's copy.
func widen(h uint32) float32 {
	if e := h & 0x7c00; e != 0 && e != 0x7c00 {
		return math.Float32frombits((h&0x8000)<<16 | ((h&0x7fff)<<13 + 112<<23))
	}
	return F16Table[h]
}

// RLock and RUnlock bracket reads with Get.
func (c *Class) RLock()   { c.mu.RLock() }
func (c *Class) RUnlock() { c.mu.RUnlock() }

// Lock and Unlock bracket Record, Admit, Put and Delete.
func (c *Class) Lock()         { c.mu.Lock() }
func (c *Class) TryLock() bool { return c.mu.TryLock() }
func (c *Class) Unlock()       { c.mu.Unlock() }

// Get returns the cached row of key (hash h), aliasing the arena: the
// caller holds RLock (or Lock) while it reads the row. A packed class's
// row is its packed words (Gather reads rows of any class).
func (c *Class) Get(key, h uint64) ([]float32, bool) {
	slot, ok := c.lookup(key, h)
	if !ok {
		return nil, false
	}
	s := slot * c.words
	return c.arena[s : s+c.words : s+c.words], true
}

// lookup is key's slot.
func (c *Class) lookup(key, h uint64) (int, bool) {
	if c.direct != nil {
		m := c.direct[uint32(key>>40)]
		if m == nil {
			return 0, false
		}
		i, ok := m.index(int64(key & (1<<40 - 1)))
		if !ok || m.slots[i] == 0 {
			return 0, false
		}
		return int(m.slots[i]) - 1, true
	}
	i := h & c.mask
	for {
		e := &c.idx[i]
		if e.key == key {
			return int(e.slot), true
		}
		if e.key == 0 {
			return 0, false
		}
		i = (i + 1) & c.mask
	}
}

// Gather copies the resident rows of table's ids into out (id i's row at
// out[i*dim:]) and appends the positions of the ids not resident to miss.
// A negative id is skipped (neither copied nor a miss); every other id
// must be in range. slots is scratch of at least len(ids). Caller holds
// RLock.
//
// The index loads of the whole batch go first and the row copies second,
// so the misses of different ids overlap (the raw gather this races has
// one miss per row and no dependent load).
func (c *Class) Gather(table uint32, ids []int64, out []float32, slots []int32, miss []int32) []int32 {
	dim := c.dim
	slots = slots[:len(ids)]
	if c.direct != nil {
		m := c.direct[table]
		if m == nil {
			for i, id := range ids {
				if id >= 0 {
					miss = append(miss, int32(i))
				}
			}
			return miss
		}
		if m.mod == 1 {
			for i, id := range ids {
				if id < 0 {
					slots[i] = -1
					continue
				}
				slots[i] = m.slots[id]
			}
		} else {
			for i, id := range ids {
				if id < 0 {
					slots[i] = -1
					continue
				}
				slots[i] = 0 // a row outside the part: a miss
				if x, ok := m.index(id); ok {
					slots[i] = m.slots[x]
				}
			}
		}
	} else {
		for i, id := range ids {
			if id < 0 {
				slots[i] = -1
				continue
			}
			k := Key(table, id)
			s, ok := c.lookup(k, Hash(k))
			if ok {
				slots[i] = int32(s) + 1
			} else {
				slots[i] = 0
			}
		}
	}
	arena := c.arena
	for i, s := range slots {
		if s <= 0 {
			if s == 0 {
				miss = append(miss, int32(i))
			}
			continue
		}
		if c.form != formFloat32 {
			// The packed words go to the row's tail first, one copy per
			// row as for float32 rows, so the rows' cache misses overlap;
			// they are widened in place below, from L1.
			w := c.words
			src := int(s-1) * w
			copy(out[(i+1)*dim-w:(i+1)*dim], arena[src:src+w])
			continue
		}
		src := int(s-1) * dim
		copy(out[i*dim:(i+1)*dim], arena[src:src+dim])
	}
	switch c.form {
	case formHalf:
		for i, s := range slots {
			if s > 0 {
				widenInPlace(out[i*dim:(i+1)*dim], c.words)
			}
		}
	case formInt8:
		for i, s := range slots {
			if s > 0 {
				widenInt8InPlace(out[i*dim:(i+1)*dim], c.words)
			}
		}
	}
	return miss
}

// widenInPlace widens the words packed halves held in row's last words
// floats into the whole row. Word j is read before its two floats (2j,
// 2j+1) are written, and those never reach a word not yet read (2j+1 <
// len(row)-words+j+1 for j < words, as words >= len(row)/2).
func widenInPlace(row []float32, words int) {
	n := len(row)
	base := n - words
	for j := range words {
		b := math.Float32bits(row[base+j])
		lo, hi := widen(b&0xffff), widen(b>>16)
		row[2*j] = lo
		if 2*j+1 < n {
			row[2*j+1] = hi
		}
	}
}

// RecordEvery is the sampling of Record: one access in RecordEvery is
// counted. Sampling every access alike keeps the estimates' ratios (what
// admission compares) and cuts the sketch's cache misses on the hit path.
const RecordEvery = 4

// Record counts a sample of the accesses (hashes) in the frequency
// sketch. Caller holds Lock.
func (c *Class) Record(hashes []uint64) {
	if c.sk == nil {
		return
	}
	i := c.recordPhase
	for ; i < len(hashes); i += RecordEvery {
		c.sk.add(hashes[i])
	}
	c.recordPhase = i - len(hashes)
}

// Count counts every access (hash) given in the frequency sketch, for
// callers that sample themselves. Caller holds Lock.
func (c *Class) Count(hashes []uint64) {
	if c.sk == nil {
		return
	}
	for _, h := range hashes {
		c.sk.add(h)
	}
}

// Admit offers a missed row to the tier; it is copied in if there is a
// free slot or if it is more frequent than the sampled victim. Caller
// holds Lock.
func (c *Class) Admit(key, h uint64, row []float32) bool {
	if _, ok := c.lookup(key, h); ok {
		return true
	}
	if c.direct != nil && !c.directHolds(key) || !c.prepare(row) {
		c.rejections.Add(1)
		return false
	}
	var slot int
	if c.used < c.slots {
		slot = c.used
		c.used++
	} else {
		if c.sk == nil {
			// A complete class outgrown by tables attached later (a new
			// version beside the old): admission needs frequencies now.
			c.sk = newSketch(c.slots)
		}
		victim := c.sampleVictim()
		vk := c.slotKey[victim]
		if c.sk.estimate(h) <= c.sk.estimate(Hash(vk)) {
			c.rejections.Add(1)
			return false
		}
		c.remove(vk, Hash(vk))
		c.evictions.Add(1)
		slot = victim
	}
	c.put(slot, row)
	c.slotKey[slot] = key
	c.insert(key, h, int32(slot))
	c.admissions.Add(1)
	return true
}

// Put overwrites key's row if it is resident (an acknowledged update must
// never be shadowed by the old row); a row the class's form cannot hold
// drops the resident one instead. Caller holds Lock.
func (c *Class) Put(key, h uint64, row []float32) {
	if slot, ok := c.lookup(key, h); ok {
		if !c.prepare(row) {
			c.remove(key, h)
			c.freeSlot(slot)
			return
		}
		c.put(slot, row)
		c.updates.Add(1)
	}
}

// Delete drops key if resident. Caller holds Lock.
func (c *Class) Delete(key, h uint64) {
	if slot, ok := c.lookup(key, h); ok {
		c.remove(key, h)
		c.freeSlot(slot)
	}
}

// DeleteTable drops every row of a table. Caller holds Lock.
func (c *Class) DeleteTable(table uint32) {
	for s := c.used - 1; s >= 0; s-- {
		if k := c.slotKey[s]; k>>40 == uint64(table) {
			c.remove(k, Hash(k))
			c.freeSlot(s)
		}
	}
	delete(c.direct, table)
	delete(c.preloaded, table)
}

// freeSlot moves the last used slot into s, keeping used slots dense.
func (c *Class) freeSlot(s int) {
	last := c.used - 1
	if s != last {
		lk := c.slotKey[last]
		copy(c.arena[s*c.words:(s+1)*c.words], c.arena[last*c.words:(last+1)*c.words])
		c.slotKey[s] = lk
		c.setSlot(lk, Hash(lk), int32(s))
	}
	c.slotKey[last] = 0
	c.used--
}

func (c *Class) setSlot(key, h uint64, slot int32) {
	if c.direct != nil {
		c.directSet(key, slot+1)
		return
	}
	i := h & c.mask
	for c.idx[i].key != key {
		i = (i + 1) & c.mask
	}
	c.idx[i].slot = slot
}

func (c *Class) sampleVictim() int {
	const samples = 5
	best, bestF := -1, 1<<30
	for range samples {
		c.rng ^= c.rng << 13
		c.rng ^= c.rng >> 7
		c.rng ^= c.rng << 17
		s := int(c.rng % uint64(c.used))
		if f := c.sk.estimate(Hash(c.slotKey[s])); f < bestF {
			best, bestF = s, f
		}
	}
	return best
}

func (c *Class) insert(key, h uint64, slot int32) {
	if c.direct != nil {
		c.directSet(key, slot+1)
		return
	}
	i := h & c.mask
	for c.idx[i].key != 0 {
		i = (i + 1) & c.mask
	}
	c.idx[i] = entry{key: key, slot: slot}
}

// remove deletes key from the index by backward shifting the entries of
// its probe run, so lookups never meet a tombstone.
func (c *Class) remove(key, h uint64) {
	if c.direct != nil {
		c.directSet(key, 0)
		return
	}
	i := h & c.mask
	for c.idx[i].key != key {
		if c.idx[i].key == 0 {
			return
		}
		i = (i + 1) & c.mask
	}
	j := i
	for {
		j = (j + 1) & c.mask
		e := c.idx[j]
		if e.key == 0 {
			break
		}
		home := Hash(e.key) & c.mask
		// e may move to the hole at i unless its home lies cyclically in (i, j].
		if (j > i && (home <= i || home > j)) || (j < i && home <= i && home > j) {
			c.idx[i] = e
			i = j
		}
	}
	c.idx[i] = entry{}
}

// Stats returns the class's counters.
func (c *Class) Stats() Stats {
	c.mu.RLock()
	used := c.used
	c.mu.RUnlock()
	return Stats{
		Slots: int64(c.slots), Used: int64(used),
		Admissions: c.admissions.Load(), Rejections: c.rejections.Load(),
		Evictions: c.evictions.Load(), Updates: c.updates.Load(),
	}
}

// Tier is the set of classes, one per row width, sharing one byte budget.
type Tier struct {
	classes map[int]*Class
	budget  int64
	// complete: every class holds every row of the tables it was built for.
	complete bool
}

// NewTier splits budget between the widths in proportion to weight (the
// bytes of the tables of each width, float32); a class never gets more
// slots than its tables have rows, so a tier larger than the tables stays
// compact. Each class is direct or hashed, whichever holds more rows in
// its share. A direct class's slot maps are sized for the rows of weight;
// tables attached later (a new version while the tier is kept) add their
// 4 bytes a row beyond the budget until the old version is dropped.
func NewTier(budget int64, weight map[int]int64) *Tier {
	t := &Tier{classes: map[int]*Class{}, budget: budget}
	var total int64
	for _, w := range weight {
		total += w
	}
	if budget <= 0 || total == 0 {
		return t
	}
	if budget >= FullBytes(weight) {
		// Everything fits: every class holds all its rows, no sketch.
		for width, w := range weight {
			dim, _, _ := splitWidth(width)
			if c := newCompleteClass(width, w/int64(4*dim)); c != nil {
				t.classes[width] = c
			}
		}
		t.complete = len(t.classes) == len(weight)
		return t
	}
	for width, w := range weight {
		dim, words, _ := splitWidth(width)
		share := int64(float64(budget) * float64(w) / float64(total))
		rows := w / int64(4*dim)
		// The index form that caches more rows in the share wins; ties go
		// to direct (no hashing or probing on a hit).
		if ds := directSlots(words, share, rows); ds > 0 && ds >= min(hashedSlots(words, share), rows) {
			share = min(share, rows*int64(4*words+8+4)+int64(nextPow2(max(int(rows), 64)))*8)
			if c := NewDirectClass(width, share, rows); c != nil {
				t.classes[width] = c
			}
			continue
		}
		share = min(share, rows*int64(4*words+slotOverhead))
		if c := NewClass(width, share); c != nil {
			t.classes[width] = c
		}
	}
	return t
}

// Class returns the class of width dim, nil when rows of that width are
// not cached.
func (t *Tier) Class(width int) *Class { return t.classes[width] }

// Budget is the tier's byte budget.
func (t *Tier) Budget() int64 { return t.budget }

// Stats sums the classes' counters.
func (t *Tier) Stats() Stats {
	var s Stats
	for _, c := range t.classes {
		cs := c.Stats()
		s.Slots += cs.Slots
		s.Used += cs.Used
		s.Admissions += cs.Admissions
		s.Rejections += cs.Rejections
		s.Evictions += cs.Evictions
		s.Updates += cs.Updates
	}
	return s
}
