package server_test

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"google.golang.org/grpc"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/cpuserve/server"
	"github.com/prism-serve/prism/cpuserve/store"
	"github.com/prism-serve/prism/internal/leview"
	"github.com/prism-serve/prism/plan"
)

// TestUpdateRowFactors: a table whose rows the model scales before its
// lookups (plan.Table.RowFactors: Paddle2ONNX's padding_idx row mask,
// whose table was written with the padding row zeroed) is updated
// alike: an update's rows are stored scaled, so the padding row stays
// zero whatever a trainer writes there (it wrote its raw parameter, and
// the padded slots of every request then added it to their pools).
func TestUpdateRowFactors(t *testing.T) {
	shared := fuzzSetup(t)
	dir := t.TempDir()
	for _, f := range []string{"plan.json", shared.plan.DenseModel} {
		b, err := os.ReadFile(filepath.Join(shared.dir, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	p, err := plan.Read(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "tables"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tab := range p.Tables {
		if err := os.Link(filepath.Join(shared.dir, tab.File), filepath.Join(dir, tab.File)); err != nil {
			t.Fatal(err)
		}
	}
	tab := &p.Tables[0]
	tab.RowFactors = map[int64]float32{5: 0, 6: 0.5}
	if err := plan.Write(dir, p); err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(filepath.Join(t.TempDir(), "db"), &store.Options{NoSync: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	srv, err := server.New(context.Background(), st, server.Options{
		Plans: []string{dir}, MaxSamples: 64, Threads: 1, AnyDenseAddr: true,
		DialOptions: []grpc.DialOption{shared.net.DialOption()}, Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	ids := []int64{5, 6, 7}
	rows := make([]float32, len(ids)*tab.Dim)
	for i := range rows {
		rows[i] = 1
	}
	if _, err := srv.Update(context.Background(), &prismv1.ApplyUpdateRequest{Seq: 1, Update: &prismv1.UpdateRequest{Model: p.Model.Name, Table: tab.Name, Ids: ids, Rows: leview.Bytes(rows)}}); err != nil {
		t.Fatal(err)
	}
	l := store.TableLookup{Table: tab.Name, IDs: ids, Pooling: store.PoolNone, Out: make([]float32, len(ids)*tab.Dim)}
	if err := st.Lookup(p.Model.Name, []store.TableLookup{l}); err != nil {
		t.Fatal(err)
	}
	for i, want := range []float32{0, 0.5, 1} {
		for _, v := range l.Out[i*tab.Dim : (i+1)*tab.Dim] {
			if v != want {
				t.Fatalf("row %d holds %v after an update of ones, want %v (its factor)", ids[i], l.Out[i*tab.Dim:(i+1)*tab.Dim], want)
			}
		}
	}
}
