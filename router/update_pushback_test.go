package router

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/loadgen"
)

// serveUpdater serves rig's router's Embeddings service in process and
// counts the calls it takes (each attempt of a retrying client).
func serveUpdater(t *testing.T, rig *updateRig) (addr string, calls *atomic.Int64) {
	t.Helper()
	calls = new(atomic.Int64)
	addr, lis := listen(t)
	s := grpc.NewServer(grpc.UnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		calls.Add(1)
		return h(ctx, req)
	}))
	prismv1.RegisterEmbeddingsServer(s, rig.r.Updater())
	go s.Serve(lis)
	t.Cleanup(s.Stop)
	return addr, calls
}

func dialWith(t *testing.T, addr string, opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(addr, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithContextDialer(dialInproc)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func oneRow(table string) *prismv1.UpdateRequest {
	return &prismv1.UpdateRequest{Model: "m", Table: table, Ids: []int64{1}, Rows: []byte{0, 0, 128, 63}}
}

// TestUpdatePushback: an update refused in the router's start-up window
// carries the time left in it as grpc-retry-pushback-ms in its trailer
// (its message says "retry in N ms" too); refusals no wait cures (bad
// input, a model not served) carry none. grpc-go's own retryPolicy
// honours it: with a 1 ms backoff and three attempts, an update sent at
// the router's start is acknowledged on its second attempt, after the
// window, where retries on the backoff alone were all refused.
func TestUpdatePushback(t *testing.T) {
	const heartbeat = 250 * time.Millisecond // a window of 750 ms, ample for the first attempt to fall in it
	t.Run("trailer", func(t *testing.T) { updateTrailers(t, heartbeat) })
	t.Run("grpc-go honours it", func(t *testing.T) {
		rig := newStartingRig(t, Options{Heartbeat: heartbeat}, &seqCN{})
		addr, calls := serveUpdater(t, rig)
		sc := `{"methodConfig":[{"name":[{"service":"prism.v1.Embeddings","method":"Update"}],"retryPolicy":{"maxAttempts":3,"initialBackoff":"0.001s","maxBackoff":"0.001s","backoffMultiplier":1,"retryableStatusCodes":["UNAVAILABLE"]}}]}`
		retrying := prismv1.NewEmbeddingsClient(dialWith(t, addr, grpc.WithDefaultServiceConfig(sc)))
		start := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if _, err := retrying.Update(ctx, oneRow("t")); err != nil || calls.Load() != 2 {
			t.Fatalf("update at the router's start through grpc-go's retries: %v after %d attempts in %v; want acknowledged on the second, after the pushback", err, calls.Load(), time.Since(start))
		}
	})
}

// updateTrailers: the trailers of an update refused in the start-up
// window of a router of heartbeat, and of ones no wait cures.
func updateTrailers(t *testing.T, heartbeat time.Duration) {
	rig := newStartingRig(t, Options{Heartbeat: heartbeat}, &seqCN{})
	addr, _ := serveUpdater(t, rig)
	cli := prismv1.NewEmbeddingsClient(dialWith(t, addr))
	for _, tc := range []struct {
		name     string
		req      *prismv1.UpdateRequest
		code     codes.Code
		pushback bool
	}{
		{"start-up window", oneRow("t"), codes.Unavailable, true},
		{"bad input", &prismv1.UpdateRequest{Model: "m", Table: "t"}, codes.InvalidArgument, false},
		{"model not served", &prismv1.UpdateRequest{Model: "nope", Table: "t", Ids: []int64{1}, Rows: []byte{0, 0, 128, 63}}, codes.NotFound, false},
	} {
		var tr metadata.MD
		_, err := cli.Update(context.Background(), tc.req, grpc.Trailer(&tr))
		if status.Code(err) != tc.code {
			t.Fatalf("%s: %v, want %v", tc.name, err, tc.code)
		}
		v := tr.Get(PushbackKey)
		if !tc.pushback {
			if len(v) != 0 {
				t.Fatalf("%s: pushback %q on a refusal no wait cures", tc.name, v)
			}
			continue
		}
		ms, perr := 0, error(nil)
		if len(v) == 1 {
			ms, perr = strconv.Atoi(v[0])
		}
		if len(v) != 1 || perr != nil || ms < 1 || ms > int(3*heartbeat/time.Millisecond) || !strings.Contains(err.Error(), "retry in") {
			t.Fatalf("%s: %v, pushback %q; want the time left of the %v window", tc.name, err, v, 3*heartbeat)
		}
	}
}

// TestFollowerRelaysPushback: an update forwarded by a following router
// to a sequencer in its start-up window comes back with the
// sequencer's pushback, which the follower passes on to its client.
func TestFollowerRelaysPushback(t *testing.T) {
	// A sequencer that has just started (1 s heartbeats: a 3 s window).
	rig := followRigOn(t, newStartingRig(t, Options{}, &seqCN{}), nil)
	_, err := rig.updateVia(rig.fol, context.Background(), 1, 1)
	var r *refusal
	if status.Code(err) != codes.Unavailable || !errors.As(err, &r) || !r.retry || r.wait <= 0 || r.wait > 3*time.Second || !strings.Contains(err.Error(), rig.seqAddr) {
		t.Fatalf("update through the follower in the sequencer's window: %v (pushback %+v); want Unavailable naming the sequencer, with its pushback", err, r)
	}
	rig.settle()
	if _, err := rig.updateVia(rig.fol, context.Background(), 1, 1); err != nil {
		t.Fatalf("after the window: %v", err)
	}
}

// TestLoadgenUpdatesAtRouterStart: prism loadgen's update stream
// started with the router, retrying (--retries 3): every update is
// acknowledged, the refusals of the start-up window retried after the
// router's pushback and counted in the report. (Retried on a 10, 20,
// 40 ms backoff alone, an update sent at the start was refused all
// four times in the 750 ms window.)
func TestLoadgenUpdatesAtRouterStart(t *testing.T) {
	rig := newStartingRig(t, Options{Heartbeat: 250 * time.Millisecond}, &seqCN{}, &seqCN{})
	addr, calls := serveUpdater(t, rig)
	u, err := loadgen.NewUpdates(loadgen.UpdateOptions{Model: "m", Rows: 4, Tables: []loadgen.UpdateTable{{Name: "t", Rows: 1000, Dim: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	o := loadgen.Options{Clients: 2, Duration: time.Minute, MaxRequests: 10, Timeout: 5 * time.Second, Retry: loadgen.Retry{Retries: 3}}
	sum, err := loadgen.RunUpdates(context.Background(), o, u, loadgen.GRPCUpdater{Client: prismv1.NewEmbeddingsClient(dialWith(t, addr))})
	if err != nil {
		t.Fatal(err)
	}
	r := sum.Retry
	if sum.Sent != 10 || sum.OK != 10 || r == nil || r.Pushbacks < 2 || r.RetriedOK < 2 || r.Attempts != calls.Load() || r.Attempts < 12 {
		t.Fatalf("sent %d, acknowledged %d, errors %v, retries %+v, the router took %d calls; want all 10 acknowledged, each client's first after a pushback", sum.Sent, sum.OK, sum.FirstErrors, r, calls.Load())
	}
	for i, f := range rig.cns {
		if f.held() != 10 {
			t.Fatalf("worker %d holds update %d, want 10", i, f.held())
		}
	}
}

// TestRelayPushback: which sequencer trailers a forwarding router
// passes on as its own refusal's pushback.
func TestRelayPushback(t *testing.T) {
	base := status.Error(codes.Unavailable, "update sequencer s: retry in 250ms; retry")
	for _, tc := range []struct {
		name  string
		tr    metadata.MD
		value string // "": none relayed
	}{
		{"none", nil, ""},
		{"a wait", metadata.Pairs(PushbackKey, "250"), "250"},
		{"do not retry", metadata.Pairs(PushbackKey, "-1"), "-1"},
		{"not a number", metadata.Pairs(PushbackKey, "soon"), ""},
		{"two values", metadata.Pairs(PushbackKey, "1", PushbackKey, "2"), ""},
	} {
		err := relayPushback(base, tc.tr)
		var r *refusal
		got := ""
		if errors.As(err, &r) {
			got = r.value()
		}
		if got != tc.value || status.Code(err) != codes.Unavailable || err.Error() != base.Error() {
			t.Errorf("%s: %v, pushback %q; want %q, the refusal unchanged", tc.name, err, got, tc.value)
		}
	}
}
