package onnxpb

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// TestWriteModelChecksFreeSpace: external data larger than the folder's
// free space fails before anything is written, saying so; with room, the
// same model is written.
func TestWriteModelChecksFreeSpace(t *testing.T) {
	m := &ModelProto{
		IrVersion:   8,
		OpsetImport: []*OperatorSetIdProto{{Version: 18}},
		Graph: &GraphProto{Name: "g", Initializer: []*TensorProto{{
			Name: "w", Dims: []int64{1024}, DataType: int32(TensorProto_FLOAT), RawData: make([]byte, 4096),
		}}},
	}
	defer func(f func(string) (int64, error)) { freeBytes = f }(freeBytes)
	for _, tc := range []struct {
		free    int64
		wantErr bool
	}{
		{free: 4096, wantErr: true}, // the data, but not its page alignment
		{free: 8192, wantErr: false},
	} {
		freeBytes = func(string) (int64, error) { return tc.free, nil }
		dir := t.TempDir()
		path := filepath.Join(dir, "m.onnx")
		err := WriteModel(path, m, WriteOptions{External: ExternalAlways})
		if got := errors.Is(err, ErrNoSpace); got != tc.wantErr {
			t.Fatalf("free %d: err = %v, want ErrNoSpace %v", tc.free, err, tc.wantErr)
		}
		ents, _ := os.ReadDir(dir)
		if tc.wantErr && len(ents) != 0 {
			t.Fatalf("free %d: a refused write left %d files", tc.free, len(ents))
		}
		if !tc.wantErr && len(ents) != 2 {
			t.Fatalf("free %d: wrote %d files, want model and data", tc.free, len(ents))
		}
	}
	if n, err := FreeBytes(t.TempDir()); err != nil || n <= 0 {
		t.Fatalf("FreeBytes(temp) = %d, %v", n, err)
	}
}
