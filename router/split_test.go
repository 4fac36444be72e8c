package router

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
)

// A split update whose one part is acknowledged in a step whose write
// of the update log fails, and whose other part is acknowledged later
// with the log writable again: the client is not told OK, since the log
// on disk lacks the first part's acknowledgement (found by review: the
// part's acknowledgement came in an earlier step than the answer, which
// the step's own check of its write could not see).
func TestSplitUpdateWriteFailsForOnePart(t *testing.T) {
	var mu sync.Mutex
	clock := time.Unix(1000, 0)
	now := func() time.Time { mu.Lock(); defer mu.Unlock(); return clock }
	seq := newSequencer(clock, time.Second, 1<<20, 0, QuorumOne)
	gates := map[string]chan struct{}{"a": make(chan struct{}), "b": make(chan struct{})}
	entered := make(chan string, 2)
	call := func(_ context.Context, addr string, _ *prismv1.ApplyUpdateRequest) (*prismv1.UpdateResponse, error) {
		entered <- addr
		<-gates[addr]
		return &prismv1.UpdateResponse{Workers: 1}, nil
	}
	d := newUpdateDriver(seq, now, slog.New(slog.NewTextHandler(io.Discard, nil)), time.Second, 0, call)
	good, err := openUpdateLog("good", vfs.NewMem())
	if err != nil {
		t.Fatal(err)
	}
	defer good.Close()
	if _, _, err := d.restore(good); err != nil {
		t.Fatal(err)
	}
	rows := []*prismv1.RowSplit{{Table: "r", Shards: []int32{0, 1}, Rows: 10}}
	for k, id := range []string{"a", "b"} {
		d.announced(&prismv1.WorkerInfo{Id: id, Addr: id, Role: prismv1.Role_ROLE_EMBEDDING, Models: []string{"m"}, UpdateSeq: map[string]int64{"m": 0},
			Shards: map[string]*prismv1.ShardRef{"m": {Shard: int32(k), Shards: 2, Tables: []string{"r"}, RowSplits: rows, RowSplitsComplete: true}}})
	}
	mu.Lock()
	clock = clock.Add(4 * time.Second) // past the start-up window
	mu.Unlock()
	type answer struct {
		resp *prismv1.UpdateResponse
		err  error
	}
	res := make(chan answer, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		r, err := d.update(ctx, &prismv1.UpdateRequest{Model: "m", Table: "r", Ids: []int64{0, 1}, Rows: make([]byte, 8)})
		res <- answer{r, err}
	}()
	<-entered // both parts numbered, written and sent
	<-entered
	bad, err := openUpdateLog("bad", vfs.NewMem())
	if err != nil {
		t.Fatal(err)
	}
	bad.Close() // every write to it fails
	swap := func(l *updateLog) {
		d.wmu.Lock()
		d.ulog = l
		d.wmu.Unlock()
	}
	swap(bad)
	close(gates["a"]) // shard 0's part acknowledged; its write fails
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		d.mu.Lock()
		unwritten := seq.models["m#shard0"].unwritten
		d.mu.Unlock()
		if unwritten {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("shard 0's sequence never learnt its write failed")
		}
	}
	swap(good)
	close(gates["b"]) // shard 1's part acknowledged and written
	a := <-res
	d.wait()
	if status.Code(a.err) != codes.Unavailable {
		t.Fatalf("answered %v, %v: the log on disk lacks shard 0's acknowledgement", a.resp, a.err)
	}
}

// The sequencer's view for followers names a worker of another sharding
// as left out, also in a shard's sequence that has had no update (found
// by review: only sequences with numbers were described, so a follower
// served the reshard's worker the sequencer did not).
func TestDescribeLeavesOutAnotherSharding(t *testing.T) {
	now := time.Unix(1000, 0)
	s := newSequencer(now, time.Second, 1<<20, 0, QuorumOne)
	worker := func(id string, shard int32, sharding string, tables ...string) *prismv1.WorkerInfo {
		return &prismv1.WorkerInfo{Id: id, Addr: id, Role: prismv1.Role_ROLE_EMBEDDING, Models: []string{"m"}, UpdateSeq: map[string]int64{"m": 0},
			Shards: map[string]*prismv1.ShardRef{"m": {Shard: shard, Shards: 2, Tables: tables, Sharding: sharding, RowSplitsComplete: true}}}
	}
	s.announced(now, worker("x0", 0, "aa", "t"))
	s.announced(now, worker("x1", 1, "aa", "v"))
	now = now.Add(4 * time.Second)
	s.propose(now, 1, &prismv1.UpdateRequest{Model: "m", Table: "t", Ids: []int64{1}, Rows: make([]byte, 4)}, now.Add(time.Minute))
	s.applied(now, 1, "m#shard0", "x0", 1, nil)
	y1 := worker("y1", 1, "bb", "t")
	s.announced(now, y1)
	if s.inSync(y1, "m", now) {
		t.Fatal("the sequencer serves a worker of another sharding")
	}
	u := s.describe(now)["m#shard1"]
	if !slices.Contains(u.GetLeftOut(), "y1") {
		t.Fatalf("m#shard1's view leaves out %v, want y1 (view: %v)", u.GetLeftOut(), s.describe(now))
	}
}
