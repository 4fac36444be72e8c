package loadgen

import (
	"bytes"
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	"github.com/prism-serve/prism/api/prismv1"
)

// arrival is what a capturing server saw of one request.
type arrival struct {
	req         *prismv1.RecommendRequest
	contentType string
}

// captureServer serves a Fake in process over bufconn whose interceptor
// keeps every request as the server decoded it, by request id, and
// returns a sender to it.
func captureServer(t *testing.T) (s GRPCSender, got func(id string) (arrival, bool), n func() int) {
	t.Helper()
	var mu sync.Mutex
	seen := map[string]arrival{}
	srv := grpc.NewServer(grpc.UnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		r := req.(*prismv1.RecommendRequest)
		mu.Lock()
		seen[r.RequestId] = arrival{r, strings.Join(md.Get("content-type"), ",")}
		mu.Unlock()
		return h(ctx, req)
	}))
	return serveBufconn(t, srv, &Fake{}),
		func(id string) (arrival, bool) { mu.Lock(); defer mu.Unlock(); a, ok := seen[id]; return a, ok },
		func() int { mu.Lock(); defer mu.Unlock(); return len(seen) }
}

func pooledRequests(t testing.TB, pool int) *Requests {
	t.Helper()
	q, err := NewRequests(RequestOptions{Model: "m", Version: 4, Sig: tinySig(t), Context: []string{"dense"}, Candidates: Uniform{3, 9}, Seed: 7, Pool: pool})
	if err != nil {
		t.Fatal(err)
	}
	if err := q.Prepare(); err != nil {
		t.Fatal(err)
	}
	return q
}

// TestPremarshaledArrivesEqual: a pooled request sent as its pre-built
// bytes arrives equal to the message it stands for, request id included,
// and those bytes are what proto.Marshal gives for the message.
func TestPremarshaledArrivesEqual(t *testing.T) {
	s, got, _ := captureServer(t)
	q := pooledRequests(t, 3)
	for i := range 7 { // more than the pool: the entries come round again
		req, wire, err := q.nextSend()
		if err != nil {
			t.Fatal(err)
		}
		if wire == nil || wire.Req != req {
			t.Fatalf("send %d: no wire form of the pooled request", i)
		}
		want, err := proto.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(wire.Bytes(), want) {
			t.Fatalf("send %d: the pre-built bytes differ from proto.Marshal's", i)
		}
		if err := s.SendPremarshaled(context.Background(), wire); err != nil {
			t.Fatal(err)
		}
		a, ok := got(req.RequestId)
		if !ok {
			t.Fatalf("send %d: request %q did not arrive", i, req.RequestId)
		}
		if !proto.Equal(a.req, req) {
			t.Fatalf("send %d: arrived\n%v\nwant\n%v", i, a.req, req)
		}
		if a.contentType != "application/grpc+proto" {
			t.Fatalf("send %d: content-type %q", i, a.contentType)
		}
	}
	// The unpooled path keeps gRPC's default codec and content-type.
	req := &prismv1.RecommendRequest{Model: "m", NumCandidates: 1, RequestId: "plain"}
	if err := s.Send(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	if a, _ := got("plain"); !proto.Equal(a.req, req) || a.contentType != "application/grpc" {
		t.Fatalf("plain send arrived as %v, %q", a.req, a.contentType)
	}
	// Without a connection, SendPremarshaled marshals the message.
	_, wire, _ := q.nextSend()
	if err := (GRPCSender{Client: s.Client}).SendPremarshaled(context.Background(), wire); err != nil {
		t.Fatal(err)
	}
	if a, _ := got(wire.Req.RequestId); !proto.Equal(a.req, wire.Req) || a.contentType != "application/grpc" {
		t.Fatalf("fallback send arrived as %v, %q", a.req, a.contentType)
	}
}

// TestPremarshaledCodec: the wire form passes through without a copy,
// everything else through the proto codec, and the name is proto's.
func TestPremarshaledCodec(t *testing.T) {
	c := premarshaledCodec{proto: encoding.GetCodecV2("proto")}
	if c.Name() != "proto" {
		t.Fatalf("name %q", c.Name())
	}
	q := pooledRequests(t, 2)
	_, wire, _ := q.nextSend()
	data, err := c.Marshal(wire)
	if err != nil {
		t.Fatal(err)
	}
	if len(data) != 2 || &data[0].ReadOnlyData()[0] != &wire.body[0] || !bytes.Equal(data.Materialize(), wire.Bytes()) {
		t.Fatal("the pre-built body was copied or changed")
	}
	data.Free()
	// A response round trip goes through the proto codec.
	resp := &prismv1.RecommendResponse{Scores: []float32{1, 2}, RequestId: "x"}
	if data, err = c.Marshal(resp); err != nil {
		t.Fatal(err)
	}
	var back prismv1.RecommendResponse
	if err := c.Unmarshal(data, &back); err != nil || !proto.Equal(&back, resp) {
		t.Fatalf("response round trip: %v %v", &back, err)
	}
	// No request id, no id field.
	p := newPremarshaled(&prismv1.RecommendRequest{Model: "m"}, []byte{0x0a, 0x01, 'm'})
	if data, _ = c.Marshal(p); len(data) != 1 {
		t.Fatalf("%d buffers for a request without an id", len(data))
	}
}

// TestRunPooledSendsEachRequest: a closed-loop run over a pool sends
// every request once, each equal to what the same request stream yields
// for its id, with the runner taking the pre-marshaled path.
func TestRunPooledSendsEachRequest(t *testing.T) {
	s, got, n := captureServer(t)
	sum, err := Run(context.Background(), Options{Clients: 4, Duration: 5 * time.Second, MaxRequests: 50}, pooledRequests(t, 4), s)
	if err != nil {
		t.Fatal(err)
	}
	if sum.Sent != 50 || sum.OK != 50 || n() != 50 {
		t.Fatalf("sent %d ok %d arrived %d, want 50", sum.Sent, sum.OK, n())
	}
	ref := pooledRequests(t, 4)
	for i := 1; i <= 50; i++ {
		want, _ := ref.Next()
		a, ok := got("lg-" + strconv.Itoa(i))
		if !ok || want.RequestId != "lg-"+strconv.Itoa(i) {
			t.Fatalf("request lg-%d did not arrive (reference id %q)", i, want.RequestId)
		}
		if !proto.Equal(a.req, want) {
			t.Fatalf("lg-%d arrived\n%v\nwant\n%v", i, a.req, want)
		}
		if a.contentType != "application/grpc+proto" {
			t.Fatalf("lg-%d: content-type %q: not the pre-marshaled path", i, a.contentType)
		}
	}
}
