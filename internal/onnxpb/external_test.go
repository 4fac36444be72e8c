package onnxpb_test

import (
	"bytes"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	pb "github.com/prism-serve/prism/internal/onnxpb"
)

// extModel is a model with one externally stored initializer "w" whose
// external_data entries are kv (key, value pairs) and whose dims and type
// are as given.
func extModel(dt pb.TensorProto_DataType, dims []int64, kv ...string) *pb.ModelProto {
	w := &pb.TensorProto{Name: "w", Dims: dims, DataType: int32(dt), DataLocation: pb.TensorProto_EXTERNAL}
	for i := 0; i+1 < len(kv); i += 2 {
		w.ExternalData = append(w.ExternalData, &pb.StringStringEntryProto{Key: kv[i], Value: kv[i+1]})
	}
	return &pb.ModelProto{
		IrVersion:   8,
		OpsetImport: []*pb.OperatorSetIdProto{{Version: 18}},
		Graph:       &pb.GraphProto{Name: "g", Initializer: []*pb.TensorProto{w}},
	}
}

// TestExternalDataBounds: every external-data field that does not fit
// the file or the tensor is an error naming the tensor and the file,
// from ReadModel (with and without data), LoadData and DataReader alike:
// never a panic, an allocation of a lying length, or a read outside the
// model's folder. Before the checks, "offset+length overflows" panicked
// in makeslice and "offset beyond the file" panicked in LoadData.
func TestExternalDataBounds(t *testing.T) {
	const dataLen = 256 // 64 float32
	f32 := pb.TensorProto_FLOAT
	max := strconv.FormatInt(math.MaxInt64, 10)
	outside := t.TempDir()
	if err := os.WriteFile(filepath.Join(outside, "secret"), make([]byte, dataLen), 0o644); err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name  string
		m     *pb.ModelProto
		setup func(dir string)
		want  string
	}{
		{"offset+length overflows", extModel(pb.TensorProto_UNDEFINED, []int64{64}, "location", "w.bin", "offset", "1", "length", max), nil, "overflows"},
		{"offset+length overflows, known type", extModel(f32, []int64{64}, "location", "w.bin", "offset", max, "length", "256"), nil, "overflows"},
		{"negative offset", extModel(f32, []int64{64}, "location", "w.bin", "offset", "-4"), nil, "not a non-negative integer"},
		{"negative length", extModel(f32, []int64{64}, "location", "w.bin", "length", "-1"), nil, "not a non-negative integer"},
		{"length not a number", extModel(f32, []int64{64}, "location", "w.bin", "length", "12x"), nil, "not a non-negative integer"},
		{"offset beyond the file", extModel(f32, []int64{64}, "location", "w.bin", "offset", "4096"), nil, "truncated"},
		{"offset beyond the file, no type", extModel(pb.TensorProto_STRING, []int64{64}, "location", "w.bin", "offset", "4096"), nil, "truncated"},
		{"length beyond the file", extModel(f32, []int64{128}, "location", "w.bin", "length", "512"), nil, "truncated"},
		{"extent beyond the file", extModel(f32, []int64{64}, "location", "w.bin", "offset", "4", "length", "256"), nil, "truncated"},
		{"length does not match dims", extModel(f32, []int64{32}, "location", "w.bin", "length", "256"), nil, "shape needs 128"},
		{"rest of file does not match dims", extModel(f32, []int64{65}, "location", "w.bin"), nil, "shape needs 260"},
		{"negative dims", extModel(f32, []int64{-2, -32}, "location", "w.bin"), nil, "negative dimension"},
		{"dims overflow", extModel(f32, []int64{1 << 62, 4}, "location", "w.bin", "length", "0"), nil, "overflows"},
		{"bytes overflow", extModel(f32, []int64{1 << 62}, "location", "w.bin", "length", "0"), nil, "overflows"},
		{"location given twice", extModel(f32, []int64{64}, "location", "w.bin", "location", "x.bin"), nil, "given twice"},
		{"location with ..", extModel(f32, []int64{64}, "location", "../w.bin"), nil, "inside the model's folder"},
		{"location absolute", extModel(f32, []int64{64}, "location", filepath.Join(outside, "secret")), nil, "inside the model's folder"},
		{"location through a symlink out", extModel(f32, []int64{64}, "location", "link.bin"), func(dir string) {
			if err := os.Symlink(filepath.Join(outside, "secret"), filepath.Join(dir, "link.bin")); err != nil {
				t.Fatal(err)
			}
		}, "symlink"},
		{"location through a symlinked folder", extModel(f32, []int64{64}, "location", "sub/secret"), func(dir string) {
			if err := os.Symlink(outside, filepath.Join(dir, "sub")); err != nil {
				t.Fatal(err)
			}
		}, "symlink"},
		{"location a folder", extModel(f32, []int64{64}, "location", "d"), func(dir string) {
			if err := os.Mkdir(filepath.Join(dir, "d"), 0o755); err != nil {
				t.Fatal(err)
			}
		}, "not a regular file"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, "w.bin"), make([]byte, dataLen), 0o644); err != nil {
				t.Fatal(err)
			}
			if tc.setup != nil {
				tc.setup(dir)
			}
			path := filepath.Join(dir, "m.onnx")
			writeRaw(t, path, tc.m)
			check := func(what string, err error) {
				t.Helper()
				if err == nil {
					t.Fatalf("%s: no error", what)
				}
				msg := err.Error()
				if !strings.Contains(msg, tc.want) || !strings.Contains(msg, `"w"`) {
					t.Errorf("%s: error %q should say %q and name tensor \"w\"", what, msg, tc.want)
				}
				if loc := location(tc.m); !strings.Contains(msg, loc) {
					t.Errorf("%s: error %q does not name the file %q", what, msg, loc)
				}
			}
			_, err := pb.ReadModel(path, pb.ReadOptions{})
			check("ReadModel", err)
			_, err = pb.ReadModel(path, pb.ReadOptions{SkipExternalData: true})
			check("ReadModel(SkipExternalData)", err)
			w := tc.m.Graph.Initializer[0]
			check("LoadData", pb.LoadData(w, dir))
			r, _, err := pb.DataReader(w, dir)
			if err == nil {
				io.Copy(io.Discard, r)
				r.Close()
			}
			check("DataReader", err)
		})
	}
}

// writeRaw writes m as it is (WriteModel refuses unresolved external data).
func writeRaw(t testing.TB, path string, m *pb.ModelProto) {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// location is the tensor's external file as the model names it.
func location(m *pb.ModelProto) string {
	for _, kv := range m.Graph.Initializer[0].ExternalData {
		if kv.Key == "location" {
			return kv.Value
		}
	}
	return ""
}

// TestExternalDataGoodExtents: the checks keep valid extents: an offset
// into the file, the length left out (to the end), a symlink that stays
// in the folder, and a zero-size tensor at the end of the file.
func TestExternalDataGoodExtents(t *testing.T) {
	f32 := pb.TensorProto_FLOAT
	cases := []struct {
		name string
		m    *pb.ModelProto
		n    int
	}{
		{"offset and length", extModel(f32, []int64{32}, "location", "w.bin", "offset", "128", "length", "128"), 128},
		{"to the end", extModel(f32, []int64{16}, "location", "w.bin", "offset", "192"), 64},
		{"symlink inside", extModel(f32, []int64{64}, "location", "in.bin"), 256},
		{"empty at the end", extModel(f32, []int64{0, 8}, "location", "w.bin", "offset", "256"), 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, "w.bin"), make([]byte, 256), 0o644); err != nil {
				t.Fatal(err)
			}
			if err := os.Symlink("w.bin", filepath.Join(dir, "in.bin")); err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(dir, "m.onnx")
			writeRaw(t, path, tc.m)
			m, err := pb.ReadModel(path, pb.ReadOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if got := len(m.Graph.Initializer[0].RawData); got != tc.n {
				t.Fatalf("%d bytes, want %d", got, tc.n)
			}
		})
	}
}

// TestReadModelFolder: a folder given for a model file says what to
// give: its model.onnx (prism models build's folder), the source model
// of a partition folder, or just that it is a folder.
func TestReadModelFolder(t *testing.T) {
	built, part, other := t.TempDir(), t.TempDir(), t.TempDir()
	os.WriteFile(filepath.Join(built, "model.onnx"), nil, 0o644)
	os.WriteFile(filepath.Join(part, "plan.json"), nil, 0o644)
	for dir, want := range map[string]string{
		built: "a folder, not an ONNX file (give " + filepath.Join(built, "model.onnx") + ")",
		part:  "a partition folder, not an ONNX file (give the model it was partitioned from; prism score takes the folder as --plan)",
		other: "a folder, not an ONNX file",
	} {
		_, err := pb.ReadModel(dir, pb.ReadOptions{})
		if err == nil || !strings.HasSuffix(err.Error(), want) {
			t.Errorf("ReadModel(%s): %v, want it to end %q", dir, err, want)
		}
	}
}

// TestSubgraphExternalData: onnx.save with save_as_external_data (what
// torch.onnx.export runs past 2 GB) moves the tensors of subgraphs out
// too: an If branch's Constant and initializers, a Loop body's. ReadModel
// checks and loads them as it does the main graph's, and WriteModel
// refuses a model whose subgraph still points at a data file (it would
// point at it from another folder). They used to be left external: a
// missing data file passed ReadModel, and the "self-contained" model it
// returned was written out referring to it.
func TestSubgraphExternalData(t *testing.T) {
	ext := func(name string) *pb.TensorProto {
		return &pb.TensorProto{Name: name, Dims: []int64{64}, DataType: int32(pb.TensorProto_FLOAT), DataLocation: pb.TensorProto_EXTERNAL,
			ExternalData: []*pb.StringStringEntryProto{{Key: "location", Value: "w.bin"}, {Key: "offset", Value: "0"}, {Key: "length", Value: "256"}}}
	}
	then := &pb.GraphProto{Name: "then", Node: []*pb.NodeProto{{OpType: "Constant", Output: []string{"c"}, Attribute: []*pb.AttributeProto{{Name: "value", Type: pb.AttributeProto_TENSOR, T: ext("c")}}}}, Output: []*pb.ValueInfoProto{{Name: "c"}}}
	els := &pb.GraphProto{Name: "else", Initializer: []*pb.TensorProto{ext("e")}, Output: []*pb.ValueInfoProto{{Name: "e"}}}
	m := &pb.ModelProto{IrVersion: 8, OpsetImport: []*pb.OperatorSetIdProto{{Version: 18}}, Graph: &pb.GraphProto{
		Name:   "g",
		Node:   []*pb.NodeProto{{OpType: "If", Input: []string{"cond"}, Output: []string{"y"}, Attribute: []*pb.AttributeProto{{Name: "then_branch", Type: pb.AttributeProto_GRAPH, G: then}, {Name: "else_branch", Type: pb.AttributeProto_GRAPH, G: els}}}},
		Input:  []*pb.ValueInfoProto{{Name: "cond"}},
		Output: []*pb.ValueInfoProto{{Name: "y"}},
	}}
	dir := t.TempDir()
	path := filepath.Join(dir, "m.onnx")
	writeRaw(t, path, m)
	for _, opts := range []pb.ReadOptions{{}, {SkipExternalData: true}} {
		if _, err := pb.ReadModel(path, opts); err == nil || !strings.Contains(err.Error(), `tensor "c"`) {
			t.Errorf("ReadModel(%+v) without the data file: %v, want an error naming tensor \"c\"", opts, err)
		}
	}
	data := make([]byte, 256)
	data[4] = 0x3f
	if err := os.WriteFile(filepath.Join(dir, "w.bin"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	lazy, err := pb.ReadModel(path, pb.ReadOptions{SkipExternalData: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := pb.WriteModel(filepath.Join(t.TempDir(), "out.onnx"), lazy, pb.WriteOptions{}); err == nil || !strings.Contains(err.Error(), "external data") {
		t.Errorf("WriteModel of a subgraph still referring to external data: %v", err)
	}
	full, err := pb.ReadModel(path, pb.ReadOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ifNode := full.Graph.Node[0]
	for _, x := range []*pb.TensorProto{ifNode.Attribute[0].G.Node[0].Attribute[0].T, ifNode.Attribute[1].G.Initializer[0]} {
		if x.DataLocation != pb.TensorProto_DEFAULT || !bytes.Equal(x.RawData, data) {
			t.Errorf("tensor %q: location %v, %d raw bytes; want its data loaded", x.Name, x.DataLocation, len(x.RawData))
		}
	}
}
