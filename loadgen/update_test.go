package loadgen

import (
	"context"
	"encoding/binary"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

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
