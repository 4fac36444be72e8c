package serve

import (
	"context"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/internal/grpctest"
)

// gatedRouter answers announcements with an hour's heartbeat (so only
// asks make a loop announce again) and holds each one until the test
// lets it through: entered hears each announcement's number as it
// arrives, pass lets one through.
type gatedRouter struct {
	prismv1.UnimplementedRegistryServer
	entered chan int
	pass    chan struct{}
	n       int
}

func (r *gatedRouter) Announce(ctx context.Context, _ *prismv1.AnnounceRequest) (*prismv1.AnnounceResponse, error) {
	r.n++ // announcements of one loop come one at a time
	r.entered <- r.n
	select {
	case <-r.pass:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	return &prismv1.AnnounceResponse{HeartbeatMs: time.Hour.Milliseconds()}, nil
}

func (r *gatedRouter) Leave(context.Context, *prismv1.LeaveRequest) (*prismv1.LeaveResponse, error) {
	return &prismv1.LeaveResponse{}, nil
}

// TestPromptCoalesces: Prompt.Ask has a loop waiting for its next
// heartbeat announce at once; asks made while an announcement is in
// flight (it may have been answered before their reason) are one more
// announcement right after it, however many they are; an announcement
// answers the asks made before it started, and none is left pending.
func TestPromptCoalesces(t *testing.T) {
	var bn grpctest.Net
	r := &gatedRouter{entered: make(chan int), pass: make(chan struct{})}
	serveRegistry(t, &bn, "10.0.0.1:7000", r)
	prompt := NewPrompt()
	ctx, cancel := context.WithCancel(context.Background())
	done := AnnounceRouters(ctx, RouterOptions{
		Routers: []string{"10.0.0.1:7000"}, Info: func() *prismv1.WorkerInfo { return workerInfo("w:1") },
		Prompt: prompt, DialOptions: []grpc.DialOption{bn.DialOption()}, Log: quiet(),
	})
	defer func() { cancel(); <-done }()
	next := func(want int) {
		t.Helper()
		select {
		case n := <-r.entered:
			if n != want {
				t.Fatalf("announcement %d arrived, want %d", n, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("announcement %d never arrived", want)
		}
	}
	pending := func() int {
		prompt.mu.Lock()
		defer prompt.mu.Unlock()
		p := 0
		for n := range prompt.loops {
			p += len(n.wake)
		}
		return p
	}
	ask := func(n int) {
		for range n {
			prompt.Ask()
		}
	}
	wantPending := func(want int, when string) {
		t.Helper()
		if p := pending(); p != want {
			t.Fatalf("%s: %d asks pending, want %d", when, p, want)
		}
	}
	pass := func() { r.pass <- struct{}{} }

	next(1) // the first heartbeat, held
	ask(100)
	wantPending(1, "100 asks while announcement 1 is in flight")
	pass()
	next(2) // the asks' one announcement, right after
	wantPending(0, "announcement 2 started")
	pass()
	// Answered, nothing is pending: the loop waits for its heartbeat,
	// an hour away, until asked.
	ask(1)
	next(3)
	wantPending(0, "announcement 3 started")
	ask(20)
	wantPending(1, "20 asks while announcement 3 is in flight")
	pass()
	next(4)
	wantPending(0, "announcement 4 started")
	pass()
}

// stampRouter answers announcements at once with an hour's heartbeat
// (so only asks make a loop announce again) and keeps when each began.
type stampRouter struct {
	prismv1.UnimplementedRegistryServer
	mu     sync.Mutex
	starts []time.Time
}

func (r *stampRouter) Announce(context.Context, *prismv1.AnnounceRequest) (*prismv1.AnnounceResponse, error) {
	r.mu.Lock()
	r.starts = append(r.starts, time.Now())
	r.mu.Unlock()
	return &prismv1.AnnounceResponse{HeartbeatMs: time.Hour.Milliseconds()}, nil
}

func (r *stampRouter) Leave(context.Context, *prismv1.LeaveRequest) (*prismv1.LeaveResponse, error) {
	return &prismv1.LeaveResponse{}, nil
}

// TestPromptGap: an ask right after an announcement is answered waits
// until PromptGap after that announcement began; one made later than
// that announces at once. In a synctest bubble, so the times are exact
// and the test waits for no real clock.
func TestPromptGap(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var bn grpctest.Net
		r := &stampRouter{}
		serveRegistry(t, &bn, "10.0.0.1:7000", r)
		prompt := NewPrompt()
		ctx, cancel := context.WithCancel(context.Background())
		done := AnnounceRouters(ctx, RouterOptions{
			Routers: []string{"10.0.0.1:7000"}, Info: func() *prismv1.WorkerInfo { return workerInfo("w:1") },
			Prompt: prompt, DialOptions: []grpc.DialOption{bn.DialOption()}, Log: quiet(),
		})
		defer func() { cancel(); <-done }()
		synctest.Wait() // the first heartbeat (at 0), answered
		prompt.Ask()    // at 0: waits for the gap, announces at 100 ms
		time.Sleep(150 * time.Millisecond)
		prompt.Ask() // at 150 ms: announces at 200 ms
		time.Sleep(400 * time.Millisecond)
		prompt.Ask() // at 550 ms, past the gap: at once
		synctest.Wait()
		r.mu.Lock()
		starts := slices.Clone(r.starts)
		r.mu.Unlock()
		var gaps []time.Duration
		for i := 1; i < len(starts); i++ {
			gaps = append(gaps, starts[i].Sub(starts[i-1]))
		}
		if want := []time.Duration{PromptGap, PromptGap, 350 * time.Millisecond}; !slices.Equal(gaps, want) {
			t.Errorf("gaps between announcements %v, want %v", gaps, want)
		}
	})
}
