package store

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
)

const fatalEnvChild = "PRISM_STORE_FATAL_CHILD"

// returningLogger is an Options.Logger whose Fatalf returns, as an
// adapter to another logging library's may.
type returningLogger struct{}

func (returningLogger) Infof(string, ...any) {}
func (returningLogger) Errorf(f string, a ...any) {
	fmt.Fprintf(os.Stderr, f+"\n", a...)
}
func (returningLogger) Fatalf(f string, a ...any) {
	fmt.Fprintf(os.Stderr, "logger: "+f+"\n", a...)
}

// TestFatalCommitChild is TestFailedSyncNotAcknowledged's child: an
// upsert whose WAL sync fails, on a store given a Logger whose Fatalf
// returns. It prints "ack" if the upsert was acknowledged, and "lost"
// if a crash then loses it.
func TestFatalCommitChild(t *testing.T) {
	if os.Getenv(fatalEnvChild) == "" {
		t.Skip("only run as TestFailedSyncNotAcknowledged's child process")
	}
	mem := vfs.NewCrashableMem()
	fail := &errorfs.Toggle{Injector: errorfs.InjectorFunc(func(op errorfs.Op) error {
		switch op.Kind {
		case errorfs.OpFileSync, errorfs.OpFileSyncData, errorfs.OpFileSyncTo:
			return errorfs.ErrInjected
		}
		return nil
	})}
	s, err := Open("db", &Options{FS: errorfs.Wrap(mem, fail), HotBytes: -1, Logger: returningLogger{}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Ingest(context.Background(), writePlan(t, "m", []*testTable{{name: "a", rows: 10, dim: 4, seed: 1}}), IngestOptions{}); err != nil {
		t.Fatal(err)
	}
	fail.On()
	if _, err := s.UpsertSeq("m", "a", []int64{1}, fill(4, 9), 1); err != nil {
		fmt.Println("refused", err)
		return
	}
	fmt.Println("ack")
	cs, err := Open("db", &Options{FS: mem.CrashClone(vfs.CrashCloneCfg{}), HotBytes: -1})
	if err != nil {
		t.Fatal(err)
	}
	if k, _ := cs.AppliedSeq("m"); k < 1 {
		fmt.Println("lost")
	}
}

// TestFailedSyncNotAcknowledged: a write-ahead log sync that fails is
// fatal to Pebble ("fatal commit error"), which then calls the Logger's
// Fatalf; a Logger whose Fatalf returned let Pebble's Apply return nil,
// and the upsert was acknowledged as durable while it was not on disk
// (a crash lost it). The store ends the process whatever the Logger.
func TestFailedSyncNotAcknowledged(t *testing.T) {
	if testing.Short() {
		t.Skip("spawns a process")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestFatalCommitChild$", "-test.v=false")
	// The child dies at Pebble's fatal error before its t.TempDir
	// cleanup runs: its temporary folders go inside this test's.
	cmd.Env = append(os.Environ(), fatalEnvChild+"=1", "TMPDIR="+t.TempDir())
	out, err := cmd.CombinedOutput()
	if strings.Contains(string(out), "ack") {
		t.Fatalf("an upsert whose sync failed was acknowledged (child: %v):\n%s", err, out)
	}
	if err == nil || !strings.Contains(string(out), "fatal commit error") {
		t.Fatalf("the child did not end at Pebble's fatal commit error (%v):\n%s", err, out)
	}
}
