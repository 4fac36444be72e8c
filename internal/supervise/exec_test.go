package supervise

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prism-serve/prism/internal/readyline"
)

type syncBuf struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestExec runs a real child: its address, its tagged stderr, and its
// exit on SIGTERM at shutdown.
func TestExec(t *testing.T) {
	var stderr, stdout syncBuf
	s := New(Options{Starter: &Exec{Path: "/bin/sh", Stderr: &stderr}, Stdout: &stdout, Grace: 5 * time.Second})
	c := &Child{Name: "dense0", Ready: readyline.Dense, Args: []string{"-c", `echo warming up >&2; echo "dense tier listening on 127.0.0.1:7 $X"; exec sleep 30`}, Env: []string{"X=from-env"}}
	addr, err := s.Start(context.Background(), c, 10*time.Second)
	if err != nil || addr != "127.0.0.1:7" {
		t.Fatalf("Start = %q, %v", addr, err)
	}
	start := time.Now()
	s.Shutdown()
	if el := time.Since(start); el > 4*time.Second {
		t.Errorf("SIGTERM did not stop the child (%v)", el)
	}
	if got := stdout.String(); got != "[dense0] dense tier listening on 127.0.0.1:7 from-env\n" {
		t.Errorf("stdout %q", got)
	}
	eventually(t, "stderr tagged", func() bool { return stderr.String() == "[dense0] warming up\n" })
}

// TestPrefixWriterLongLine: every line of a child's stderr is tagged,
// a line of more than 1 MiB too, and the lines after it: such a line
// ended the tagging, and every later line of the child was dropped.
func TestPrefixWriterLongLine(t *testing.T) {
	var out syncBuf
	w := prefixWriter(&out, "[c] ")
	long := strings.Repeat("x", 3<<20)
	for _, s := range []string{"first\n", long + "\n", "after\n", "un", "ended"} {
		if _, err := w.Write([]byte(s)); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	want := "[c] first\n[c] " + long + "\n[c] after\n[c] unended\n"
	if got := out.String(); got != want {
		t.Fatalf("got %d bytes (ends %q), want %d bytes (ends %q)", len(got), got[max(len(got)-30, 0):], len(want), want[len(want)-30:])
	}
}
