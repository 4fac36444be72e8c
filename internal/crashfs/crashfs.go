// Package crashfs cuts the power under a Pebble database in tests: a
// crashable in-memory file system that, while armed, takes crash clones
// before every sync the database asks for, and at the points a test
// names, each clone tagged with what the test had acknowledged then.
// A test reopens every clone and checks that what was acknowledged
// before it survived (the store's and the router's update log's
// durability tests).
package crashfs

import (
	"fmt"
	"math/rand/v2"
	"sync"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
)

// Clone is the file system as a crash at Point would leave it, with the
// test's state S then.
type Clone[S any] struct {
	FS    *vfs.MemFS
	Point string
	State S
}

// Cutter is a crashable in-memory file system taking Clones.
type Cutter[S any] struct {
	mem *vfs.MemFS
	fs  vfs.FS
	// partial: each point also gets a clone keeping half the unsynced
	// data (written, not synced: a crash may keep any of it).
	partial bool

	mu     sync.Mutex
	rng    *rand.Rand
	armed  bool
	syncs  int
	state  S
	clones []Clone[S]
}

// New is a Cutter; with partial each point takes two clones, the synced
// bytes alone and those with half the unsynced data (drawn from seed).
func New[S any](partial bool, seed uint64) *Cutter[S] {
	c := &Cutter[S]{mem: vfs.NewCrashableMem(), partial: partial, rng: rand.New(rand.NewPCG(seed, 1))}
	c.fs = errorfs.Wrap(c.mem, errorfs.InjectorFunc(func(op errorfs.Op) error {
		switch op.Kind {
		case errorfs.OpFileSync, errorfs.OpFileSyncData, errorfs.OpFileSyncTo:
			c.mu.Lock()
			c.syncs++
			on, n := c.armed, c.syncs
			c.mu.Unlock()
			if on {
				c.Take(fmt.Sprintf("before sync %d (%s)", n, op.Path))
			}
		}
		return nil
	}))
	return c
}

// FS is the file system to open the database on.
func (c *Cutter[S]) FS() vfs.FS { return c.fs }

// Arm starts (on) or stops taking a clone before every sync.
func (c *Cutter[S]) Arm(on bool) {
	c.mu.Lock()
	c.armed = on
	c.mu.Unlock()
}

// Set changes the state the next clones are tagged with.
func (c *Cutter[S]) Set(f func(*S)) {
	c.mu.Lock()
	f(&c.state)
	c.mu.Unlock()
}

// Take takes the clone(s) of a crash now, at point.
func (c *Cutter[S]) Take(point string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.clones = append(c.clones, Clone[S]{FS: c.mem.CrashClone(vfs.CrashCloneCfg{}), Point: point, State: c.state})
	if c.partial {
		cfg := vfs.CrashCloneCfg{UnsyncedDataPercent: 50, RNG: rand.New(rand.NewPCG(c.rng.Uint64(), 1))}
		c.clones = append(c.clones, Clone[S]{FS: c.mem.CrashClone(cfg), Point: point + " (part unsynced)", State: c.state})
	}
}

// Clones are the clones taken so far, in order.
func (c *Cutter[S]) Clones() []Clone[S] {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]Clone[S](nil), c.clones...)
}

// Syncs counts the syncs asked for so far.
func (c *Cutter[S]) Syncs() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.syncs
}
