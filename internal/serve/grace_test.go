package serve

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/internal/grpctest"
)

// lockedBuffer is a log sink safe for the server's goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestGraceOverSaysInFlight: a shutdown whose grace runs out with calls
// still running says which, by method and count (it said only "requests
// in flight"); one that finished in time says nothing of the kind.
func TestGraceOverSaysInFlight(t *testing.T) {
	for _, tc := range []struct {
		name  string
		held  int
		grace time.Duration
		want  string // in the log; "" : no grace-over line
	}{
		{name: "cut off", held: 2, grace: 50 * time.Millisecond, want: `in_flight="/prism.v1.Registry/Announce=2"`},
		{name: "none", held: 0, grace: 50 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs lockedBuffer
			var bn grpctest.Net
			s, err := New("test", Options{Listener: bn.MustListen(t, "test"), MetricsAddr: "off", ShutdownGrace: tc.grace,
				Logger: slog.New(slog.NewTextHandler(&logs, nil))})
			if err != nil {
				t.Fatal(err)
			}
			reg := &slowRegistry{entered: make(chan struct{}, tc.held), release: make(chan struct{})}
			prismv1.RegisterRegistryServer(s.GRPC, reg)
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- s.Serve(ctx) }()
			conn := bn.Dial(t, s.Addr())
			for range tc.held {
				go prismv1.NewRegistryClient(conn).Announce(context.Background(), &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{Id: "w"}})
				<-reg.entered
			}
			cancel()
			// The handlers ignore cancellation: let them go once the
			// grace is over (Stop waits for handlers).
			time.Sleep(tc.grace + 100*time.Millisecond)
			close(reg.release)
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			out := logs.String()
			over := strings.Contains(out, "grace period over")
			switch {
			case tc.want == "" && over:
				t.Errorf("a grace-over line with nothing in flight:\n%s", out)
			case tc.want != "" && !strings.Contains(out, tc.want):
				t.Errorf("the log does not say %q:\n%s", tc.want, out)
			}
		})
	}
}
