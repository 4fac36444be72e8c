package arrowframe

import (
	"fmt"
	"testing"
)

// dlrmCut is the cut of dlrm-kaggle for n samples: 26 pooled embeddings of
// 16 floats and 13 dense features.
func dlrmCut(n int) []Tensor {
	ts := []Tensor{{Name: "dense", Width: 13, Data: make([]float32, 13*n)}}
	for k := range 26 {
		ts = append(ts, Tensor{Name: fmt.Sprintf("/Gather_%d_output_0", k+1), Width: 16, Data: make([]float32, 16*n)})
	}
	return ts
}

func BenchmarkEncodeArrowGo270(b *testing.B) {
	ts := dlrmCut(270)
	b.SetBytes(int64(270 * (13 + 26*16) * 4))
	for b.Loop() {
		if _, err := encodeWithArrow(nil, 270, ts); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecode270(b *testing.B) {
	buf, _ := Encode(270, dlrmCut(270))
	b.SetBytes(int64(len(buf)))
	for b.Loop() {
		if _, _, err := Decode(buf); err != nil {
			b.Fatal(err)
		}
	}
}

// dlrmCutDict is dlrmCut with every embedding dictionary-encoded over
// 43% distinct rows (what 270-candidate requests hold; BENCHMARKS.md).
func dlrmCutDict(n int) []Tensor {
	ts := dlrmCut(n)
	rows := n * 43 / 100
	for k := 1; k < len(ts); k++ {
		idx := make([]int32, n)
		for s := range idx {
			idx[s] = int32(s % rows)
		}
		ts[k].Data, ts[k].Index = ts[k].Data[:rows*16], idx
	}
	return ts
}

func BenchmarkEncodeDict270(b *testing.B) {
	ts := dlrmCutDict(270)
	var dst []byte
	for b.Loop() {
		out, err := AppendEncode(dst, 270, ts)
		if err != nil {
			b.Fatal(err)
		}
		dst = out[:0]
	}
}

func BenchmarkDecodeDict270(b *testing.B) {
	buf, _ := Encode(270, dlrmCutDict(270))
	b.SetBytes(int64(len(buf)))
	for b.Loop() {
		if _, _, err := Decode(buf); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDecodeDict270Reused: the same with the expansions' memory
// reused from frame to frame (DecodeWith's alloc; the dense worker pools
// them), against BenchmarkDecodeDict270's fresh allocations.
func BenchmarkDecodeDict270Reused(b *testing.B) {
	buf, _ := Encode(270, dlrmCutDict(270))
	b.SetBytes(int64(len(buf)))
	var free, used [][]float32
	alloc := func(n int) []float32 {
		var f []float32
		if len(free) > 0 && cap(free[len(free)-1]) >= n {
			f, free = free[len(free)-1][:n], free[:len(free)-1]
		} else {
			f = make([]float32, n)
		}
		used = append(used, f)
		return f
	}
	for b.Loop() {
		if _, _, err := DecodeWith(buf, alloc); err != nil {
			b.Fatal(err)
		}
		free, used = append(free, used...), used[:0]
	}
}
