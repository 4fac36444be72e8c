package loadgen

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/internal/grpctest"
)

func TestNewUpdatesRefuses(t *testing.T) {
	tab := []UpdateTable{{Name: "t", Rows: 10, Dim: 4}}
	for _, tc := range []struct {
		name string
		o    UpdateOptions
		want string
	}{
		{"no model", UpdateOptions{Tables: tab}, "no model"},
		{"no table", UpdateOptions{Model: "m"}, "no table"},
		{"negative rows", UpdateOptions{Model: "m", Tables: tab, Rows: -1}, "-1 rows an update"},
		{"unnamed table", UpdateOptions{Model: "m", Tables: []UpdateTable{{Rows: 10, Dim: 4}}}, "table 0 has no name"},
		{"empty table", UpdateOptions{Model: "m", Tables: []UpdateTable{{Name: "t", Dim: 4}}}, `table "t" has 0 rows`},
		{"no width", UpdateOptions{Model: "m", Tables: []UpdateTable{{Name: "t", Rows: 10}}}, "of dim 0"},
		{"bad exponent", UpdateOptions{Model: "m", Tables: tab, ZipfS: math.NaN()}, "exponent"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := NewUpdates(tc.o)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want %q", err, tc.want)
			}
		})
	}
}

// Updates go to the tables in turn, every id a row of its table, every
// row its table's width of finite small floats; a seed gives the same
// stream again, and the ids are skewed (a trainer writes the popular
// rows most).
func TestUpdatesStream(t *testing.T) {
	o := UpdateOptions{Model: "m", Rows: 50, Seed: 7, Tables: []UpdateTable{{Name: "a", Rows: 1000, Dim: 4}, {Name: "b", Rows: 3, Dim: 16}, {Name: "c", Rows: 1 << 40, Dim: 1}}}
	u, err := NewUpdates(o)
	if err != nil {
		t.Fatal(err)
	}
	again, _ := NewUpdates(o)
	counts := map[int64]int{}
	for i := range 300 {
		req, req2 := u.Next(), again.Next()
		tab := o.Tables[i%3]
		if req.Model != "m" || req.Table != tab.Name || len(req.Ids) != 50 || len(req.Rows) != 4*50*tab.Dim {
			t.Fatalf("update %d: model %q table %q, %d ids, %d row bytes; want table %q, 50 ids of dim %d", i, req.Model, req.Table, len(req.Ids), len(req.Rows), tab.Name, tab.Dim)
		}
		for j, id := range req.Ids {
			if id < 0 || id >= tab.Rows {
				t.Fatalf("update %d: id %d outside table %q of %d rows", i, id, tab.Name, tab.Rows)
			}
			if req2.Ids[j] != id {
				t.Fatalf("update %d: the same seed drew id %d, then %d", i, id, req2.Ids[j])
			}
			if tab.Name == "a" {
				counts[id]++
			}
		}
		for j := 0; j < len(req.Rows); j += 4 {
			if v := math.Float32frombits(binary.LittleEndian.Uint32(req.Rows[j:])); !(math.Abs(float64(v)) <= 1) {
				t.Fatalf("update %d: row value %v", i, v)
			}
		}
	}
	// 5,000 ids of table a: uniform, each of its 1,000 rows about 5
	// times; at Zipf 1.05 the most popular about a sixth of them.
	top := 0
	for _, n := range counts {
		top = max(top, n)
	}
	if top < 200 {
		t.Fatalf("the most written row of table a was written %d times of 5000: not skewed", top)
	}
}

// recordingEmbeddings acknowledges updates, refusing those of one table.
type recordingEmbeddings struct {
	prismv1.UnimplementedEmbeddingsServer
	mu     sync.Mutex
	rows   int
	refuse string
}

func (r *recordingEmbeddings) Update(_ context.Context, req *prismv1.UpdateRequest) (*prismv1.UpdateResponse, error) {
	if req.Table == r.refuse {
		return nil, status.Errorf(codes.InvalidArgument, "model %q has no table %q", req.Model, req.Table)
	}
	r.mu.Lock()
	r.rows += len(req.Ids)
	r.mu.Unlock()
	return &prismv1.UpdateResponse{Workers: 1}, nil
}

// RunUpdates over gRPC: every update sent is counted once, acknowledged
// or refused with its code and first message, its rows in the summary.
func TestRunUpdates(t *testing.T) {
	srv := grpc.NewServer()
	emb := &recordingEmbeddings{refuse: "b"}
	prismv1.RegisterEmbeddingsServer(srv, emb)
	var bn grpctest.Net
	lis := bn.MustListen(t, "embeddings")
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	cc := bn.Dial(t, lis.Addr().String())
	u, err := NewUpdates(UpdateOptions{Model: "m", Rows: 8, Tables: []UpdateTable{{Name: "a", Rows: 100, Dim: 4}, {Name: "b", Rows: 100, Dim: 4}}})
	if err != nil {
		t.Fatal(err)
	}
	sum, err := RunUpdates(context.Background(), Options{Clients: 2, Duration: time.Minute, MaxRequests: 40}, u, GRPCUpdater{Client: prismv1.NewEmbeddingsClient(cc)})
	if err != nil {
		t.Fatal(err)
	}
	if sum.Kind != KindUpdates || sum.Sent != 40 || sum.OK != 20 || sum.ErrorsByCode["InvalidArgument"] != 20 || sum.MeanCand != 8 {
		t.Fatalf("summary %+v: want 40 updates sent, 20 acknowledged of 8 rows, 20 refused", sum)
	}
	if !strings.Contains(sum.FirstErrors["InvalidArgument"], `no table "b"`) {
		t.Fatalf("first errors %v", sum.FirstErrors)
	}
	emb.mu.Lock()
	defer emb.mu.Unlock()
	if emb.rows != 160 {
		t.Fatalf("the server took %d rows, want 160", emb.rows)
	}
	var b strings.Builder
	sum.WriteText(&b)
	for _, want := range []string{"updates     sent 40  ok 20  errors 20", "updates/s", "rows/s", "8.0 rows/update", "of updates answered OK"} {
		if !strings.Contains(b.String(), want) {
			t.Fatalf("report lacks %q:\n%s", want, b.String())
		}
	}
}

// scriptedUpdates is an UpdateSender that answers the attempts of a run
// in turn from a script (the last outcome for every attempt after it),
// and keeps a copy of every attempt's update.
type scriptedUpdates struct {
	script []outcome
	mu     sync.Mutex
	sent   []*prismv1.UpdateRequest
}

func (s *scriptedUpdates) Update(_ context.Context, req *prismv1.UpdateRequest) error {
	s.mu.Lock()
	i := min(len(s.sent), len(s.script)-1)
	s.sent = append(s.sent, proto.Clone(req).(*prismv1.UpdateRequest))
	s.mu.Unlock()
	return s.script[i].err()
}

// TestUpdateRetries: which answers to an update are retried, as a
// trainer retries them: the router's update queue full
// (ResourceExhausted), its start-up window ("retry in N ms", Unavailable
// with a pushback) and no embedding worker right now (Unavailable) are;
// bad input, an unknown model, a refusal of the router's setup and a
// deadline are not, even when Retry.Codes names them. A retry sends
// the same update, the latency is from the first attempt's intended
// send time (fake time: the backoff is 10 ms, the jitter's draw 0.5),
// and the report counts the attempts in updates.
func TestUpdateRetries(t *testing.T) {
	every := []codes.Code{codes.ResourceExhausted, codes.Unavailable, codes.InvalidArgument, codes.NotFound, codes.FailedPrecondition, codes.DeadlineExceeded}
	for _, tc := range []struct {
		name      string
		first     outcome
		attempts  int
		latencyMs float64
		pushbacks int64
	}{
		{name: "queue full", first: outcome{code: codes.ResourceExhausted}, attempts: 2, latencyMs: 10},
		{name: "start-up window, with its pushback", first: outcome{code: codes.Unavailable, pushback: []string{"25"}}, attempts: 2, latencyMs: 25, pushbacks: 1},
		{name: "no embedding worker right now", first: outcome{code: codes.Unavailable}, attempts: 2, latencyMs: 10},
		{name: "bad input", first: outcome{code: codes.InvalidArgument}, attempts: 1},
		{name: "model not served", first: outcome{code: codes.NotFound}, attempts: 1},
		{name: "routers naming each other", first: outcome{code: codes.FailedPrecondition}, attempts: 1},
		{name: "deadline", first: outcome{code: codes.DeadlineExceeded}, attempts: 1},
	} {
		for _, named := range []bool{false, true} {
			name := tc.name
			retry := Retry{Retries: 3}
			if named {
				name += ", every code named"
				retry.Codes = every
			}
			t.Run(name, func(t *testing.T) {
				synctest.Test(t, func(t *testing.T) {
					s := &scriptedUpdates{script: []outcome{tc.first, {}}}
					u, err := NewUpdates(UpdateOptions{Model: "m", Rows: 4, Tables: []UpdateTable{{Name: "t", Rows: 100, Dim: 2}}})
					if err != nil {
						t.Fatal(err)
					}
					o := Options{Profile: Constant(1), Duration: time.Second, MaxRequests: 1, Retry: retry, retryDraw: func() float64 { return 0.5 }}
					sum, err := RunUpdates(context.Background(), o, u, s)
					if err != nil {
						t.Fatal(err)
					}
					if sum.Sent != 1 || len(s.sent) != tc.attempts {
						t.Fatalf("sent %d, %d attempts; want 1 and %d", sum.Sent, len(s.sent), tc.attempts)
					}
					for i, req := range s.sent[1:] {
						if !proto.Equal(req, s.sent[0]) {
							t.Fatalf("attempt %d sent %v, the first %v: not the same update", i+2, req, s.sent[0])
						}
					}
					if tc.attempts == 1 {
						if sum.ErrorsByCode[tc.first.code.String()] != 1 {
							t.Fatalf("errors %v, want one %v", sum.ErrorsByCode, tc.first.code)
						}
					} else if sum.OK != 1 || sum.Max < tc.latencyMs || sum.Max > tc.latencyMs*1.002+0.002 {
						t.Fatalf("ok %d latency %v ms, want acknowledged in %v ms from its first attempt's intended time", sum.OK, sum.Max, tc.latencyMs)
					}
					r := sum.Retry
					if r == nil || r.Attempts != int64(tc.attempts) || r.Pushbacks != tc.pushbacks || r.RetriedOK != int64(tc.attempts-1) {
						t.Fatalf("retry stats %+v; want %d attempts, %d pushbacks", r, tc.attempts, tc.pushbacks)
					}
					var b strings.Builder
					sum.WriteText(&b)
					want := fmt.Sprintf("retries     up to 3: %d attempts, %d.00 an update; %d.0 attempts/s against 1.0 updates/s offered", tc.attempts, tc.attempts, tc.attempts)
					if !strings.Contains(b.String(), want) || !strings.Contains(b.String(), "updates by attempts") {
						t.Fatalf("report lacks %q:\n%s", want, b.String())
					}
				})
			})
		}
	}
}

// refusingEmbeddings refuses the first Refuse updates it is sent with
// Unavailable and the pushback Pushback, as a router does in its
// start-up window, then acknowledges; it records every attempt.
type refusingEmbeddings struct {
	prismv1.UnimplementedEmbeddingsServer
	Refuse   int
	Pushback string
	mu       sync.Mutex
	attempts []*prismv1.UpdateRequest
	acked    []*prismv1.UpdateRequest
}

func (f *refusingEmbeddings) Update(ctx context.Context, req *prismv1.UpdateRequest) (*prismv1.UpdateResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.attempts = append(f.attempts, req)
	if len(f.attempts) <= f.Refuse {
		_ = grpc.SetTrailer(ctx, metadata.Pairs(PushbackKey, f.Pushback))
		return nil, status.Errorf(codes.Unavailable, "router started moments ago; retry in %s ms", f.Pushback)
	}
	f.acked = append(f.acked, req)
	return &prismv1.UpdateResponse{Workers: 1}, nil
}

// TestUpdateRetriesOverGRPC: an update stream against an Embeddings
// service that answers its first updates Unavailable with a pushback,
// then acknowledges: with --retries every update is acknowledged, each
// retry the update refused, and the report counts the attempts, from
// the generator's retry loop and from grpc-go's own (Retry.GRPC: the
// service config's policy for Embeddings/Update and AttemptCounter).
func TestUpdateRetriesOverGRPC(t *testing.T) {
	for _, tc := range []struct {
		name string
		grpc bool
	}{{name: "loadgen"}, {name: "grpc-go", grpc: true}} {
		t.Run(tc.name, func(t *testing.T) {
			f := &refusingEmbeddings{Refuse: 3, Pushback: "20"}
			retry := Retry{Retries: 4, Initial: time.Millisecond, GRPC: tc.grpc}
			var bn grpctest.Net
			lis := bn.MustListen(t, "embeddings")
			srv := grpc.NewServer()
			prismv1.RegisterEmbeddingsServer(srv, f)
			go func() { _ = srv.Serve(lis) }()
			t.Cleanup(srv.Stop)
			var opts []grpc.DialOption
			if tc.grpc {
				opts = append(opts, grpc.WithDefaultServiceConfig(ServiceConfig(retry, nil)), grpc.WithStatsHandler(AttemptCounter{}))
			}
			cc := bn.Dial(t, lis.Addr().String(), opts...)
			u, err := NewUpdates(UpdateOptions{Model: "m", Rows: 8, Tables: []UpdateTable{{Name: "a", Rows: 100, Dim: 4}}})
			if err != nil {
				t.Fatal(err)
			}
			// One client: the refusals fall on the first update, each
			// retry of it refused until the fourth attempt.
			o := Options{Clients: 1, Duration: time.Minute, MaxRequests: 5, Retry: retry}
			sum, err := RunUpdates(context.Background(), o, u, GRPCUpdater{Client: prismv1.NewEmbeddingsClient(cc)})
			if err != nil {
				t.Fatal(err)
			}
			if sum.Sent != 5 || sum.OK != 5 || sum.Errors != 0 {
				t.Fatalf("sent %d, acknowledged %d, errors %v; want all 5 acknowledged", sum.Sent, sum.OK, sum.ErrorsByCode)
			}
			r := sum.Retry
			if r == nil || r.Attempts != 8 || len(r.ByAttempts) != 4 || r.ByAttempts[0] != 4 || r.ByAttempts[3] != 1 || r.RetriedOK != 1 {
				t.Fatalf("retry stats %+v; want 8 attempts, 4 updates of one and 1 of four", r)
			}
			if !tc.grpc && r.Pushbacks != 3 {
				t.Fatalf("%d retries timed by the pushback, want 3", r.Pushbacks)
			}
			// The pushbacks' 60 ms are in the first update's latency.
			if sum.Max < 60 {
				t.Fatalf("max latency %v ms: the first update's retries waited less than its three 20 ms pushbacks", sum.Max)
			}
			f.mu.Lock()
			defer f.mu.Unlock()
			for i := 1; i <= 3; i++ {
				if !proto.Equal(f.attempts[i], f.attempts[0]) {
					t.Fatalf("attempt %d is another update: %v, the first %v", i+1, f.attempts[i], f.attempts[0])
				}
			}
			if len(f.acked) != 5 {
				t.Fatalf("the service acknowledged %d updates, want 5", len(f.acked))
			}
		})
	}
}
