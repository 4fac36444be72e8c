package hot

import "unsafe"

// A complete tier holds every row of the tables it was built for: its
// budget covers FullBytes. Such a class is direct with one slot per row,
// so a missed row always finds a free slot and admission never compares
// frequencies; it carries no sketch (for dlrm-kaggle's 33.7M rows the
// sketch alone would be 512 MiB) and Count is a no-op. The store preloads
// it (Load) with a sequential scan of each table so that every lookup is
// a hit from the start, and rows never leave while the table set stays.

// completeRowBytes is a complete class's memory per row besides the row:
// its slot key (8) and its direct map entry (4).
const completeRowBytes = 8 + 4

// completeSlack covers a class's fixed structures (maps, headers).
const completeSlack = 64 << 10

// FullBytes is the budget a tier needs to hold every row of tables whose
// float32 bytes per row width are weight (NewTier's argument): rows,
// slot keys and direct maps, no sketch.
func FullBytes(weight map[int]int64) int64 {
	var n int64
	for width, w := range weight {
		dim, words, _ := splitWidth(width)
		if dim < 1 || w <= 0 {
			continue
		}
		rows := w / int64(4*dim)
		n += rows*int64(4*words+completeRowBytes) + completeSlack
	}
	return n
}

// newCompleteClass returns a direct class of one slot per row of rows
// rows of width dim, without a sketch; nil if it cannot index that many.
func newCompleteClass(width int, rows int64) *Class {
	dim, words, f := splitWidth(width)
	if dim < 1 || rows < 1 || rows > 1<<31-2 {
		return nil
	}
	c := &Class{
		dim:      dim,
		words:    words,
		form:     f,
		slots:    int(rows),
		arena:    make([]float32, int(rows)*words),
		slotKey:  make([]uint64, rows),
		direct:   map[uint32]*dmap{},
		rng:      0x9E3779B97F4A7C15,
		complete: true,
	}
	adviseHuge(unsafe.Pointer(unsafe.SliceData(c.arena)), uintptr(len(c.arena))*4)
	return c
}

// Complete reports whether the class was built to hold all its rows.
func (c *Class) Complete() bool { return c.complete }

// Complete reports whether every class holds all the rows of its tables.
func (t *Tier) Complete() bool { return t.complete }

// Load puts row (key's, hash h) in the class bypassing admission: it
// overwrites the resident row or takes a free slot, and never evicts.
// False when the class is full, key's table is not attached to a direct
// class, or the class's form cannot hold row exactly (a resident row of
// key is dropped then). Caller holds Lock, and guarantees row is not older than
// an update already applied with Put (the store reads rows under its
// update sequence check).
func (c *Class) Load(key, h uint64, row []float32) bool {
	if slot, ok := c.lookup(key, h); ok {
		if !c.prepare(row) {
			c.remove(key, h)
			c.freeSlot(slot)
			return false
		}
		c.put(slot, row)
		return true
	}
	if c.used >= c.slots || (c.direct != nil && !c.directHolds(key)) || !c.prepare(row) {
		return false
	}
	slot := c.used
	c.used++
	c.put(slot, row)
	c.slotKey[slot] = key
	c.insert(key, h, int32(slot))
	return true
}

// Full reports whether every slot is used. Caller holds Lock.
func (c *Class) Full() bool { return c.used >= c.slots }

// MarkPreloaded records that table's rows were loaded; DeleteTable
// forgets it. Caller holds Lock.
func (c *Class) MarkPreloaded(table uint32) {
	if c.preloaded == nil {
		c.preloaded = map[uint32]bool{}
	}
	c.preloaded[table] = true
}

// Preloaded reports whether MarkPreloaded was called for table. Caller
// holds Lock or RLock.
func (c *Class) Preloaded(table uint32) bool { return c.preloaded[table] }
