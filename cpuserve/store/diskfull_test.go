package store

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"

	"github.com/prism-serve/prism/internal/diskfull/diskfulltest"
)

const diskFullEnvChild = "PRISM_STORE_DISKFULL_CHILD"

// TestDiskFullChild is TestDiskFullUpdateRefused's child: a store whose
// disk fills, given an update, a skipped number and lookups; then the
// disk is freed and the update given again. It prints each outcome.
func TestDiskFullChild(t *testing.T) {
	if os.Getenv(diskFullEnvChild) == "" {
		t.Skip("only run as TestDiskFullUpdateRefused's child process")
	}
	disk := diskfulltest.New()
	s, err := Open("db", &Options{FS: disk.FS(), HotBytes: -1, MemTableBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Ingest(context.Background(), writePlan(t, "m", []*testTable{{name: "a", rows: 10, dim: 4, seed: 1}}), IngestOptions{}); err != nil {
		t.Fatal(err)
	}
	before := lookupRow(t, s, "m", "a", 1, 4)
	disk.SetFull(true)
	_, err = s.UpsertSeq("m", "a", []int64{1}, fill(4, 9), 1)
	fmt.Printf("upsert: disk full %v: %v\n", errors.Is(err, ErrDiskFull), err)
	err = s.SkipSeq("m", 1)
	fmt.Printf("skip: disk full %v: %v\n", errors.Is(err, ErrDiskFull), err)
	// A bad update's number is taken by a write too.
	_, err = s.UpsertSeq("m", "a", []int64{99}, fill(4, 9), 1)
	fmt.Printf("bad upsert: disk full %v: %v\n", errors.Is(err, ErrDiskFull), err)
	seq, _ := s.AppliedSeq("m")
	fmt.Printf("full: applied %d, row unchanged %v\n", seq, fmt.Sprint(lookupRow(t, s, "m", "a", 1, 4)) == fmt.Sprint(before))
	disk.SetFull(false)
	if _, err := s.UpsertSeq("m", "a", []int64{1}, fill(4, 9), 1); err != nil {
		t.Fatal(err)
	}
	seq, _ = s.AppliedSeq("m")
	fmt.Printf("freed: applied %d, row updated %v\n", seq, fmt.Sprint(lookupRow(t, s, "m", "a", 1, 4)) == fmt.Sprint(fill(4, 9)))
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestDiskFullUpdateRefused: an update given a store whose disk is full
// ended the process (Pebble's fatal commit error on the write-ahead
// log's ENOSPC), so a worker serving reads died at its first update, and
// restarted it waited in Open until space was freed. It is refused
// (ErrDiskFull: nothing written, no number taken), the store keeps
// serving reads, and takes the same update once space is freed.
func TestDiskFullUpdateRefused(t *testing.T) {
	diskfulltest.Child(t, "TestDiskFullChild", diskFullEnvChild,
		"upsert: disk full true",
		"skip: disk full true",
		"bad upsert: disk full true",
		"full: applied 0, row unchanged true",
		"freed: applied 1, row updated true",
	)
}

// TestOpenOnFullDiskWaits: a store reopened over a write-ahead log on a
// full disk (a worker restarted after dying of ENOSPC) waited in Open,
// Pebble's flush of the log failing and retried without pause: a core
// spun, and the log took thousands of lines a second. The retries wait
// a second each; once space is freed Open goes on, the rows all there.
func TestOpenOnFullDiskWaits(t *testing.T) {
	disk := diskfulltest.New()
	var writes atomic.Int64
	fs := errorfs.Wrap(disk.FS(), errorfs.InjectorFunc(func(op errorfs.Op) error {
		if op.Kind == errorfs.OpFileWrite && disk.Full() {
			writes.Add(1)
		}
		return nil
	}))
	o := &Options{FS: fs, HotBytes: -1, MemTableBytes: 1 << 20}
	s, err := Open("db", o)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Ingest(context.Background(), writePlan(t, "m", []*testTable{{name: "a", rows: 10, dim: 4, seed: 1}}), IngestOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.UpsertSeq("m", "a", []int64{1}, fill(4, 9), 1); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil { // the upsert stays in the log, unflushed
		t.Fatal(err)
	}

	disk.SetFull(true)
	type opened struct {
		s   *Store
		err error
	}
	done := make(chan opened, 1)
	go func() {
		s, err := Open("db", o)
		done <- opened{s, err}
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
		t.Fatalf("Open once space was freed: %v", r.err)
	}
	defer r.s.Close()
	t.Logf("%d writes tried in 1.5s on the full disk", n)
	if n > 10 {
		t.Errorf("Open on a full disk tried %d writes in 1.5s: a busy loop", n)
	}
	if seq, _ := r.s.AppliedSeq("m"); seq != 1 || fmt.Sprint(lookupRow(t, r.s, "m", "a", 1, 4)) != fmt.Sprint(fill(4, 9)) {
		t.Errorf("after Open: applied %d, row %v", seq, lookupRow(t, r.s, "m", "a", 1, 4))
	}
}

// TestIngestDiskFull: an ingest of a new version whose disk fills
// part-way fails naming the cause, says that what it wrote stays (on the
// disk it lacks) and how to go on or drop it; the active version serves
// as before, the staging folder is empty, and run again once the disk
// has room the ingest resumes where it stopped.
func TestIngestDiskFull(t *testing.T) {
	mem := vfs.NewMem()
	var ssts atomic.Int64
	full := atomic.Bool{}
	fs := errorfs.Wrap(mem, errorfs.InjectorFunc(func(op errorfs.Op) error {
		if !strings.Contains(op.Path, stagingDir) {
			return nil
		}
		if op.Kind == errorfs.OpCreate && ssts.Add(1) > 3 {
			full.Store(true)
		}
		if op.Kind == errorfs.OpFileWrite && full.Load() {
			return &os.PathError{Op: "write", Path: op.Path, Err: syscall.ENOSPC}
		}
		return nil
	}))
	s, _ := openMem(t, &Options{FS: fs, HotBytes: -1})
	ctx := context.Background()
	if _, err := s.Ingest(ctx, writePlan(t, "m", []*testTable{{name: "a", rows: 10, dim: 4, seed: 1}}), IngestOptions{}); err != nil {
		t.Fatal(err)
	}
	v1 := lookupRow(t, s, "m", "a", 1, 4)
	ssts.Store(0)
	p2 := writePlan(t, "m", []*testTable{{name: "a", rows: 4000, dim: 4, seed: 2}})
	_, err := s.Ingest(ctx, p2, IngestOptions{SSTBytes: 8 << 10})
	if !errors.Is(err, syscall.ENOSPC) || !strings.Contains(err.Error(), "goes on where it stopped") {
		t.Fatalf("ingest on a disk that fills: %v", err)
	}
	t.Log(err)
	if got := lookupRow(t, s, "m", "a", 1, 4); fmt.Sprint(got) != fmt.Sprint(v1) {
		t.Errorf("the active version reads %v after the failed ingest, %v before", got, v1)
	}
	if vs, _ := s.Versions("m"); len(vs) != 1 {
		t.Errorf("versions after the failed ingest: %+v", vs)
	}
	if left, _ := mem.List(mem.PathJoin("db", stagingDir)); len(left) > 0 {
		t.Errorf("staging holds %v", left)
	}
	full.Store(false)
	ssts.Store(-1 << 40)
	rep, err := s.Ingest(ctx, p2, IngestOptions{SSTBytes: 8 << 10})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Version != 2 || !rep.Activated || rep.Tables[0].ResumedAt == 0 {
		t.Errorf("ingest run again: version %d activated %v resumed at %d", rep.Version, rep.Activated, rep.Tables[0].ResumedAt)
	}
}
