package gpuserve

import (
	"log/slog"
	"runtime"
	"testing"

	"github.com/prism-serve/prism/internal/ort"
)

// TestThreadsShareCores: --threads 0 with --sessions S gives each of the
// S ONNX Runtime sessions its share of the cores, not S full pools (S
// times as many spinning or sleeping threads as cores, all running at
// once when the sessions do); one session is left ONNX Runtime's
// choice, and a number given is every session's.
func TestThreadsShareCores(t *testing.T) {
	dir := tinyPlan(t)
	cores := runtime.GOMAXPROCS(0)
	for _, c := range []struct {
		threads, sessions, want int
	}{
		{0, 1, 0},
		{0, 2, max(1, cores/2)},
		{0, 4, max(1, cores/4)},
		{3, 2, 3},
	} {
		var got []int
		newSession = func(path string, o ort.SessionOptions) (*ort.Session, error) {
			got = append(got, o.IntraOpThreads)
			return ort.NewSession(path, o)
		}
		s, err := New(Options{Plans: []string{dir}, Threads: c.threads, Sessions: c.sessions, Batch: BatchOptions{MaxBatch: 16}, Logger: slog.New(slog.DiscardHandler)})
		newSession = ort.NewSession
		if err != nil {
			t.Fatal(err)
		}
		s.Close()
		if len(got) != c.sessions {
			t.Fatalf("threads %d, sessions %d: %d sessions made", c.threads, c.sessions, len(got))
		}
		for _, n := range got {
			if n != c.want {
				t.Errorf("threads %d, sessions %d on %d cores: a session's intra-op threads %d, want %d", c.threads, c.sessions, cores, n, c.want)
				break
			}
		}
	}
}

// TestSessionThreads: the runs that may be in flight at once share the
// cores: one model's sessions, or with several models the gate's slots
// (as many as one model's sessions), or without the gate every model's
// sessions.
func TestSessionThreads(t *testing.T) {
	for _, c := range []struct {
		name  string
		o     Options
		cores int
		all   int
		want  int
	}{
		{"one session: ONNX Runtime's choice", Options{Plans: []string{"a"}, Sessions: 1}, 16, 0, 0},
		{"given", Options{Plans: []string{"a"}, Threads: 5, Sessions: 4}, 16, 0, 5},
		{"sessions share", Options{Plans: []string{"a"}, Sessions: 4}, 16, 0, 4},
		{"uneven", Options{Plans: []string{"a"}, Sessions: 3}, 16, 0, 5},
		{"more sessions than cores", Options{Plans: []string{"a"}, Sessions: 4}, 2, 0, 1},
		{"models behind the gate", Options{Plans: []string{"a", "b"}, Sessions: 2, Batch: BatchOptions{Gate: NewRunGate(2)}}, 16, 0, 8},
		{"models behind the gate, one slot", Options{Plans: []string{"a", "b"}, Sessions: 1, Batch: BatchOptions{Gate: NewRunGate(1)}}, 16, 0, 0},
		{"models without the gate", Options{Plans: []string{"a", "b"}, Sessions: 2, AcrossModels: "off"}, 16, 0, 4},
		// GOMAXPROCS below the machine's cores (a CPU quota, or one of
		// several CPU dense workers under prism up): the process's share,
		// not ONNX Runtime's thread per core of the machine.
		{"one session, a share of the machine", Options{Plans: []string{"a"}, Sessions: 1}, 2, 16, 2},
		{"one session, one core of the machine", Options{Plans: []string{"a"}, Sessions: 1}, 1, 2, 1},
	} {
		all := c.all
		if all == 0 {
			all = c.cores
		}
		if got := sessionThreads(c.o, c.cores, all); got != c.want {
			t.Errorf("%s: %d threads a session, want %d", c.name, got, c.want)
		}
	}
}
