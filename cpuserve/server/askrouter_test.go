package server

import (
	"context"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/internal/grpctest"
	"github.com/prism-serve/prism/internal/serve"
	"github.com/prism-serve/prism/router"
)

// countingRegistry is a router's registry that counts the announcements
// it answers.
type countingRegistry struct {
	*router.Registry
	announces atomic.Int64
}

func (c *countingRegistry) Announce(ctx context.Context, req *prismv1.AnnounceRequest) (*prismv1.AnnounceResponse, error) {
	c.announces.Add(1)
	return c.Registry.Announce(ctx, req)
}

// rejoined is an embedding worker that announced to a router (over
// bufconn, with internal/serve's loop and a Prompt, as prism serve
// embedding does) and applied its answer, before any dense worker had
// registered there: its list is empty. The router's heartbeat is an
// hour, so only an out-of-turn announcement tells it anything more.
func rejoined(t *testing.T, wait time.Duration) (*Server, *countingRegistry) {
	t.Helper()
	var bn grpctest.Net
	quiet := slog.New(slog.DiscardHandler)
	at := time.Unix(1_800_000_000, 0)
	reg := &countingRegistry{Registry: router.NewRegistry(time.Hour, func() time.Time { return at })}
	rs, err := serve.New("router", serve.Options{Listener: bn.MustListen(t, "10.0.0.9:7000"), MetricsAddr: "off", Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	prismv1.RegisterRegistryServer(rs.GRPC, reg)
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan struct{})
	go func() { rs.Serve(ctx); close(served) }()

	prompt := serve.NewPrompt()
	s := &Server{opts: Options{AskRouter: prompt.Ask, DenseWait: wait}}
	s.met = newMetrics(s)
	first := make(chan struct{})
	var once sync.Once
	announced := serve.AnnounceRouters(ctx, serve.RouterOptions{
		Routers: []string{"10.0.0.9:7000"},
		Info: func() *prismv1.WorkerInfo {
			return &prismv1.WorkerInfo{Id: "cpu-1", Role: prismv1.Role_ROLE_EMBEDDING, Addr: "cpu:1", Models: []string{"m"}, Healthy: true}
		},
		Answered: func(r *prismv1.AnnounceResponse) {
			s.SetDenseAddrs(r.GetDenseAddrs())
			once.Do(func() { close(first) })
		},
		Prompt: prompt, DialOptions: []grpc.DialOption{bn.DialOption()}, Log: quiet,
	})
	t.Cleanup(func() { cancel(); <-announced; <-served })
	select {
	case <-first:
	case <-time.After(10 * time.Second):
		t.Fatal("the worker never heard the router's answer")
	}
	if err := s.checkDense("gpu:1"); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("before any dense worker registered: %v, want PermissionDenied", err)
	}
	return s, reg
}

// TestRefusedLookupAsksRouter: an embedding worker that rejoined its
// router before the dense worker did (after a link cut dropped all
// three hosts) is asked to send to that dense worker: the router picks
// it, falling back to the dense workers the embedding worker has not
// been told of. The lookups that name it are not refused until the next
// heartbeat: the worker announces once, out of turn, and they go on
// with the router's answer; however many arrive at once, that is one
// announcement. A dense worker the router does not know is still
// refused, after the bounded wait (DenseWait: the default, 200 ms,
// there; ten seconds where the answer is expected, since the wait ends
// with it, so that a loaded machine cannot make the test time out).
func TestRefusedLookupAsksRouter(t *testing.T) {
	for _, tc := range []struct {
		name    string
		lookups int
		addr    string
		code    codes.Code
	}{
		{"one lookup", 1, "gpu:1", codes.OK},
		{"many lookups at once", 64, "gpu:1", codes.OK},
		{"a dense worker the router does not know", 1, "evil:1", codes.PermissionDenied},
		{"many naming one the router does not know", 16, "evil:1", codes.PermissionDenied},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wait := 10 * time.Second
			if tc.code != codes.OK {
				wait = 0 // DefaultDenseWait
			}
			s, reg := rejoined(t, wait)
			before := reg.announces.Load()
			if _, err := reg.Registry.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{
				Id: "gpu-1", Role: prismv1.Role_ROLE_DENSE, Addr: "gpu:1", Models: []string{"m"}, Healthy: true,
			}}); err != nil {
				t.Fatal(err)
			}
			w, release, err := reg.PickFor(prismv1.Role_ROLE_DENSE, "m", 1, nil, "cpu-1")
			if err != nil || w.GetAddr() != "gpu:1" {
				t.Fatalf("the router picks %v (%v) for the embedding worker, want gpu:1", w.GetAddr(), err)
			}
			release()

			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			errs := make([]error, tc.lookups)
			var wg sync.WaitGroup
			for i := range errs {
				wg.Go(func() { errs[i] = s.awaitDense(ctx, tc.addr) })
			}
			wg.Wait()
			for i, err := range errs {
				if status.Code(err) != tc.code {
					t.Fatalf("lookup %d of %d naming %s: %v, want %v", i, tc.lookups, tc.addr, err, tc.code)
				}
			}
			outcome := "served"
			if tc.code != codes.OK {
				outcome = "refused"
			}
			var c dto.Metric
			if err := s.met.unknownDense.WithLabelValues(outcome).(prometheus.Metric).Write(&c); err != nil || c.GetCounter().GetValue() != float64(tc.lookups) {
				t.Errorf("prism_embedding_unknown_dense_lookups_total{outcome=%q} = %v (%v), want %d", outcome, c.GetCounter().GetValue(), err, tc.lookups)
			}
			if tc.code == codes.OK {
				if n := reg.announces.Load() - before; n != 1 {
					t.Errorf("%d lookups refused at once: %d announcements out of turn, want 1", tc.lookups, n)
				}
			} else if n := reg.announces.Load() - before; n > 4 {
				// 200 ms of asking: one announcement at a time, at most
				// one per PromptGap, and one for the last ask, however
				// many lookups wait.
				t.Errorf("%d announcements out of turn while refusing an unknown dense worker, want at most 4", n)
			}
		})
	}
}

// TestDenseWait: the wait for the router's answer takes at most a
// quarter of the lookup's remaining deadline and Options.DenseWait; a
// lookup with no time left to wait is refused at once and asks nothing.
func TestDenseWait(t *testing.T) {
	for _, tc := range []struct {
		limit       time.Duration
		hasDeadline bool
		left, want  time.Duration
	}{
		{0, false, 0, DefaultDenseWait},
		{0, true, time.Hour, DefaultDenseWait},
		{0, true, 400 * time.Millisecond, 100 * time.Millisecond},
		{time.Hour, true, 2 * time.Second, 500 * time.Millisecond},
		{50 * time.Millisecond, false, 0, 50 * time.Millisecond},
		{0, true, 3 * time.Nanosecond, 0},
		{0, true, -time.Second, -time.Second / 4},
	} {
		if got := denseWait(tc.limit, tc.hasDeadline, tc.left); got != tc.want {
			t.Errorf("denseWait(%v, deadline %v, %v left) = %v, want %v", tc.limit, tc.hasDeadline, tc.left, got, tc.want)
		}
	}
	asks := 0
	s := &Server{opts: Options{AskRouter: func() { asks++ }}}
	s.met = newMetrics(s)
	s.SetDenseAddrs(nil)
	ctx, cancel := context.WithDeadline(context.Background(), time.Unix(0, 0))
	defer cancel()
	if err := s.awaitDense(ctx, "gpu:1"); status.Code(err) != codes.PermissionDenied || asks != 0 {
		t.Fatalf("past its deadline: %v after %d asks, want PermissionDenied and no ask", err, asks)
	}
}
