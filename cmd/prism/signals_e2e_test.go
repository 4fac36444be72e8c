package main

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prism-serve/prism/internal/readyline"
)

// waitLog waits up to within for p's stderr to hold s.
func waitLog(t *testing.T, p *proc, s string, within time.Duration) {
	t.Helper()
	for end := time.Now().Add(within); !strings.Contains(p.log.String(), s); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("no %q in its log after %v:\n%s", s, within, p.log.String())
		}
	}
}

// exitWithin waits up to within for p to exit and returns how long it
// took, failing the test (and killing p) past it.
func exitWithin(t *testing.T, p *proc, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	done := make(chan struct{})
	go func() { p.cmd.Wait(); close(done) }()
	select {
	case <-done:
		return time.Since(start)
	case <-time.After(within):
		p.cmd.Process.Kill()
		<-done
		t.Fatalf("still running %v on:\n%s", within, p.log.String())
		return 0
	}
}

// alive says whether process pid exists (a zombie counts: its parent
// has not reaped it).
func alive(pid int) bool {
	return !errors.Is(syscall.Kill(pid, 0), syscall.ESRCH)
}

// TestUpSecondSignalKills: a user presses Ctrl-C at prism up whose
// embedding worker hangs (stopped: it cannot drain), then Ctrl-C again.
// The second one kills the tiers at once and up exits, saying which it
// killed, and leaves none of them running; a prism up on the same store
// then starts. The second Ctrl-C was swallowed: up waited out the
// worker's 15 s grace whatever the user pressed.
func TestUpSecondSignalKills(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	_, part, _ := partitioned(t, dir, "dlrm-tiny")
	db := filepath.Join(dir, "db")
	args := []string{"up", "--model", part, "--addr", "127.0.0.1:0", "--db", db, "--dense-workers", "1", "--insecure"}
	u := startProc(t, readyline.Up, args...)
	var kids []int
	for _, name := range []string{"serve router", "serve embedding", "serve dense"} {
		pid := childPID(t, u.cmd.Process.Pid, name)
		if pid == 0 {
			t.Fatalf("no %q child of prism up", name)
		}
		kids = append(kids, pid)
	}
	emb := kids[1]
	syscall.Kill(emb, syscall.SIGSTOP)
	t.Cleanup(func() {
		if alive(emb) {
			syscall.Kill(emb, syscall.SIGKILL)
			syscall.Kill(emb, syscall.SIGCONT)
		}
	})
	u.cmd.Process.Signal(syscall.SIGINT)
	waitLog(t, u, "up: stopping", 10*time.Second)
	time.Sleep(500 * time.Millisecond) // into the drain
	u.cmd.Process.Signal(syscall.SIGINT)
	took := exitWithin(t, u, 40*time.Second)
	t.Logf("up exited %v after the second Ctrl-C", took.Round(time.Millisecond))
	if took > 5*time.Second {
		t.Errorf("up exited %v after the second Ctrl-C: it waited for its hung worker instead of killing it", took.Round(time.Millisecond))
	}
	if !strings.Contains(u.log.String(), "killing embedding0: stop forced") {
		t.Errorf("up's log does not say it killed the hung worker:\n%s", u.log.String())
	}
	for _, pid := range kids {
		if alive(pid) {
			t.Errorf("child %d of prism up still runs after it exited", pid)
		}
	}
	// The store of the killed worker opens, its lock gone: up starts.
	startProc(t, readyline.Up, args...)
}

// TestTuneKilledLeavesNoLoadGenerator: prism tune killed outright
// (SIGKILL: the kubelet after the grace, the OOM killer) while a trial's
// load generator runs leaves no process of the trial running: prism up
// and its tiers stop (they had Pdeathsig), and so does the load
// generator. It lived on for the rest of its find-max steps (49 s
// measured with the default 8 steps of 6 s), sending to a stack that was
// gone and writing its result into a tune folder no run owned.
func TestTuneKilledLeavesNoLoadGenerator(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("-short: a real prism up trial")
	}
	_, db, _, _, args := tuneGrid(t)
	dir := filepath.Dir(db) // every process of the test's names it
	args = append(args, "--steps", "8", "--step", "5s")
	cmd := exec.Command(prismBin, args...)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	var lg int
	for end := time.Now().Add(2 * time.Minute); lg == 0; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("no load generator child of prism tune in 2 minutes")
		}
		lg = childPID(t, cmd.Process.Pid, "loadgen --target")
	}
	time.Sleep(time.Second) // into its first step
	cmd.Process.Kill()
	cmd.Wait()
	var left []string
	for end := time.Now().Add(15 * time.Second); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		if left = processesNaming(dir); len(left) == 0 {
			break
		}
	}
	if len(left) > 0 {
		t.Errorf("15 s after prism tune was killed, processes of its trial still run:\n%s", strings.Join(left, "\n"))
	}
	if alive(lg) {
		syscall.Kill(lg, syscall.SIGKILL)
	}
}

// TestPartitionInterrupted: prism partition stopped while it writes the
// tables (Ctrl-C, then SIGKILL) leaves no output folder, and each next
// run into the same folder removes the hidden partial folder the
// stopped run left beside it, saying so, and writes the output whole.
// They were never removed: each stopped run left one as big as the
// tables written so far (129 MiB for one stopped at 60% of dlrm-kaggle
// at --rows-scale 0.1).
func TestPartitionInterrupted(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	mdir := filepath.Join(dir, "model")
	// Tables past 64 MiB, so that the progress bar shows the writing.
	if text, err := run(t, nil, "models", "build", "dlrm-kaggle", "--rows-scale", "0.035", "-o", mdir); err != nil {
		t.Fatalf("%v: %s", err, text)
	}
	model, out := filepath.Join(mdir, "model.onnx"), filepath.Join(dir, "part")
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGKILL} {
		cmd := exec.Command(prismBin, "partition", model, "-o", out)
		var stderr syncBuffer
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		for end := time.Now().Add(time.Minute); !strings.Contains(stderr.String(), "writing tables: "); time.Sleep(time.Millisecond) {
			if time.Now().After(end) {
				cmd.Process.Kill()
				t.Fatalf("no progress of the tables' writing in a minute:\n%s", stderr.String())
			}
		}
		cmd.Process.Signal(sig)
		if err := cmd.Wait(); err == nil {
			t.Skipf("partition finished before the %v reached it", sig)
		}
		if _, err := os.Stat(out); !errors.Is(err, os.ErrNotExist) {
			t.Fatalf("after %v, the output folder exists (%v): a partial one taken as whole", sig, err)
		}
		// Its own, the earlier stopped run's removed as it started.
		if got := partials(dir); len(got) != 1 {
			t.Errorf("after %v: partial folders %v beside the output folder, want the stopped run's alone", sig, got)
		}
	}
	text, err := run(t, nil, "partition", model, "-o", out)
	if err != nil {
		t.Fatalf("partition after two stopped runs: %v\n%s", err, text)
	}
	if n := strings.Count(text, "the partial output of an earlier run stopped part way"); n != 1 {
		t.Errorf("partition says it removed %d partial outputs, want 1:\n%s", n, text)
	}
	if got := partials(dir); len(got) > 0 {
		t.Errorf("%v left beside the output folder", got)
	}
	if _, err := os.Stat(filepath.Join(out, "plan.json")); err != nil {
		t.Error(err)
	}
}

// TestIngestInterrupted: prism ingest given SIGINT or SIGTERM while it
// writes the tables exits non-zero saying that what it wrote is kept
// and to run it again, and the same command then completes, the store
// holding the plan (--if-changed finds nothing to do). SIGTERM (a Pod
// deleted during the chart's ingest step) killed it on the spot with
// no word; SIGINT said only "context canceled".
func TestIngestInterrupted(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	mdir, part := filepath.Join(dir, "model"), filepath.Join(dir, "part")
	if text, err := run(t, nil, "models", "build", "dlrm-kaggle", "--rows-scale", "0.035", "-o", mdir); err != nil {
		t.Fatalf("%v: %s", err, text)
	}
	if text, err := run(t, nil, "partition", filepath.Join(mdir, "model.onnx"), "-o", part); err != nil {
		t.Fatalf("%v: %s", err, text)
	}
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM} {
		t.Run(sig.String(), func(t *testing.T) {
			db := filepath.Join(dir, "db-"+strings.ReplaceAll(sig.String(), " ", "-"))
			cmd := exec.Command(prismBin, "ingest", part, "--db", db)
			var stderr syncBuffer
			cmd.Stderr = &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			for end := time.Now().Add(time.Minute); !strings.Contains(stderr.String(), "ingest: "); time.Sleep(time.Millisecond) {
				if time.Now().After(end) {
					cmd.Process.Kill()
					t.Fatalf("no progress of the ingest in a minute:\n%s", stderr.String())
				}
			}
			cmd.Process.Signal(sig)
			if err := cmd.Wait(); err == nil {
				t.Skipf("ingest finished before the %v reached it", sig)
			}
			if !strings.Contains(stderr.String(), "run the same command again") {
				t.Errorf("ingest stopped by %v does not say what to do:\n%s", sig, stderr.String())
			}
			if text, err := run(t, nil, "ingest", part, "--db", db); err != nil {
				t.Fatalf("ingest again: %v\n%s", err, text)
			}
			text, err := run(t, nil, "ingest", part, "--db", db, "--if-changed")
			if err != nil || !strings.Contains(text, "holds the plan's tables already") {
				t.Errorf("after the ingest run again, the store does not hold the plan: %v\n%s", err, text)
			}
		})
	}
}

// partials lists the hidden partial folders of prism partition in dir.
func partials(dir string) []string {
	var out []string
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if strings.Contains(e.Name(), ".partial-") {
			out = append(out, e.Name())
		}
	}
	return out
}

// syncBuffer is a bytes.Buffer safe for a process's writes and a test's
// reads at once.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// TestLoadgenTerminated: a load generator sent SIGTERM (a container
// stopped, a CI job's timeout) stops as Ctrl-C stops it, printing and
// writing its partial result (it ended without either).
func TestLoadgenTerminated(t *testing.T) {
	t.Parallel()
	out := filepath.Join(t.TempDir(), "lg")
	cmd := exec.Command(prismBin, "loadgen", "--fake", "--model", "dlrm-tiny", "--candidates", "10", "--rate", "50", "--duration", "1m", "--out", out)
	var stdout, stderr syncBuffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond)
	cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		cmd.Process.Kill()
		t.Fatalf("loadgen still running 20s after SIGTERM:\n%s%s", stdout.String(), stderr.String())
	}
	if !strings.Contains(stdout.String()+stderr.String(), "throughput") {
		t.Errorf("no partial result printed:\n%s%s", stdout.String(), stderr.String())
	}
	if b, err := os.ReadFile(filepath.Join(out, "summary.json")); err != nil {
		t.Errorf("no summary written: %v\n%s%s", err, stdout.String(), stderr.String())
	} else if !strings.Contains(string(b), `"interrupted": true`) || !strings.Contains(stdout.String(), "interrupted: a partial result") {
		t.Errorf("the partial result is not marked interrupted:\n%s\n%s", b, stdout.String())
	}
}
