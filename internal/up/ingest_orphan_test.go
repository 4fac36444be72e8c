package up

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"
)

const ingestChildEnv = "PRISM_TEST_INGEST_EXE"

// ingestInChild, run by TestMain in a child: ingestShards with a fake
// prism (exe) that sleeps, until the test kills this process.
func ingestInChild(exe string) {
	db := filepath.Join(filepath.Dir(exe), "db")
	c := Config{Exe: exe, DB: db, EmbeddingWorkers: 1, Replicas: 1, Stderr: os.Stderr}
	err := ingestShards(context.Background(), c, []sharded{{dir: "plan", model: "m", shards: 1}})
	fmt.Println(err)
}

// TestIngestDiesWithUp: prism up killed (SIGKILL) while it runs a
// prism ingest --shard child takes the child with it, as it does the
// tiers (Pdeathsig): an ingest left running holds the shard's store
// lock, and the next prism up fails on it.
func TestIngestDiesWithUp(t *testing.T) {
	dir := t.TempDir()
	exe := filepath.Join(dir, "fake-prism")
	pidFile := filepath.Join(dir, "pid")
	script := "#!/bin/sh\necho $$ > " + pidFile + ".tmp && mv " + pidFile + ".tmp " + pidFile + "\nexec sleep 30\n"
	if err := os.WriteFile(exe, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	up := exec.Command(os.Args[0], "-test.run=^$")
	up.Env = append(os.Environ(), ingestChildEnv+"="+exe)
	if err := up.Start(); err != nil {
		t.Fatal(err)
	}
	var pid int
	for deadline := time.Now().Add(10 * time.Second); pid == 0 && time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		b, _ := os.ReadFile(pidFile)
		pid, _ = strconv.Atoi(string(bytes.TrimSpace(b)))
	}
	if pid == 0 {
		up.Process.Kill()
		up.Wait()
		t.Fatal("the fake ingest never started")
	}
	up.Process.Kill()
	up.Wait()
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if syscall.Kill(pid, 0) != nil {
			return
		}
	}
	syscall.Kill(pid, syscall.SIGKILL)
	t.Fatalf("the ingest child (pid %d) outlived prism up killed with SIGKILL", pid)
}
