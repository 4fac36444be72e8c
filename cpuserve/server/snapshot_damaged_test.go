package server_test

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/cpuserve/server"
	"github.com/prism-serve/prism/cpuserve/store"
)

// TestSnapshotRefusedWhenDamaged: a worker whose store has a damaged
// file sends no copy of it (the damage would go with the copy, each
// file's checksum being of its bytes as they are, and opening the copy
// reads no block): FailedPrecondition naming the file, so the worker
// mending itself asks another.
func TestSnapshotRefusedWhenDamaged(t *testing.T) {
	shared := fuzzSetup(t)
	db := filepath.Join(t.TempDir(), "db")
	open := func() (*store.Store, *server.Server) {
		st, err := store.Open(db, &store.Options{NoSync: true, HotBytes: -1, Preload: store.PreloadOff})
		if err != nil {
			t.Fatal(err)
		}
		srv, err := server.New(context.Background(), st, server.Options{
			Plans: []string{shared.dir}, MaxSamples: 64, Threads: 1, AnyDenseAddr: true,
			DialOptions: []grpc.DialOption{shared.net.DialOption()}, Logger: slog.New(slog.DiscardHandler),
		})
		if err != nil {
			st.Close()
			t.Fatal(err)
		}
		return st, srv
	}
	st, srv := open()
	srv.Close()
	st.Close()
	// Flip a byte in the middle of the largest table file.
	var big string
	var size int64
	ents, _ := os.ReadDir(db)
	for _, e := range ents {
		if fi, err := e.Info(); err == nil && strings.HasSuffix(e.Name(), ".sst") && fi.Size() > size {
			big, size = filepath.Join(db, e.Name()), fi.Size()
		}
	}
	if big == "" {
		t.Fatal("no table file")
	}
	b, err := os.ReadFile(big)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/3] ^= 0xff
	if err := os.WriteFile(big, b, 0o644); err != nil {
		t.Fatal(err)
	}
	st, srv = open()
	defer st.Close()
	defer srv.Close()
	// Read every row of every table until a read finds the damage.
	for _, tb := range shared.plan.Tables {
		for id := int64(0); id < tb.Rows && st.Damaged() == ""; id++ {
			_ = st.Lookup(shared.plan.Model.Name, []store.TableLookup{{Table: tb.Name, IDs: []int64{id}, Bag: 1, Pooling: store.PoolSum, Out: make([]float32, tb.Dim)}})
		}
	}
	if !strings.HasSuffix(st.Damaged(), filepath.Base(big)) {
		t.Fatalf("no read found %s damaged (Damaged() = %q)", big, st.Damaged())
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err = srv.Snapshot(&prismv1.SnapshotRequest{}, &chunkSink{ctx: ctx})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), filepath.Base(big)) {
		t.Fatalf("snapshot of a damaged store: %v, want FailedPrecondition naming %s", err, filepath.Base(big))
	}
}
