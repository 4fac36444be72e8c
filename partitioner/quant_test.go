package partitioner

import (
	"testing"

	pb "github.com/prism-serve/prism/internal/onnxpb"
)

// TestTableStreamDequantizes: an 8-bit table part is written as its
// DequantizeLinear values, (q - zero point) * scale, per tensor, per
// column and per row, the row's scale found in every chunk of rows the
// stream reads (a table past one chunk: 1<<14 rows).
func TestTableStreamDequantizes(t *testing.T) {
	const rows, dim = 40000, 3
	for _, tc := range []struct {
		name string
		elem pb.TensorProto_DataType
		axis int // -1 per tensor
	}{
		{"int8 per tensor", pb.TensorProto_INT8, -1},
		{"uint8 per column", pb.TensorProto_UINT8, 1},
		{"int8 per row", pb.TensorProto_INT8, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			raw := make([]byte, rows*dim)
			for i := range raw {
				raw[i] = byte(i*7 + i/dim)
			}
			channels := 1
			switch tc.axis {
			case 0:
				channels = rows
			case 1:
				channels = dim
			}
			scale, zp := make([]float32, channels), make([]int32, channels)
			for c := range channels {
				scale[c] = float32(c%13+1) / 64
				zp[c] = int32(c%5) - 2
				if tc.elem == pb.TensorProto_UINT8 {
					zp[c] += 128
				}
			}
			var sdims []int64
			if tc.axis >= 0 {
				sdims = []int64{int64(channels)}
			}
			part := &pb.TensorProto{Name: "t_quantized", DataType: int32(tc.elem), Dims: []int64{rows, dim}, RawData: raw}
			src := &tableSource{name: "t", parts: []*pb.TensorProto{part}, rows: rows, dim: dim, deq: map[string]*dequant{part.GetName(): {
				scale: &pb.TensorProto{Name: "s", DataType: int32(pb.TensorProto_FLOAT), Dims: sdims, FloatData: scale},
				zp:    &pb.TensorProto{Name: "z", DataType: int32(tc.elem), Dims: sdims, Int32Data: zp},
				axis:  tc.axis,
			}}}
			var got []float32
			if err := tableStream(src, t.TempDir())(func(v []float32) error {
				got = append(got, v...)
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			if len(got) != rows*dim {
				t.Fatalf("%d values, want %d", len(got), rows*dim)
			}
			for i, v := range got {
				c := 0
				switch tc.axis {
				case 0:
					c = i / dim
				case 1:
					c = i % dim
				}
				q := int32(raw[i])
				if tc.elem == pb.TensorProto_INT8 {
					q = int32(int8(raw[i]))
				}
				if want := float32(q-zp[c]) * scale[c]; v != want {
					t.Fatalf("value %d (row %d): %g, want %g", i, i/dim, v, want)
				}
			}
		})
	}
}
