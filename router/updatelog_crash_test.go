package router

import (
	"encoding/binary"
	"fmt"
	"math"
	"testing"

	"github.com/prism-serve/prism/internal/crashfs"
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
	t.Run("trimmed", func(t *testing.T) { updateLogCrash(t, 960) })
}

// updateLogCrash runs TestUpdateLogCrashKeepsAcknowledged with a log
// budget of logBytes (0: the default).
func updateLogCrash(t *testing.T, logBytes int64) {
	cut := crashfs.New[int64](true, 7) // the state: updates acknowledged
	fs := cut.FS()
	o := Options{UpdateLogDir: "log", UpdateLogFS: fs, UpdateQuorum: QuorumOne, UpdateLogBytes: logBytes}
	a := &seqCN{}
	rig := newUpdateRig(t, o, a)
	cut.Arm(true)
	const n = 12
	for i := 1; i <= n; i++ {
		if _, err := rig.update("t", int64(i), float32(10*i)); err != nil {
			t.Fatalf("update %d: %v", i, err)
		}
		cut.Set(func(acked *int64) { *acked = int64(i) })
		cut.Take(fmt.Sprintf("after update %d", i))
	}
	cut.Arm(false)
	rig.r.Close()

	maxFloor := int64(0)
	clones := cut.Clones()
	for _, c := range clones {
		func() {
			l, err := openUpdateLog("log", c.FS)
			if err != nil {
				t.Fatalf("%s: reopen: %v", c.Point, err)
			}
			defer l.Close()
			rs, err := l.load()
			if err != nil {
				t.Fatalf("%s: load: %v", c.Point, err)
			}
			if c.State == 0 && len(rs) == 0 {
				return
			}
			if len(rs) != 1 || rs[0].model != "m" {
				t.Fatalf("%s: %d updates acknowledged, the log holds models %+v", c.Point, c.State, rs)
			}
			m := rs[0]
			maxFloor = max(maxFloor, m.floor)
			if m.next < c.State || (logBytes == 0 && m.floor != 0) || m.floor+int64(len(m.log)) != m.next {
				t.Fatalf("%s: %d updates acknowledged, the log holds next %d floor %d and %d entries", c.Point, c.State, m.next, m.floor, len(m.log))
			}
			if logBytes > 0 && m.floor > c.State {
				t.Fatalf("%s: %d updates acknowledged, the log was trimmed to %d", c.Point, c.State, m.floor)
			}
			for i, e := range m.log {
				seq := m.floor + int64(i+1)
				u := e.GetUpdate()
				if e.GetSeq() != seq || len(u.GetIds()) != 1 || u.GetIds()[0] != seq ||
					math.Float32frombits(binary.LittleEndian.Uint32(u.GetRows())) != float32(10*seq) {
					t.Fatalf("%s: entry %d of the log is %v", c.Point, seq, e)
				}
			}
		}()
	}

	t.Logf("%d crash clones checked (%d syncs), the log trimmed up to %d", len(clones), cut.Syncs(), maxFloor)
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
	rig = newStartingRig(t, Options{UpdateLogDir: "log", UpdateLogFS: last.FS, UpdateQuorum: QuorumOne}, b)
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
