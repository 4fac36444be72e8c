package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prism-serve/prism/tune"
)

// TestTuneStoppedMidTrial: prism tune given SIGTERM in its second trial
// stops that trial's prism up and its tiers (none is left running), says
// the best so far and how to serve it (it said only "context
// canceled"), keeps the first trial in tune.json (stop "interrupted")
// and in the prior, and a rerun on the same store, folder and prior
// runs.
func TestTuneStoppedMidTrial(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short: real prism up trials")
	}
	_, db, out, prior, args := tuneGrid(t)
	dir := filepath.Dir(db) // every file of the test's

	cmd := exec.Command(prismBin, args...)
	var stdout bytes.Buffer
	cmd.Stdout = &stdout
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var text strings.Builder
	second := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stderr)
		once := sync.Once{}
		for sc.Scan() {
			mu.Lock()
			text.WriteString(sc.Text() + "\n")
			mu.Unlock()
			if strings.HasPrefix(sc.Text(), "trial 1/2 ") { // its result: the second starts

				once.Do(func() { close(second) })
			}
		}
	}()
	select {
	case <-second:
	case <-time.After(3 * time.Minute):
		cmd.Process.Kill()
		t.Fatalf("no second trial in 3 minutes:\n%s", text.String())
	}
	// Into the second trial: prism up starting or the load generator
	// running.
	time.Sleep(4 * time.Second)
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err = <-done:
	case <-time.After(time.Minute):
		cmd.Process.Kill()
		t.Fatal("tune still running a minute after SIGTERM")
	}
	mu.Lock()
	all := text.String() + stdout.String()
	mu.Unlock()
	if err == nil {
		t.Fatalf("tune stopped mid-run exited 0:\n%s", all)
	}
	if !strings.Contains(stdout.String(), "tune: best so far, of 1 trials (interrupted)") || !strings.Contains(stdout.String(), "--config "+filepath.Join(out, tune.File)) {
		t.Errorf("tune stopped mid-run does not say its best so far and how to serve it:\n%s", all)
	}
	// Every process of this test's stack names dir in its arguments.
	if left := processesNaming(dir); len(left) > 0 {
		t.Errorf("after tune exited, processes of its trial still run:\n%s", strings.Join(left, "\n"))
	}
	var rep tune.Report
	if b, err := os.ReadFile(filepath.Join(out, tune.File)); err != nil || json.Unmarshal(b, &rep) != nil {
		t.Fatalf("tune.json: %v", err)
	}
	if rep.Stop != tune.StopInterrupted || len(rep.Trials) != 1 || rep.Best == nil {
		t.Errorf("tune.json: stop %q, %d trials, best %v; want interrupted, the first trial, its best", rep.Stop, len(rep.Trials), rep.Best)
	}
	if recs, err := tune.ReadPrior(prior); err != nil || len(recs) != 1 {
		t.Errorf("prior: %d records, %v; want the first trial", len(recs), err)
	}
	// A rerun: the store unlocked, the ports free.
	if text, err := run(t, nil, append(args, "--max-trials", "1")...); err != nil {
		t.Fatalf("rerun after the stop: %v\n%s", err, text)
	}
}

// processesNaming lists the processes (pid and command line) whose
// command line contains s.
func processesNaming(s string) []string {
	var out []string
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if e.Name()[0] < '0' || e.Name()[0] > '9' {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || !bytes.Contains(b, []byte(s)) {
			continue
		}
		out = append(out, e.Name()+": "+string(bytes.ReplaceAll(b, []byte{0}, []byte{' '})))
	}
	return out
}
