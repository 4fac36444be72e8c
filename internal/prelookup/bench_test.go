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
	for b.Loop() {
		for _, p := range progs {
			out, err := p.Run(n, nil, ids)
			if err != nil || len(out) != n {
				b.Fatal(fmt.Sprint(err, len(out)))
			}
		}
	}
}
