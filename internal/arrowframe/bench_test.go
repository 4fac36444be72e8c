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
