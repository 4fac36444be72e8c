package prelookup

import (
	"fmt"
	"testing"

	"github.com/prism-serve/prism/plan"
)

// BenchmarkPackedColumns: a micro-batch of 512 samples of a packed
// [batch, 26] id input, every column picked (26 programs), as the
// embedding tier runs them for dlrm-kaggle-packed.
func BenchmarkPackedColumns(b *testing.B) {
	const n, f = 512, 26
	in := plan.TensorInfo{Name: "sparse", DType: "int64", Shape: []int64{f}}
	progs := make([]*Program, f)
	for k := range progs {
		p, err := Compile(in, []plan.PreOp{{Op: plan.PreColumn, Index: int64(k)}})
		if err != nil {
			b.Fatal(err)
		}
		progs[k] = p
	}
	ids := make([]int64, n*f)
	for i := range ids {
		ids[i] = int64(i)
	}
	b.SetBytes(int64(8 * len(ids)))
	// pick: each program picks its column from the packed input (26
	// strided passes); split: the input split into its columns once
	// (Columns), each program run on its column (what the embedding
	// tier does when several lookups pick from one input).
	b.Run("pick", func(b *testing.B) {
		for b.Loop() {
			for _, p := range progs {
				out, err := p.Run(n, nil, ids)
				if err != nil || len(out) != n {
					b.Fatal(fmt.Sprint(err, len(out)))
				}
			}
		}
	})
	b.Run("split", func(b *testing.B) {
		buf := make([]int64, n*f) // the embedding tier reuses its buffer
		for b.Loop() {
			cols, err := Columns(n, f, ids, buf)
			if err != nil {
				b.Fatal(err)
			}
			for k, p := range progs {
				out, err := p.RunColumn(n, cols[k*n:(k+1)*n])
				if err != nil || len(out) != n {
					b.Fatal(fmt.Sprint(err, len(out)))
				}
			}
		}
	})
}
