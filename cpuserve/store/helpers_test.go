package store

import (
	"github.com/prism-serve/prism/plan"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"

	"github.com/prism-serve/prism/internal/tablefile"
)

// testTable is a table for a test plan.
type testTable struct {
	name    string
	rows    int64
	dim     int
	seed    uint64
	unknown plan.UnknownIDs
	data    []float32 // filled by writePlan when nil
}

// writePlan writes a plan folder (plan.json, tables/*.arrow) for model
// and returns its path; tables' data are filled in place.
func writePlan(t testing.TB, model string, tables []*testTable) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "tables"), 0o755); err != nil {
		t.Fatal(err)
	}
	p := &plan.Plan{Version: plan.Version, Model: plan.ModelInfo{Name: model}, DenseModel: "dense.onnx",
		Outputs: []plan.TensorInfo{{Name: "score", DType: "float32", Shape: []int64{1}}}}
	for _, tt := range tables {
		if tt.data == nil {
			tt.data = randomTable(tt.rows, tt.dim, tt.seed)
		}
		file := tablefile.FileName(tt.name)
		meta, err := tablefile.Write(filepath.Join(dir, file), tt.name, tt.dim, tt.data, nil)
		if err != nil {
			t.Fatal(err)
		}
		p.Inputs = append(p.Inputs, plan.TensorInfo{Name: "ids_" + tt.name, DType: "int64", Shape: []int64{}, Sides: []plan.Side{plan.CPU}})
		p.Tables = append(p.Tables, plan.Table{
			Name: tt.name, File: file, Rows: meta.Rows, Dim: meta.Dim, DType: "float32", SHA256: meta.SHA256,
			UnknownIDs: tt.unknown,
			Lookups:    []plan.Lookup{{Input: "ids_" + tt.name, Bag: 1, Pooling: plan.PoolSum, Output: "emb_" + tt.name}},
		})
	}
	if err := plan.Write(dir, p); err != nil {
		t.Fatal(err)
	}
	return dir
}

// randomTable draws rows x dim values with a spread of magnitudes (rows
// scaled differently, some values tiny) so quantization bounds are tested
// across ranges.
func randomTable(rows int64, dim int, seed uint64) []float32 {
	r := rand.New(rand.NewPCG(seed, 7))
	out := make([]float32, rows*int64(dim))
	for i := range rows {
		scale := float32(r.ExpFloat64() * 0.1)
		for k := range dim {
			out[i*int64(dim)+int64(k)] = scale * float32(r.NormFloat64())
		}
	}
	return out
}

func openMem(t testing.TB, o *Options) (*Store, vfs.FS) {
	t.Helper()
	if o == nil {
		o = &Options{}
	}
	if o.FS == nil {
		o.FS = vfs.NewMem()
	}
	o.NoSync = false
	s, err := Open("db", o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, o.FS
}
