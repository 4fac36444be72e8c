package serve

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/internal/grpctest"
)

// fakeRouter is a registry that answers with its dense workers and
// records who announced and who left, with the :authority they named.
type fakeRouter struct {
	prismv1.UnimplementedRegistryServer
	mu        sync.Mutex
	dense     []string
	announces int
	left      int
	authority string
	// held counts the announcements naming a dense list version
	// (AnnounceRequest.dense_held), which this router, as one of an
	// earlier release, never sends.
	held int
}

func (r *fakeRouter) Announce(ctx context.Context, req *prismv1.AnnounceRequest) (*prismv1.AnnounceResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.announces++
	if req.GetDenseHeld() != nil {
		r.held++
	}
	if md, ok := metadata.FromIncomingContext(ctx); ok && len(md[":authority"]) > 0 {
		r.authority = md[":authority"][0]
	}
	return &prismv1.AnnounceResponse{HeartbeatMs: 20, DenseAddrs: r.dense}, nil
}

func (r *fakeRouter) Leave(context.Context, *prismv1.LeaveRequest) (*prismv1.LeaveResponse, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.left++
	return &prismv1.LeaveResponse{}, nil
}

func (r *fakeRouter) counts() (announces, left int, authority string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.announces, r.left, r.authority
}

// eventually polls cond for up to 5 s.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("never: %s", what)
		}
	}
}

// TestAnnounceRouters: a worker announces to every router it resolves,
// one heartbeat each, in process over bufconn: a name's addresses and a
// literal address; a router that appears in the name's addresses is
// found at the next resolution, one that is gone is left; a name that
// stops resolving keeps its routers. The embedding worker's answer is
// the union of the routers' dense workers.
func TestAnnounceRouters(t *testing.T) {
	var bn grpctest.Net
	routers := map[string]*fakeRouter{
		"10.0.0.1:7000": {dense: []string{"d1:1", "d2:1"}},
		"10.0.0.2:7000": {dense: []string{"d4:1"}},
		"10.0.0.3:7000": {dense: []string{"d2:1", "d3:1"}},
	}
	for addr, r := range routers {
		serveRegistry(t, &bn, addr, r)
	}
	var dnsMu sync.Mutex
	dns := []string{"10.0.0.1"}
	var dnsErr error
	setDNS := func(ips []string, err error) { dnsMu.Lock(); dns, dnsErr = ips, err; dnsMu.Unlock() }
	lookup := func(_ context.Context, host string) ([]string, error) {
		dnsMu.Lock()
		defer dnsMu.Unlock()
		if host != "routers.test" {
			return nil, errors.New("no such host")
		}
		return slices.Clone(dns), dnsErr
	}
	var mu sync.Mutex
	var union []string
	answered := func(r *prismv1.AnnounceResponse) { mu.Lock(); union = r.GetDenseAddrs(); mu.Unlock() }
	unionIs := func(want ...string) func() bool {
		return func() bool { mu.Lock(); defer mu.Unlock(); return slices.Equal(union, want) }
	}
	specs, err := ParseRouters("routers.test:7000, 10.0.0.3:7000,routers.test:7000")
	if err != nil || len(specs) != 2 {
		t.Fatalf("ParseRouters: %v %v", specs, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := AnnounceRouters(ctx, RouterOptions{
		Routers: specs, Info: func() *prismv1.WorkerInfo { return workerInfo("w:1") }, Answered: answered,
		ResolveEvery: 30 * time.Millisecond, LookupHost: lookup, DialOptions: []grpc.DialOption{bn.DialOption()}, Log: quiet(),
	})
	eventually(t, "the union of routers 1 and 3", unionIs("d1:1", "d2:1", "d3:1"))
	if _, _, auth := routers["10.0.0.1:7000"].counts(); auth != "routers.test:7000" {
		t.Errorf("a router found by name was dialled with authority %q, want the name", auth)
	}
	if n, _, _ := routers["10.0.0.2:7000"].counts(); n != 0 {
		t.Errorf("router 2, not resolved yet, had %d announcements", n)
	}

	// A new replica behind the name.
	setDNS([]string{"10.0.0.2", "10.0.0.1"}, nil)
	eventually(t, "router 2 found", unionIs("d1:1", "d2:1", "d3:1", "d4:1"))
	// Router 1 gone from the name: left, and its dense workers with it.
	setDNS([]string{"10.0.0.2"}, nil)
	eventually(t, "router 1 left", func() bool { _, l, _ := routers["10.0.0.1:7000"].counts(); return l == 1 })
	eventually(t, "router 1's dense workers dropped", unionIs("d2:1", "d3:1", "d4:1"))
	// The name stops resolving: its routers stay.
	setDNS(nil, errors.New("SERVFAIL"))
	before, _, _ := routers["10.0.0.2:7000"].counts()
	time.Sleep(150 * time.Millisecond)
	if n, l, _ := routers["10.0.0.2:7000"].counts(); l != 0 || n <= before {
		t.Errorf("router 2 after the name failed to resolve: %d announcements (%d before), %d leaves", n, before, l)
	}
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("AnnounceRouters did not end after its context")
	}
	for _, a := range []string{"10.0.0.2:7000", "10.0.0.3:7000"} {
		if _, l, _ := routers[a].counts(); l != 1 {
			t.Errorf("router %s: %d leaves at the end, want 1", a, l)
		}
	}
}

// TestAnswers: a router silent for eight of its heartbeats leaves the
// union (it probes an overdue worker for up to seven before it stops
// sending it work: router/silent.go); one that answers again is back in
// it.
func TestAnswers(t *testing.T) {
	now := time.Unix(0, 0)
	var got [][]string
	a := newAnswers(func(r *prismv1.AnnounceResponse) { got = append(got, r.GetDenseAddrs()) }, func() time.Time { return now })
	a.heard("r1", &prismv1.AnnounceResponse{HeartbeatMs: 100, DenseAddrs: []string{"b", "a"}}, nil)
	a.heard("r2", &prismv1.AnnounceResponse{HeartbeatMs: 1000, DenseAddrs: []string{"c", "a"}}, nil)
	down := errors.New("unavailable")
	now = now.Add(750 * time.Millisecond)
	a.heard("r1", nil, down) // 750 ms, seven and a half heartbeats: kept (the router may still be probing this worker and sending it lookups)
	if len(got) != 2 {
		t.Fatalf("r1's list dropped after 7.5 of its heartbeats (delivered %v): the router still sends lookups to a worker answering its probe", got)
	}
	now = now.Add(100 * time.Millisecond)
	a.heard("r1", nil, down) // 850 ms > 800 ms: dropped
	a.heard("r1", nil, down) // no change: nothing delivered
	a.heard("r1", &prismv1.AnnounceResponse{HeartbeatMs: 100, DenseAddrs: []string{"b"}}, nil)
	a.forget("r2")
	want := [][]string{{"a", "b"}, {"a", "b", "c"}, {"a", "c"}, {"a", "b", "c"}, {"b"}}
	if !slices.EqualFunc(got, want, slices.Equal) {
		t.Errorf("delivered %v, want %v", got, want)
	}
}

// TestAnswersEpoch: each router's answer is delivered with its own
// election epoch (AnnounceResponse.epoch), never merged away: the
// worker hears the sequencing router's epoch from that router's answer
// before it announces to it again (issue 14), and a delivery no answer
// caused carries none. So are the diverged marks and stranded models
// the sequencing router tells (a worker mending itself acts on them).
func TestAnswersEpoch(t *testing.T) {
	now := time.Unix(0, 0)
	var got []string
	a := newAnswers(func(r *prismv1.AnnounceResponse) {
		got = append(got, fmt.Sprintf("%d %v %v", r.GetEpoch(), r.GetDiverged(), r.GetStranded()))
	}, func() time.Time { return now })
	told := &prismv1.AnnounceResponse{HeartbeatMs: 100, DenseAddrs: []string{"a"}, Epoch: 7, Diverged: map[string]int64{"m": 3}, Stranded: []string{"n"}}
	a.heard("holder", told, nil)
	a.heard("follower", &prismv1.AnnounceResponse{HeartbeatMs: 100, DenseAddrs: []string{"b"}}, nil)
	a.heard("holder", told, nil)
	a.forget("follower")
	if want := []string{"7 map[m:3] [n]", "0 map[] []", "7 map[m:3] [n]", "0 map[] []"}; !slices.Equal(got, want) {
		t.Errorf("delivered %q, want %q", got, want)
	}
}

// TestResolveRouter: a literal is one router, a name each of its
// addresses (dialled under the name), a name of loopback addresses one
// router by its name.
func TestResolveRouter(t *testing.T) {
	lookup := func(_ context.Context, host string) ([]string, error) {
		return map[string][]string{
			"localhost": {"127.0.0.1", "::1"},
			"routers":   {"10.0.0.2", "fd00::1", "10.0.0.2"},
		}[host], nil
	}
	for spec, want := range map[string][]routerTarget{
		"10.0.0.9:7000":   {{addr: "10.0.0.9:7000"}},
		"[fd00::9]:7000":  {{addr: "[fd00::9]:7000"}},
		"localhost:7000":  {{addr: "localhost:7000"}},
		"routers:7000":    {{"10.0.0.2:7000", "routers:7000"}, {"[fd00::1]:7000", "routers:7000"}},
		"nothing.at:7000": nil,
	} {
		got, err := resolveRouter(context.Background(), spec, lookup)
		if want == nil {
			if err == nil {
				t.Errorf("%s: %v, want an error", spec, got)
			}
			continue
		}
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("%s: %v %v, want %v", spec, got, err, want)
		}
	}
	for _, bad := range []string{"router", ":7000", "router:"} {
		// Naming the flag: "router address "0": want HOST:PORT" did not.
		if _, err := ParseRouters(bad); err == nil || !strings.HasPrefix(err.Error(), fmt.Sprintf("--router %q: address %q: want HOST:PORT", bad, bad)) {
			t.Errorf("ParseRouters(%q): %v, want an error naming --router", bad, err)
		}
	}
}

// TestAnnounceRoutersRollout: with the default 30 s between resolutions,
// a worker still finds its routers within seconds when it matters. A
// first resolution that fails (a headless Service with no ready
// endpoints yet) is retried after a short backoff, and a router whose
// pod is replaced (its address dies, the name now resolves to the new
// pod) is found again once its heartbeat has failed for a couple of
// beats, not at the next periodic resolution.
func TestAnnounceRoutersRollout(t *testing.T) {
	var bn grpctest.Net
	old, repl := &fakeRouter{}, &fakeRouter{}
	start := func(addr string, r *fakeRouter) (stop func()) { return serveRegistry(t, &bn, addr, r) }
	stopOld := start("10.0.0.1:7000", old)
	start("10.0.0.2:7000", repl)

	var dnsMu sync.Mutex
	var dns []string
	dnsErr := errors.New("no such host")
	setDNS := func(ips []string, err error) { dnsMu.Lock(); dns, dnsErr = ips, err; dnsMu.Unlock() }
	lookup := func(context.Context, string) ([]string, error) {
		dnsMu.Lock()
		defer dnsMu.Unlock()
		return slices.Clone(dns), dnsErr
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := AnnounceRouters(ctx, RouterOptions{
		Routers: []string{"routers.test:7000"}, Info: func() *prismv1.WorkerInfo { return workerInfo("w:1") },
		ResolveEvery: 30 * time.Second, LookupHost: lookup, DialOptions: []grpc.DialOption{bn.DialOption()}, Log: quiet(),
	})
	time.Sleep(100 * time.Millisecond) // the first resolution fails
	setDNS([]string{"10.0.0.1"}, nil)
	eventually(t, "announced to the router once its name resolves", func() bool { n, _, _ := old.counts(); return n > 0 })

	// The rollout: the old pod dies, the name resolves to the new one.
	setDNS([]string{"10.0.0.2"}, nil)
	stopOld()
	eventually(t, "announced to the new router", func() bool { n, _, _ := repl.counts(); return n > 0 })

	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("AnnounceRouters did not end after its context")
	}
}

// flakyRouter answers Announce with Unavailable on the calls (counted
// from 1) in fail.
type flakyRouter struct {
	fakeRouter
	fail map[int]bool
	// why is the failures' message ("router stopping" when empty).
	why string
}

func (r *flakyRouter) Announce(ctx context.Context, req *prismv1.AnnounceRequest) (*prismv1.AnnounceResponse, error) {
	resp, _ := r.fakeRouter.Announce(ctx, req)
	n, _, _ := r.counts()
	if r.fail[n] {
		why := r.why
		if why == "" {
			why = "router stopping"
		}
		return nil, status.Error(codes.Unavailable, why)
	}
	return resp, nil
}

// syncBuffer is a bytes.Buffer safe for the logger's goroutine and the
// test's.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestAnnounceWarnsWhenFailingInARow: one failed heartbeat (a router
// restarting, or stopped before its workers as prism up does) is not
// warned of; staleAfter failures in a row are, once, and the next
// answer says the worker announced again.
func TestAnnounceWarnsWhenFailingInARow(t *testing.T) {
	r := &flakyRouter{fail: map[int]bool{2: true, 4: true, 5: true, 6: true}}
	got := announceLog(t, r, 8)
	if n := strings.Count(got, "announce failed"); n != 1 {
		t.Errorf("%d warnings of failed announcements, want 1 (for calls 4-6, not for call 2 alone):\n%s", n, got)
	}
	if !strings.Contains(got, "failed_in_a_row=2") {
		t.Errorf("the warning does not come at the second failure in a row:\n%s", got)
	}
	if n := strings.Count(got, "announced again"); n != 1 {
		t.Errorf("%d lines of announcing again, want 1:\n%s", n, got)
	}
	if strings.Contains(got, "--insecure") {
		t.Errorf("a hint about TLS for a router stopping:\n%s", got)
	}
}

// TestAnnounceHintsTLSMismatch: a worker whose announcements fail as a
// TLS client's do against a plaintext router says which flag to change
// (it retried forever with gRPC's message alone).
func TestAnnounceHintsTLSMismatch(t *testing.T) {
	r := &flakyRouter{fail: map[int]bool{1: true, 2: true, 3: true}, why: `connection error: desc = "transport: authentication handshake failed: tls: first record does not look like a TLS handshake"`}
	if got := announceLog(t, r, 3); !strings.Contains(got, "announce failed; retrying (a TLS client against a server started with --insecure? give --insecure too)") {
		t.Errorf("no hint in the warning:\n%s", got)
	}
}

// announceLog serves r as a router on an in-memory network, announces
// a worker to it until it has had n announcements, and returns what the
// worker logged at info level and above.
func announceLog(t *testing.T, r *flakyRouter, n int) string {
	t.Helper()
	var bn grpctest.Net
	serveRegistry(t, &bn, "10.0.0.1:7000", r)
	var out syncBuffer
	log := slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{Level: slog.LevelInfo}))
	ctx, cancel := context.WithCancel(context.Background())
	done := AnnounceWith(ctx, "10.0.0.1:7000", func() *prismv1.WorkerInfo { return workerInfo("w:1") }, nil, log, bn.DialOption())
	eventually(t, fmt.Sprintf("%d announcements", n), func() bool { c, _, _ := r.counts(); return c >= n })
	cancel()
	<-done
	return out.String()
}

// serveRegistry serves reg as a router's registry at addr on bn until
// stop (or the test's end).
func serveRegistry(t *testing.T, bn *grpctest.Net, addr string, reg prismv1.RegistryServer) (stop func()) {
	t.Helper()
	s, err := New("router", Options{Listener: bn.MustListen(t, addr), MetricsAddr: "off", Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	prismv1.RegisterRegistryServer(s.GRPC, reg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Serve(ctx); close(done) }()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	return stop
}

// TestParseRoutersSameIP: one router written twice as two forms of one IP
// address is one router (it was two, each announced to, by strings);
// names are left as written (resolved later).
func TestParseRoutersSameIP(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []string
	}{
		{"[::1]:8500,[0:0:0:0:0:0:0:1]:8500", []string{"[::1]:8500"}},
		{"[2001:DB8::1]:7000, [2001:db8:0::1]:7000", []string{"[2001:db8::1]:7000"}},
		{"10.0.0.3:7000,10.0.0.3:7000", []string{"10.0.0.3:7000"}},
		{"[::1]:8500,[::1]:8501", []string{"[::1]:8500", "[::1]:8501"}},
		{"routers.test:7000,Routers.test:7000", []string{"routers.test:7000", "Routers.test:7000"}},
	} {
		got, err := ParseRouters(tc.in)
		if err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("ParseRouters(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}
