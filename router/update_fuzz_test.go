package router

import (
	"context"
	"encoding/binary"
	"log/slog"
	"math"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/prism-serve/prism/api/prismv1"
)

// FuzzEmbeddingsUpdate sends Embeddings.Update requests built from
// arbitrary bytes to a sequencing router past its start-up window
// serving two models: "m" on two embedding workers, and "s" sharded in
// two, table "r" row-wise over both shards (100 rows) and table "w" on
// shard 0 alone. Each request ends in a documented status, never a panic
// or Internal; an update answered OK names at least one worker and, for
// the row-wise table, holds only ids inside it; and after it (and a
// heartbeat's catch-up) a valid update of each model still goes through:
// no input leaves a sequence stalled.
func FuzzEmbeddingsUpdate(f *testing.F) {
	// The router starts three heartbeats in the past, its workers
	// announce, and its clock is then set to the wall clock's (the
	// deadlines'): past the start-up window without waiting.
	var skew atomic.Int64
	skew.Store(-int64(3*time.Hour) - 1)
	r := testRouter(Options{
		Logger: slog.New(slog.DiscardHandler), Heartbeat: time.Hour, DefaultTimeout: 2 * time.Second,
		now: func() time.Time { return time.Now().Add(time.Duration(skew.Load())) },
	})
	f.Cleanup(r.Close)
	r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{Id: "gpu", Role: prismv1.Role_ROLE_DENSE, Addr: "dense:a", Models: []string{"m", "s"}, Healthy: true}})
	rows := []*prismv1.RowSplit{{Table: "r", Shards: []int32{0, 1}, Rows: 100}}
	type worker struct {
		cn    *seqCN
		addr  string
		model string
		shard *prismv1.ShardRef
	}
	var ws []*worker
	for _, w := range []*worker{
		{model: "m"}, {model: "m"},
		{model: "s", shard: &prismv1.ShardRef{Shard: 0, Shards: 2, Tables: []string{"r", "w"}, RowSplits: rows, RowSplitsComplete: true}},
		{model: "s", shard: &prismv1.ShardRef{Shard: 1, Shards: 2, Tables: []string{"r"}, RowSplits: rows, RowSplitsComplete: true}},
	} {
		w.cn = &seqCN{}
		w.addr = serveInproc(f, func(s *grpc.Server) { prismv1.RegisterEmbeddingTierServer(s, w.cn) })
		ws = append(ws, w)
	}
	announce := func() {
		for _, w := range ws {
			info := &prismv1.WorkerInfo{Id: "cpu" + w.addr, Role: prismv1.Role_ROLE_EMBEDDING, Addr: w.addr, Models: []string{w.model}, Healthy: true,
				UpdateSeq: map[string]int64{w.model: w.cn.held()}}
			if w.shard != nil {
				info.Shards = map[string]*prismv1.ShardRef{w.model: w.shard}
			}
			if _, err := r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: info}); err != nil {
				f.Fatalf("announce: %v", err)
			}
		}
	}
	announce()
	skew.Store(0)
	announce()
	u := r.Updater()
	row := func(vs ...float32) []byte {
		var b []byte
		for _, v := range vs {
			b = binary.LittleEndian.AppendUint32(b, math.Float32bits(v))
		}
		return b
	}
	for _, req := range []*prismv1.UpdateRequest{
		{Model: "m", Table: "t", Ids: []int64{1}, Rows: row(1)},
		{Model: "m", Table: "t", Ids: []int64{1, 2}, Rows: row(1, 2, 3, 4)},
		{Model: "m", Table: "bad", Ids: []int64{3}, Rows: row(1)},
		{Model: "s", Table: "r", Ids: []int64{0, 1, 2, 99}, Rows: row(1, 2, 3, 4)},
		{Model: "s", Table: "r", Ids: []int64{1, 100}, Rows: row(1, 2)},
		{Model: "s", Table: "r", Ids: []int64{1 << 62}, Rows: row(1)},
		{Model: "s", Table: "w", Ids: []int64{5, 1 << 40}, Rows: row(1, 2)},
		{Model: "s", Table: "x", Ids: []int64{5}, Rows: row(1)},
		{Model: "nope", Table: "t", Ids: []int64{1}, Rows: row(1)},
		{Model: "m", Table: "t", Ids: []int64{1}, Rows: row(float32(math.Inf(1)))},
		{Model: "m", Table: "t", Ids: []int64{-1}, Rows: row(1)},
		{},
	} {
		b, err := proto.Marshal(req)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	valid := []*prismv1.UpdateRequest{
		{Model: "m", Table: "t", Ids: []int64{7}, Rows: row(0.5)},
		{Model: "s", Table: "r", Ids: []int64{7, 8}, Rows: row(0.5, 0.5)},
		{Model: "s", Table: "w", Ids: []int64{7}, Rows: row(0.5)},
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		req := &prismv1.UpdateRequest{}
		if proto.Unmarshal(b, req) != nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		resp, err := u.Update(ctx, req)
		switch status.Code(err) {
		case codes.OK:
			if resp.GetWorkers() < 1 {
				t.Fatalf("update %v: OK from %d workers", req, resp.GetWorkers())
			}
			if req.GetModel() == "s" && req.GetTable() == "r" {
				for _, id := range req.GetIds() {
					if id >= 100 {
						t.Fatalf("update %v: id %d of a 100-row row-wise table taken", req, id)
					}
				}
			}
		case codes.InvalidArgument, codes.NotFound, codes.Unavailable, codes.FailedPrecondition, codes.DeadlineExceeded:
		default:
			t.Fatalf("update %v: %v (not a status a client is told to expect)", req, err)
		}
		// A heartbeat: what a worker missed is caught up.
		announce()
		r.upd.tick(context.Background())
		r.upd.wait()
		announce()
		for _, v := range valid {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_, err := u.Update(ctx, v)
			cancel()
			if err != nil {
				t.Fatalf("after update %v: a valid update %v: %v", req, v, err)
			}
		}
	})
}
