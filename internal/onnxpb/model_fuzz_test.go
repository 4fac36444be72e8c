package onnxpb_test

import (
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"google.golang.org/protobuf/proto"

	pb "github.com/prism-serve/prism/internal/onnxpb"
)

// FuzzReadModel reads a model file and its external data file (model.onnx
// and model.onnx.data in one folder) as the partitioner and prism score
// do: ReadModel with and without the data, then LoadData and DataReader
// of every tensor. Whatever the bytes, it must answer a model or an
// error, never panic; a model read with its data must be self-contained,
// every tensor's bytes as many as its dims and type need.
func FuzzReadModel(f *testing.F) {
	dir := f.TempDir()
	good := filepath.Join(dir, "model.onnx")
	if err := pb.WriteModel(good, smallModel(), pb.WriteOptions{External: pb.ExternalAlways}); err != nil {
		f.Fatal(err)
	}
	mb, err := os.ReadFile(good)
	if err != nil {
		f.Fatal(err)
	}
	db, err := os.ReadFile(good + ".data")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(mb, db)
	f.Add(mb, db[:len(db)-100])
	f.Add(mb, []byte{})
	f.Add(mb[:len(mb)-7], db)
	max := strconv.FormatInt(math.MaxInt64, 10)
	for _, m := range []*pb.ModelProto{
		extModel(pb.TensorProto_UNDEFINED, []int64{64}, "location", "model.onnx.data", "offset", "1", "length", max),
		extModel(pb.TensorProto_FLOAT, []int64{64}, "location", "model.onnx.data", "offset", "4096"),
		extModel(pb.TensorProto_FLOAT, []int64{-2, -32}, "location", "model.onnx.data"),
		extModel(pb.TensorProto_FLOAT, []int64{1 << 62, 4}, "location", "model.onnx.data", "length", "0"),
		extModel(pb.TensorProto_FLOAT, []int64{64}, "location", "../model.onnx.data"),
		extModel(pb.TensorProto_FLOAT, []int64{64}, "location", "model.onnx"),
		extModel(pb.TensorProto_INT64, []int64{32}, "location", "model.onnx.data", "offset", "0", "length", "256"),
	} {
		b, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, db)
	}
	f.Fuzz(func(t *testing.T, model, data []byte) {
		dir := t.TempDir()
		path := filepath.Join(dir, "model.onnx")
		if err := os.WriteFile(path, model, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path+".data", data, 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := pb.ReadModel(path, pb.ReadOptions{SkipExternalData: true}); err != nil {
			if _, err := pb.ReadModel(path, pb.ReadOptions{}); err == nil {
				t.Fatalf("the model reads with its data but not without: %v", err)
			}
		}
		m, err := pb.ReadModel(path, pb.ReadOptions{})
		if err == nil {
			for _, tt := range pb.Tensors(m) {
				if tt.GetDataLocation() == pb.TensorProto_EXTERNAL {
					t.Fatalf("tensor %q still external after ReadModel", tt.GetName())
				}
			}
		}
		// The tensor-level readers, on the model as parsed (its external
		// references intact).
		pm, err := pb.ParseModel(model)
		if err != nil {
			return
		}
		for _, tt := range pb.Tensors(pm) {
			ref, ext, rerr := pb.External(tt)
			r, n, err := pb.DataReader(tt, dir)
			if err == nil {
				got, cerr := io.Copy(io.Discard, r)
				r.Close()
				if ext && (cerr != nil || got != n) {
					t.Fatalf("tensor %q: DataReader promised %d bytes, gave %d (%v)", tt.GetName(), n, got, cerr)
				}
				if rerr != nil {
					t.Fatalf("tensor %q: External refused it (%v), DataReader did not", tt.GetName(), rerr)
				}
				if want, known := pb.ByteSize(tt); ext && known && n != want {
					t.Fatalf("tensor %q (%+v): %d bytes, its shape needs %d", tt.GetName(), ref, n, want)
				}
			}
			if err := pb.LoadData(tt, dir); err == nil && ext {
				if want, known := pb.ByteSize(tt); known && int64(len(tt.RawData)) != want {
					t.Fatalf("tensor %q: loaded %d bytes, its shape needs %d", tt.GetName(), len(tt.RawData), want)
				}
			}
			pb.Float32s(tt)
			pb.Int64s(tt)
		}
	})
}
