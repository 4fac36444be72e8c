package router

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
)

// TestUpdateLogCrashKeepsAcknowledged cuts the power under a router with
// a durable update log (a crash clone of a crashable in-memory FS) before
// every sync it asks for and after every acknowledged update: each
// clone's log, read back as a restarted router does, holds every update
// acknowledged before the crash, with its rows, and numbers on from at
// least the last of them (those the byte budget trimmed aside: every
// live worker holds them). The last clone, restarted as a router, catches
// up a worker that missed them all (with the log untrimmed).
func TestUpdateLogCrashKeepsAcknowledged(t *testing.T) {
	t.Run("whole", func(t *testing.T) { updateLogCrash(t, 0) })
	t.Run("trimmed", func(t *testing.T) { updateLogCrash(t, 60) })
}

// updateLogCrash runs TestUpdateLogCrashKeepsAcknowledged with a log
// budget of logBytes (0: the default).
func updateLogCrash(t *testing.T, logBytes int64) {
	mem := vfs.NewCrashableMem()
	type clone struct {
		fs    *vfs.MemFS
		point string
		acked int64
	}
	var (
		mu     sync.Mutex
		clones []clone
		acked  int64
		armed  bool
		syncs  int
	)
	r := rand.New(rand.NewPCG(7, 7))
	take := func(point string) {
		mu.Lock()
		defer mu.Unlock()
		clones = append(clones, clone{fs: mem.CrashClone(vfs.CrashCloneCfg{}), point: point, acked: acked})
		clones = append(clones, clone{fs: mem.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 50, RNG: rand.New(rand.NewPCG(r.Uint64(), 1))}),
			point: point + " (part unsynced)", acked: acked})
	}
	fs := errorfs.Wrap(mem, errorfs.InjectorFunc(func(op errorfs.Op) error {
		switch op.Kind {
		case errorfs.OpFileSync, errorfs.OpFileSyncData, errorfs.OpFileSyncTo:
			mu.Lock()
			syncs++
			on, n := armed, syncs
			mu.Unlock()
			if on {
				take(fmt.Sprintf("before sync %d (%s)", n, op.Path))
			}
		}
		return nil
	}))
	o := Options{UpdateLogDir: "log", UpdateLogFS: fs, UpdateQuorum: QuorumOne, UpdateLogBytes: logBytes}
	a := &seqCN{}
	rig := newUpdateRig(t, o, a)
	mu.Lock()
	armed = true
	mu.Unlock()
	const n = 12
	for i := 1; i <= n; i++ {
		if _, err := rig.update("t", int64(i), float32(10*i)); err != nil {
			t.Fatalf("update %d: %v", i, err)
		}
		mu.Lock()
		acked = int64(i)
		mu.Unlock()
		take(fmt.Sprintf("after update %d", i))
	}
	mu.Lock()
	armed = false
	mu.Unlock()
	rig.r.Close()

	maxFloor := int64(0)
	for _, c := range clones {
		func() {
			l, err := openUpdateLog("log", c.fs)
			if err != nil {
				t.Fatalf("%s: reopen: %v", c.point, err)
			}
			defer l.Close()
			rs, err := l.load()
			if err != nil {
				t.Fatalf("%s: load: %v", c.point, err)
			}
			if c.acked == 0 && len(rs) == 0 {
				return
			}
			if len(rs) != 1 || rs[0].model != "m" {
				t.Fatalf("%s: %d updates acknowledged, the log holds models %+v", c.point, c.acked, rs)
			}
			m := rs[0]
			maxFloor = max(maxFloor, m.floor)
			if m.next < c.acked || (logBytes == 0 && m.floor != 0) || m.floor+int64(len(m.log)) != m.next {
				t.Fatalf("%s: %d updates acknowledged, the log holds next %d floor %d and %d entries", c.point, c.acked, m.next, m.floor, len(m.log))
			}
			if logBytes > 0 && m.floor > c.acked {
				t.Fatalf("%s: %d updates acknowledged, the log was trimmed to %d", c.point, c.acked, m.floor)
			}
			for i, e := range m.log {
				seq := m.floor + int64(i+1)
				u := e.GetUpdate()
				if e.GetSeq() != seq || len(u.GetIds()) != 1 || u.GetIds()[0] != seq ||
					math.Float32frombits(binary.LittleEndian.Uint32(u.GetRows())) != float32(10*seq) {
					t.Fatalf("%s: entry %d of the log is %v", c.point, seq, e)
				}
			}
		}()
	}

	t.Logf("%d crash clones checked (%d syncs), the log trimmed up to %d", len(clones), syncs, maxFloor)
	if logBytes > 0 {
		if maxFloor == 0 {
			t.Errorf("the log was never trimmed")
		}
		return
	}
	// The router restarted on the last crash: a worker holding none of
	// the updates gets every one.
	last := clones[len(clones)-2] // exactly the synced bytes
	b := &seqCN{}
	rig = newStartingRig(t, Options{UpdateLogDir: "log", UpdateLogFS: last.fs, UpdateQuorum: QuorumOne}, b)
	defer rig.r.Close()
	rig.settle()
	rig.tick()
	if b.held() != n {
		t.Fatalf("after a crash and restart, a worker was caught up to %d of %d acknowledged updates", b.held(), n)
	}
	for i := int64(1); i <= n; i++ {
		if b.row(i) != float32(10*i) {
			t.Fatalf("row %d reads %v after the catch-up", i, b.row(i))
		}
	}
}
