package up

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prism-serve/prism/internal/readyline"
	"github.com/prism-serve/prism/internal/supervise"
)

// TestStartWorkersAtOnce: up starts its workers together and waits for
// them together. Started one after another, its start-up was the sum
// of theirs, and each dense worker loads and warms up every model: 40
// models on two CPU dense workers and one embedding worker took 5.7 +
// 1.8 + 0.5 s in turn, and on a GPU host of 16 dense workers the wait
// grew by models x workers. A worker that fails stops the wait at once,
// not after the slow ones are ready.
func TestStartWorkersAtOnce(t *testing.T) {
	dir := t.TempDir()
	ready := readyline.New("fake worker ready on ")
	// A worker that takes a while to load its models, then serves; or
	// one that fails at once (its first argument "fail").
	exe := filepath.Join(dir, "fake-worker")
	// (Its load does not hold its output: a sleep left running by a
	// stopped shell kept the supervisor's Wait.)
	script := "#!/bin/sh\nif [ \"$1\" = fail ]; then echo 'no such plan' >&2; exit 3; fi\n" +
		"sleep \"$1\" >/dev/null 2>&1\necho '" + ready.Prefix() + "127.0.0.1:1'\nexec sleep 60\n"
	if err := os.WriteFile(exe, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) (time.Duration, error) {
		sup := supervise.New(supervise.Options{Starter: &supervise.Exec{Path: exe, Stderr: io.Discard}, Stdout: io.Discard, Grace: time.Second})
		defer sup.Shutdown()
		var ws []*supervise.Child
		for i, a := range args {
			// "eN": an embedding worker (Stage) taking N s.
			c := &supervise.Child{Name: fmt.Sprintf("worker%d", i), Ready: ready, Args: []string{a}}
			if n, ok := strings.CutPrefix(a, "e"); ok {
				c.Stage, c.Args = stageEmbedding, []string{n}
			}
			ws = append(ws, c)
		}
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		start := time.Now()
		err := startWorkers(ctx, sup, ws, 30*time.Second)
		return time.Since(start), err
	}

	// Four workers of 1.5 s each: about 1.5 s together, 6 s in turn.
	took, err := run("1.5", "1.5", "1.5", "1.5")
	if err != nil {
		t.Fatal(err)
	}
	if took > 4*time.Second {
		t.Errorf("4 workers ready after 1.5 s each: start-up took %s, want about 1.5 s (they started one after another)", took.Round(time.Millisecond))
	}

	// Embedding workers start one after another (each may ingest its
	// store at its first start: nothing gained sharing the disk), beside
	// the dense ones: two of 1.5 s and two dense of 1.5 s take 3 s.
	took, err = run("1.5", "e1.5", "e1.5", "1.5")
	if err != nil {
		t.Fatal(err)
	}
	if took < 2900*time.Millisecond || took > 5*time.Second {
		t.Errorf("2 dense and 2 embedding workers of 1.5 s: start-up took %s, want about 3 s (the embedding workers in turn, the dense ones beside them)", took.Round(time.Millisecond))
	}

	// The last one fails at once: reported then, not after the others'
	// 20 s.
	took, err = run("20", "20", "fail")
	if err == nil || !strings.Contains(err.Error(), "worker2") {
		t.Fatalf("a failing worker: %v, want its error", err)
	}
	if took > 10*time.Second {
		t.Errorf("a worker failed at once: reported after %s, want at once", took.Round(time.Millisecond))
	}
}

// countingStarter counts the processes it starts: each prints nothing
// and runs until signalled.
type countingStarter struct {
	mu sync.Mutex
	n  int
}

type idleProc struct {
	w    *io.PipeWriter
	once sync.Once
	done chan struct{}
}

func (p *idleProc) Signal(os.Signal) error {
	p.once.Do(func() { p.w.Close(); close(p.done) })
	return nil
}

func (p *idleProc) Wait() error { <-p.done; return nil }

func (s *countingStarter) Start(*supervise.Child) (supervise.Process, io.Reader, error) {
	s.mu.Lock()
	s.n++
	s.mu.Unlock()
	r, w := io.Pipe()
	return &idleProc{w: w, done: make(chan struct{})}, r, nil
}

// TestStartWorkersCancelled: up stopped (its context ended) before the
// workers' start starts none of them: started together, every worker
// was spawned, loading its models, only to be stopped at once (one after
// another, the first one's start ended the loop).
func TestStartWorkersCancelled(t *testing.T) {
	st := &countingStarter{}
	sup := supervise.New(supervise.Options{Starter: st, Stdout: io.Discard, Grace: time.Second})
	defer sup.Shutdown()
	var ws []*supervise.Child
	for i := range 8 {
		ws = append(ws, &supervise.Child{Name: fmt.Sprintf("worker%d", i), Ready: readyline.New("ready on ")})
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := startWorkers(ctx, sup, ws, 30*time.Second); err == nil {
		t.Fatal("started with its context ended: no error")
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.n > 1 {
		t.Fatalf("%d worker processes started with up's context ended, want none (at most the first)", st.n)
	}
}
