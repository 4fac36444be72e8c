package router

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
)

// syncWorker is an embedding worker whose every update is one synced
// write of a file, as the store's one synced batch per update: the cost
// a worker's apply has on this machine's disk, without the rest of the
// store.
type syncWorker struct {
	prismv1.UnimplementedEmbeddingTierServer
	mu      sync.Mutex
	seq     int64
	f       *os.File
	applied int64
}

func (w *syncWorker) Update(_ context.Context, req *prismv1.ApplyUpdateRequest) (*prismv1.UpdateResponse, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch seq := req.GetSeq(); {
	case seq <= w.seq:
		return &prismv1.UpdateResponse{Workers: 1}, nil
	case seq > w.seq+1:
		return nil, status.Errorf(codes.FailedPrecondition, "needs %d", w.seq+1)
	}
	if _, err := w.f.Write(req.GetUpdate().GetRows()); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	if err := w.f.Sync(); err != nil {
		return nil, status.Error(codes.Internal, err.Error())
	}
	w.seq = req.GetSeq()
	w.applied++
	return &prismv1.UpdateResponse{Workers: 1}, nil
}

// BenchmarkShardSequences: three embedding workers of one model, each a
// shard holding one table, and three clients each updating its own
// table (one 64-float row an update), over TCP on loopback; every
// worker's apply is a synced write. "per-shard": the workers announce
// their shards, so each shard numbers its own updates and is sent only
// those. "one-sequence": the same workers announce the whole model, so
// the model has one sequence, each update is numbered after the one
// before is answered and every worker applies it: the pattern of the
// release before per-shard sequences, which sent every shard every
// update (the other shards' as numbers alone, still a synced write
// each). Reported: updates/s and syncs per update.
//
//	go test -run '^$' -bench ShardSequences -benchtime 2s ./router/
func BenchmarkShardSequences(b *testing.B) {
	for _, sharded := range []bool{false, true} {
		name := "one-sequence"
		if sharded {
			name = "per-shard"
		}
		b.Run(name, func(b *testing.B) { benchShardSequences(b, sharded) })
	}
}

func benchShardSequences(b *testing.B, sharded bool) {
	const shards = 3
	r := New(Options{Heartbeat: 20 * time.Millisecond}, nil)
	defer r.Close()
	dir := b.TempDir()
	var workers []*syncWorker
	for k := range shards {
		f, err := os.Create(filepath.Join(dir, fmt.Sprintf("w%d", k)))
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		w := &syncWorker{f: f}
		workers = append(workers, w)
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		s := grpc.NewServer()
		prismv1.RegisterEmbeddingTierServer(s, w)
		go s.Serve(lis)
		defer s.Stop()
		info := &prismv1.WorkerInfo{Id: fmt.Sprintf("cpu%d", k), Role: prismv1.Role_ROLE_EMBEDDING, Addr: lis.Addr().String(), Models: []string{"m"}, Healthy: true, UpdateSeq: map[string]int64{"m": 0}}
		if sharded {
			info.Shards = map[string]*prismv1.ShardRef{"m": {Shard: int32(k), Shards: shards, Tables: []string{fmt.Sprintf("t%d", k)}}}
		}
		if _, err := r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: info}); err != nil {
			b.Fatal(err)
		}
	}
	time.Sleep(4 * r.opts.Heartbeat) // past the start-up window
	u := r.Updater()
	row := make([]byte, 64*4)
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	per := (b.N + shards - 1) / shards
	for k := range shards {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range per {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				_, err := u.Update(ctx, &prismv1.UpdateRequest{Model: "m", Table: fmt.Sprintf("t%d", k), Ids: []int64{int64(i)}, Rows: row})
				cancel()
				if err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	var syncs int64
	for _, w := range workers {
		syncs += w.applied
	}
	b.ReportMetric(float64(per*shards)/elapsed.Seconds(), "updates/s")
	b.ReportMetric(float64(syncs)/float64(per*shards), "syncs/update")
}
