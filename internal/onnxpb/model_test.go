package onnxpb_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	pb "github.com/prism-serve/prism/internal/onnxpb"
)

// smallModel is Y = Gather(table, ids) with a table large enough to go
// external and a small constant that stays inline.
func smallModel() *pb.ModelProto {
	table := make([]float32, 64*8)
	for i := range table {
		table[i] = float32(i) * 0.25
	}
	return &pb.ModelProto{
		IrVersion:   8,
		OpsetImport: []*pb.OperatorSetIdProto{{Version: 18}},
		Graph: &pb.GraphProto{
			Name: "g",
			Node: []*pb.NodeProto{{Name: "gather", OpType: "Gather", Input: []string{"table", "ids"}, Output: []string{"y"}}},
			Initializer: []*pb.TensorProto{
				pb.NewFloatTensor("table", []int64{64, 8}, table),
				pb.NewInt64Tensor("small", []int64{2}, []int64{1, 2}),
			},
			Input:  []*pb.ValueInfoProto{{Name: "ids"}},
			Output: []*pb.ValueInfoProto{{Name: "y"}},
		},
	}
}

func write(t *testing.T, path string, m *pb.ModelProto, o pb.WriteOptions) {
	t.Helper()
	if err := pb.WriteModel(path, m, o); err != nil {
		t.Fatal(err)
	}
}

func read(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestRoundTripInline(t *testing.T) {
	dir := t.TempDir()
	a, b := filepath.Join(dir, "a.onnx"), filepath.Join(dir, "b.onnx")
	write(t, a, smallModel(), pb.WriteOptions{External: pb.ExternalNever})
	m, err := pb.ReadModel(a, pb.ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(m, smallModel()) {
		t.Fatal("read model differs from written model")
	}
	write(t, b, m, pb.WriteOptions{External: pb.ExternalNever})
	if !bytes.Equal(read(t, a), read(t, b)) {
		t.Fatal("save, load, save gave different bytes")
	}
}

func TestRoundTripExternal(t *testing.T) {
	dirA, dirB := t.TempDir(), t.TempDir()
	a, b := filepath.Join(dirA, "model.onnx"), filepath.Join(dirB, "model.onnx")
	orig := smallModel()
	write(t, a, orig, pb.WriteOptions{External: pb.ExternalAlways})
	// The caller's model is untouched by writing it.
	if !proto.Equal(orig, smallModel()) {
		t.Fatal("WriteModel changed its input model")
	}
	// The table went out (with the official entries), the small tensor stayed.
	lazy, err := pb.ReadModel(a, pb.ReadOptions{SkipExternalData: true})
	if err != nil {
		t.Fatal(err)
	}
	tab := lazy.Graph.Initializer[0]
	ref, ext, err := pb.External(tab)
	if err != nil || !ext || ref.Location != "model.onnx.data" || ref.Offset != 0 || ref.Length != 64*8*4 {
		t.Fatalf("table external ref = %+v ext=%v err=%v", ref, ext, err)
	}
	if len(tab.RawData) != 0 || lazy.Graph.Initializer[1].DataLocation != pb.TensorProto_DEFAULT {
		t.Fatal("external tensors should have no raw data, small ones should stay inline")
	}
	full, err := pb.ReadModel(a, pb.ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(full, smallModel()) {
		t.Fatal("external data did not round-trip")
	}
	write(t, b, full, pb.WriteOptions{External: pb.ExternalAlways})
	if !bytes.Equal(read(t, a), read(t, b)) || !bytes.Equal(read(t, a+".data"), read(t, b+".data")) {
		t.Fatal("save, load, save of an external-data model gave different bytes")
	}
}

// TestBadFiles: each broken model is an error that names the file and
// says what failed.
func TestBadFiles(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.onnx")
	write(t, good, smallModel(), pb.WriteOptions{External: pb.ExternalAlways})
	goodBytes := read(t, good)
	data := read(t, good+".data")

	cases := []struct {
		name  string
		setup func(dir string) string // returns the model path
		want  []string
	}{
		{"missing", func(d string) string { return filepath.Join(d, "none.onnx") }, []string{"none.onnx", "no such file"}},
		{"empty", func(d string) string {
			p := filepath.Join(d, "empty.onnx")
			os.WriteFile(p, nil, 0o644)
			return p
		}, []string{"empty.onnx", "empty file"}},
		{"not onnx", func(d string) string {
			p := filepath.Join(d, "text.onnx")
			os.WriteFile(p, []byte("label,I1,I2\n0,1,2\n"), 0o644)
			return p
		}, []string{"text.onnx"}},
		{"truncated", func(d string) string {
			p := filepath.Join(d, "trunc.onnx")
			os.WriteFile(p, goodBytes[:len(goodBytes)-7], 0o644)
			return p
		}, []string{"trunc.onnx"}},
		{"corrupt", func(d string) string {
			p := filepath.Join(d, "corrupt.onnx")
			b := append([]byte(nil), goodBytes...)
			for i := 0; i < len(b); i += 5 {
				b[i] ^= 0xff
			}
			os.WriteFile(p, b, 0o644)
			return p
		}, []string{"corrupt.onnx"}},
		{"external file missing", func(d string) string {
			p := filepath.Join(d, "good.onnx")
			os.WriteFile(p, goodBytes, 0o644)
			return p
		}, []string{"good.onnx.data", "no such file", "table"}},
		{"external file short", func(d string) string {
			p := filepath.Join(d, "good.onnx")
			os.WriteFile(p, goodBytes, 0o644)
			os.WriteFile(p+".data", data[:len(data)-100], 0o644)
			return p
		}, []string{"good.onnx.data", "truncated", "table"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			path := tc.setup(t.TempDir())
			_, err := pb.ReadModel(path, pb.ReadOptions{})
			if err == nil {
				t.Fatal("no error")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
			if !strings.Contains(err.Error(), filepath.Base(path)) {
				t.Errorf("error %q does not name the file", err)
			}
		})
	}
}

func TestExternalLocationMustStayInFolder(t *testing.T) {
	tab := &pb.TensorProto{Name: "t", DataLocation: pb.TensorProto_EXTERNAL, ExternalData: []*pb.StringStringEntryProto{{Key: "location", Value: "../../etc/passwd"}}}
	if _, _, err := pb.External(tab); err == nil || !strings.Contains(err.Error(), "inside the model's folder") {
		t.Fatalf("err = %v", err)
	}
}

func TestFloatDataToRaw(t *testing.T) {
	tt := &pb.TensorProto{Name: "f", Dims: []int64{3}, DataType: int32(pb.TensorProto_FLOAT), FloatData: []float32{1, -2, 0.5}}
	if err := pb.ToRaw(tt); err != nil {
		t.Fatal(err)
	}
	got, err := pb.Float32s(tt)
	if err != nil || len(got) != 3 || got[1] != -2 || got[2] != 0.5 {
		t.Fatalf("got %v, %v", got, err)
	}
}

// TestTypedDataToRaw: every type onnx.proto keeps in int32_data (bool,
// 8- and 16-bit integers, float16 and bfloat16 bit patterns) or
// uint64_data (uint32, uint64), as onnx.helper.make_tensor writes them,
// moves to raw_data at its own element size, so WriteModel can move such
// a tensor to external data. They used to be "cannot convert".
func TestTypedDataToRaw(t *testing.T) {
	for _, c := range []struct {
		dt   pb.TensorProto_DataType
		i32  []int32
		u64  []uint64
		want []byte
	}{
		{dt: pb.TensorProto_BOOL, i32: []int32{1, 0, 1}, want: []byte{1, 0, 1}},
		{dt: pb.TensorProto_INT8, i32: []int32{-1, 2, -128}, want: []byte{0xff, 2, 0x80}},
		{dt: pb.TensorProto_UINT8, i32: []int32{255, 0, 7}, want: []byte{255, 0, 7}},
		{dt: pb.TensorProto_INT16, i32: []int32{-2, 1, 0x1234}, want: []byte{0xfe, 0xff, 1, 0, 0x34, 0x12}},
		{dt: pb.TensorProto_UINT16, i32: []int32{0xffff, 1, 2}, want: []byte{0xff, 0xff, 1, 0, 2, 0}},
		{dt: pb.TensorProto_FLOAT16, i32: []int32{0x3c00, 0xc000, 0}, want: []byte{0, 0x3c, 0, 0xc0, 0, 0}}, // 1, -2, 0
		{dt: pb.TensorProto_BFLOAT16, i32: []int32{0x3f80, 0, 0x4000}, want: []byte{0x80, 0x3f, 0, 0, 0, 0x40}},
		{dt: pb.TensorProto_INT32, i32: []int32{-1, 1, 2}, want: []byte{0xff, 0xff, 0xff, 0xff, 1, 0, 0, 0, 2, 0, 0, 0}},
		{dt: pb.TensorProto_UINT32, u64: []uint64{0xffffffff, 1, 2}, want: []byte{0xff, 0xff, 0xff, 0xff, 1, 0, 0, 0, 2, 0, 0, 0}},
		{dt: pb.TensorProto_UINT64, u64: []uint64{1 << 63, 1, 2}, want: []byte{0, 0, 0, 0, 0, 0, 0, 0x80, 1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0}},
	} {
		tt := &pb.TensorProto{Name: "x", Dims: []int64{3}, DataType: int32(c.dt), Int32Data: c.i32, Uint64Data: c.u64}
		if err := pb.ToRaw(tt); err != nil {
			t.Errorf("%v: %v", c.dt, err)
			continue
		}
		if !bytes.Equal(tt.RawData, c.want) || tt.Int32Data != nil || tt.Uint64Data != nil {
			t.Errorf("%v: raw %x (typed fields %v %v), want %x", c.dt, tt.RawData, tt.Int32Data, tt.Uint64Data, c.want)
		}
		if n, ok := pb.ByteSize(tt); !ok || n != int64(len(tt.RawData)) {
			t.Errorf("%v: %d raw bytes, its shape needs %d", c.dt, len(tt.RawData), n)
		}
	}
	// The same tensors, large enough, go to external data and come back.
	big := make([]int32, 600)
	for i := range big {
		big[i] = int32(i % 2)
	}
	m := smallModel()
	m.Graph.Initializer = append(m.Graph.Initializer, &pb.TensorProto{Name: "mask", Dims: []int64{600}, DataType: int32(pb.TensorProto_BOOL), Int32Data: big})
	path := filepath.Join(t.TempDir(), "model.onnx")
	write(t, path, m, pb.WriteOptions{External: pb.ExternalAlways, MinExternalBytes: 512})
	back, err := pb.ReadModel(path, pb.ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	mask := back.Graph.Initializer[2].RawData
	if len(mask) != 600 || mask[0] != 0 || mask[1] != 1 || mask[599] != 1 {
		t.Fatalf("bool mask read back as %d bytes", len(mask))
	}
}
