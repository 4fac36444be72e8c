package router

import (
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/internal/diskfull/diskfulltest"
)

const diskFullEnvChild = "PRISM_ROUTER_DISKFULL_CHILD"

// TestUpdateLogDiskFullChild is TestUpdateLogDiskFull's child: a router
// whose update log's disk fills, given an update; then the disk is
// freed. It prints each outcome.
func TestUpdateLogDiskFullChild(t *testing.T) {
	if os.Getenv(diskFullEnvChild) == "" {
		t.Skip("only run as TestUpdateLogDiskFull's child process")
	}
	disk := diskfulltest.New()
	a := &seqCN{}
	rig := newUpdateRig(t, Options{UpdateLogDir: "log", UpdateLogFS: disk.FS(), UpdateQuorum: QuorumOne}, a)
	if _, err := rig.update("t", 1, 1); err != nil {
		t.Fatal(err)
	}
	disk.SetFull(true)
	_, err := rig.update("t", 1, 2)
	fmt.Printf("update 2: %v, names the log %v: %v\n", status.Code(err), strings.Contains(err.Error(), "update log"), err)
	rig.r.upd.wait()
	rig.tick()
	fmt.Printf("full: a holds %d, serves %v\n", a.held(), rig.servers()[0])
	disk.SetFull(false)
	rig.tick() // the heartbeat's rewrite
	rig.tick() // and the catch-up of update 2, now on disk
	r, err := rig.update("t", 1, 3)
	rig.r.upd.wait()
	fmt.Printf("freed: update 3 %v %v, a holds %d, row %v\n", r.GetWorkers(), err, a.held(), a.row(1))
}

// TestUpdateLogDiskFull: the router's update log on a full disk ended
// the router (Pebble's fatal commit error on the log's ENOSPC): Recommend
// went with it, and restarted it waited in Open until space was freed.
// The write is refused before it begins instead: the update is answered
// Unavailable naming the log, neither sent nor acknowledged, the workers
// keep serving, and once space is freed the heartbeat's rewrite lets
// updates through again.
func TestUpdateLogDiskFull(t *testing.T) {
	diskfulltest.Child(t, "TestUpdateLogDiskFullChild", diskFullEnvChild,
		"update 2: Unavailable, names the log true",
		"full: a holds 1, serves true",
		"freed: update 3 1 <nil>, a holds 3, row 3",
	)
}

// TestUpdateLogOpenOnFullDiskWaits: a router restarted over its update
// log on a full disk waited in Open, Pebble's flush of the log's
// write-ahead log failing and retried without pause (a core spun, the
// log took thousands of lines a second). The retries wait a second
// each; once space is freed Open goes on, the log whole.
func TestUpdateLogOpenOnFullDiskWaits(t *testing.T) {
	disk := diskfulltest.New()
	var writes atomic.Int64
	fs := errorfs.Wrap(disk.FS(), errorfs.InjectorFunc(func(op errorfs.Op) error {
		if op.Kind == errorfs.OpFileWrite && disk.Full() {
			writes.Add(1)
		}
		return nil
	}))
	l, err := openUpdateLog("log", fs)
	if err != nil {
		t.Fatal(err)
	}
	e := &prismv1.ApplyUpdateRequest{Seq: 1, Update: &prismv1.UpdateRequest{Model: "m", Table: "t", Ids: []int64{1}}}
	if err := l.write([]message{{Type: msgPersist, Model: "m", Persist: &logChange{Next: 1, Committed: 1, Entry: e}}}); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil { // the write stays in Pebble's log, unflushed
		t.Fatal(err)
	}

	disk.SetFull(true)
	type opened struct {
		l   *updateLog
		err error
	}
	done := make(chan opened, 1)
	go func() {
		l, err := openUpdateLog("log", fs)
		done <- opened{l, err}
	}()
	time.Sleep(1500 * time.Millisecond)
	n := writes.Load()
	disk.SetFull(false)
	var r opened
	select {
	case r = <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Open still waits 10s after space was freed")
	}
	if r.err != nil {
		t.Fatalf("open once space was freed: %v", r.err)
	}
	defer r.l.Close()
	t.Logf("%d writes tried in 1.5s on the full disk", n)
	if n > 10 {
		t.Errorf("open on a full disk tried %d writes in 1.5s: a busy loop", n)
	}
	got, err := r.l.load()
	if err != nil || len(got) != 1 || len(got[0].log) != 1 || got[0].log[0].GetSeq() != 1 {
		t.Fatalf("log read back: %+v %v", got, err)
	}
}
