package ort

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	ort "github.com/yalue/onnxruntime_go"

	pb "github.com/prism-serve/prism/internal/onnxpb"
)

// castModel is Y = Cast(X, to) with X float32 [n, 2].
func castModel(to pb.TensorProto_DataType) []byte {
	out := floatInput("y", 2)
	out.GetType().GetTensorType().ElemType = int32(to)
	return marshalModel(&pb.GraphProto{
		Name: "cast",
		Node: []*pb.NodeProto{{OpType: "Cast", Input: []string{"x"}, Output: []string{"y"},
			Attribute: []*pb.AttributeProto{{Name: "to", Type: pb.AttributeProto_INT, I: int64(to)}}}},
		Input:  []*pb.ValueInfoProto{floatInput("x", 2)},
		Output: []*pb.ValueInfoProto{out},
	})
}

func writeModel(t testing.TB, name string, b []byte) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestRunBadInputs: an input that does not fit the model is an error
// that names it, never a panic (a failed tensor was a typed nil the
// clean-up called Destroy on) nor a run on part of the data (the binding
// takes a longer slice's first values: other samples' scores).
func TestRunBadInputs(t *testing.T) {
	if err := Init(); err != nil {
		t.Skip(err)
	}
	s, err := NewSession(writeModel(t, "mm.onnx", matMulModel(2, []float32{1, 0, 0, 1})), SessionOptions{IntraOpThreads: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, tc := range []struct {
		name string
		in   Input
		want string
	}{
		{"more values than the shape", Input{Shape: []int64{1, 2}, Float32: []float32{1, 2, 3, 4}}, "shape [1 2] holds 2 values, 4 float32 given"},
		{"fewer values than the shape", Input{Shape: []int64{2, 2}, Float32: []float32{1, 2}}, "shape [2 2] holds 4 values, 2 float32 given"},
		{"int64 for a float32 input", Input{Shape: []int64{1, 2}, Int64: []int64{1, 2}}, "(int64 values given)"},
		{"negative dimension", Input{Shape: []int64{-1, 2}, Float32: []float32{1, 2}}, "shape [-1 2]"},
		{"no shape", Input{Float32: []float32{1, 2}}, "no shape given"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.in.Name = "x"
			out, err := s.Run([]Input{tc.in})
			if err == nil {
				t.Fatalf("scored %v", out)
			}
			if !strings.Contains(err.Error(), `input "x"`) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v; want it to name the input and say %q", err, tc.want)
			}
		})
	}
	// The session still scores after every failed run.
	out, err := s.Run([]Input{{Name: "x", Shape: []int64{1, 2}, Float32: []float32{3, 4}}})
	if err != nil || len(out) != 1 || len(out[0]) != 2 || out[0][0] != 3 || out[0][1] != 4 {
		t.Fatalf("got %v, %v; want [[3 4]]", out, err)
	}
	// A batch of no rows scores no rows.
	if out, err = s.Run([]Input{{Name: "x", Shape: []int64{0, 2}}}); err != nil || len(out) != 1 || len(out[0]) != 0 {
		t.Fatalf("zero rows: got %v, %v", out, err)
	}
}

// TestRunOutputType: a model whose output is not float32 is refused by
// Run with an error that says what it is, before running (a float16
// output failed inside the binding with "not enough space: expected 8,
// got 4").
func TestRunOutputType(t *testing.T) {
	if err := Init(); err != nil {
		t.Skip(err)
	}
	for _, tc := range []struct {
		to   pb.TensorProto_DataType
		want string
	}{
		{pb.TensorProto_FLOAT16, `output "y" is float16, not float32`},
		{pb.TensorProto_BFLOAT16, `output "y" is bfloat16, not float32`},
		{pb.TensorProto_DOUBLE, `output "y" is double, not float32`},
	} {
		t.Run(tc.to.String(), func(t *testing.T) {
			s, err := NewSession(writeModel(t, "cast.onnx", castModel(tc.to)), SessionOptions{IntraOpThreads: 1})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			in := []Input{{Name: "x", Shape: []int64{2, 2}, Float32: []float32{1, 2, 3, 4}}}
			if out, err := s.Run(in); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Run: %v, %v; want an error saying %q", out, err, tc.want)
			}
			if out, err := s.RunInt64(in); err == nil || !strings.Contains(err.Error(), "not int64 or int32") {
				t.Fatalf("RunInt64: %v, %v", out, err)
			}
		})
	}
}

// TestNoOutputsAsked: an empty, non-nil Outputs is refused at load; the
// session loaded and its first Run panicked (index out of range).
func TestNoOutputsAsked(t *testing.T) {
	if err := Init(); err != nil {
		t.Skip(err)
	}
	s, err := NewSession(writeModel(t, "id.onnx", identityModel()), SessionOptions{Outputs: []string{}})
	if err == nil {
		defer s.Close()
		_, err = s.Run([]Input{{Name: "x", Shape: []int64{1}, Float32: []float32{1}}})
		t.Fatalf("loaded; Run: %v", err)
	}
	if !strings.Contains(err.Error(), "no outputs") {
		t.Fatalf("err = %v", err)
	}
}

// TestRunPanicReleasesLock: a panic inside the binding's Run (here: a
// session of no outputs, which NewSession now refuses) leaves the
// session's lock free, so Close does not wait forever.
func TestRunPanicReleasesLock(t *testing.T) {
	if err := Init(); err != nil {
		t.Skip(err)
	}
	path := writeModel(t, "id.onnx", identityModel())
	ins, _, err := ort.GetInputOutputInfo(path)
	if err != nil {
		t.Fatal(err)
	}
	ds, err := ort.NewDynamicAdvancedSession(path, []string{"x"}, []string{}, nil)
	if err != nil {
		t.Skip(err)
	}
	s := &Session{path: path, inputs: ins, s: ds}
	func() {
		defer func() { recover() }()
		s.Run([]Input{{Name: "x", Shape: []int64{1}, Float32: []float32{1}}})
	}()
	if !s.mu.TryLock() {
		t.Fatal("the session's lock is still held after a panicking Run: Close would wait forever")
	}
	s.mu.Unlock()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}
