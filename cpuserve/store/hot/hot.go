// Package hot is the embedding store's in-memory hot tier: a byte-bounded
// cache of decoded float32 rows in front of Pebble.
//
// Layout: one Class per row width (dim). A class is a row arena (one
// []float32, fixed-size slots) with an open-addressing index (linear
// probing, backward-shift deletion, no tombstones) from a packed
// (table, row) key to a slot. A Go map keyed by (table, id) measured
// 0.24-0.32x of a raw gather here; the flat index and arena keep a hit to
// two cache lines.
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
	"sync"
	"sync/atomic"
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

	arena   []float32
	slotKey []uint64
	idx     []entry
	mask    uint64
	sk      *sketch
	rng     uint64
	// recordPhase carries Record's sampling across calls.
	recordPhase int

	admissions, rejections, evictions, updates atomic.Int64
}

// NewClass returns a class of rows of width dim within about budget bytes
// (rows, index and sketch together); nil if the budget holds no row.
func NewClass(dim int, budget int64) *Class {
	if dim < 1 {
		return nil
	}
	slots := budget / int64(dim*4+slotOverhead)
	// The index and sketch round up to powers of two; shrink the slots
	// until the rounded structures fit the budget too.
	for slots > 0 && classBytes(dim, slots) > budget {
		slots = slots * 15 / 16
	}
	if slots < 1 {
		return nil
	}
	n := nextPow2(int(2 * slots))
	return &Class{
		dim:     dim,
		slots:   int(slots),
		arena:   make([]float32, int(slots)*dim),
		slotKey: make([]uint64, slots),
		idx:     make([]entry, n),
		mask:    uint64(n - 1),
		sk:      newSketch(int(slots)),
		rng:     0x9E3779B97F4A7C15,
	}
}

// classBytes is the memory of a class of slots rows of width dim.
func classBytes(dim int, slots int64) int64 {
	return slots*int64(dim*4+8) + int64(nextPow2(int(2*slots)))*16 + int64(nextPow2(max(int(slots), 64)))*8
}

// Dim is the row width.
func (c *Class) Dim() int { return c.dim }

// RLock and RUnlock bracket reads with Get.
func (c *Class) RLock()   { c.mu.RLock() }
func (c *Class) RUnlock() { c.mu.RUnlock() }

// Lock and Unlock bracket Record, Admit, Put and Delete.
func (c *Class) Lock()         { c.mu.Lock() }
func (c *Class) TryLock() bool { return c.mu.TryLock() }
func (c *Class) Unlock()       { c.mu.Unlock() }

// Get returns the cached row of key (hash h), aliasing the arena: the
// caller holds RLock (or Lock) while it reads the row.
func (c *Class) Get(key, h uint64) ([]float32, bool) {
	i := h & c.mask
	for {
		e := &c.idx[i]
		if e.key == key {
			s := int(e.slot) * c.dim
			return c.arena[s : s+c.dim : s+c.dim], true
		}
		if e.key == 0 {
			return nil, false
		}
		i = (i + 1) & c.mask
	}
}

// RecordEvery is the sampling of Record: one access in RecordEvery is
// counted. Sampling every access alike keeps the estimates' ratios (what
// admission compares) and cuts the sketch's cache misses on the hit path.
const RecordEvery = 4

// Record counts a sample of the accesses (hashes) in the frequency
// sketch. Caller holds Lock.
func (c *Class) Record(hashes []uint64) {
	i := c.recordPhase
	for ; i < len(hashes); i += RecordEvery {
		c.sk.add(hashes[i])
	}
	c.recordPhase = i - len(hashes)
}

// Admit offers a missed row to the tier; it is copied in if there is a
// free slot or if it is more frequent than the sampled victim. Caller
// holds Lock.
func (c *Class) Admit(key, h uint64, row []float32) bool {
	if _, ok := c.Get(key, h); ok {
		return true
	}
	var slot int
	if c.used < c.slots {
		slot = c.used
		c.used++
	} else {
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
	copy(c.arena[slot*c.dim:(slot+1)*c.dim], row)
	c.slotKey[slot] = key
	c.insert(key, h, int32(slot))
	c.admissions.Add(1)
	return true
}

// Put overwrites key's row if it is resident (an acknowledged update must
// never be shadowed by the old row). Caller holds Lock.
func (c *Class) Put(key, h uint64, row []float32) {
	if r, ok := c.Get(key, h); ok {
		copy(r, row)
		c.updates.Add(1)
	}
}

// Delete drops key if resident. Caller holds Lock.
func (c *Class) Delete(key, h uint64) {
	i := h & c.mask
	for {
		e := c.idx[i]
		if e.key == key {
			c.freeSlot(int(e.slot))
			c.remove(key, h)
			return
		}
		if e.key == 0 {
			return
		}
		i = (i + 1) & c.mask
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
}

// freeSlot moves the last used slot into s, keeping used slots dense.
func (c *Class) freeSlot(s int) {
	last := c.used - 1
	if s != last {
		lk := c.slotKey[last]
		copy(c.arena[s*c.dim:(s+1)*c.dim], c.arena[last*c.dim:(last+1)*c.dim])
		c.slotKey[s] = lk
		c.setSlot(lk, Hash(lk), int32(s))
	}
	c.slotKey[last] = 0
	c.used--
}

func (c *Class) setSlot(key, h uint64, slot int32) {
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
	i := h & c.mask
	for c.idx[i].key != 0 {
		i = (i + 1) & c.mask
	}
	c.idx[i] = entry{key: key, slot: slot}
}

// remove deletes key from the index by backward shifting the entries of
// its probe run, so lookups never meet a tombstone.
func (c *Class) remove(key, h uint64) {
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
}

// NewTier splits budget between the widths in proportion to weight (the
// bytes of the tables of each width); a class never gets more slots than
// its tables have rows, so a tier larger than the tables stays compact.
func NewTier(budget int64, weight map[int]int64) *Tier {
	t := &Tier{classes: map[int]*Class{}, budget: budget}
	var total int64
	for _, w := range weight {
		total += w
	}
	if budget <= 0 || total == 0 {
		return t
	}
	for dim, w := range weight {
		share := int64(float64(budget) * float64(w) / float64(total))
		share = min(share, w/int64(4*dim)*int64(4*dim+slotOverhead))
		if c := NewClass(dim, share); c != nil {
			t.classes[dim] = c
		}
	}
	return t
}

// Class returns the class of width dim, nil when rows of that width are
// not cached.
func (t *Tier) Class(dim int) *Class { return t.classes[dim] }

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
