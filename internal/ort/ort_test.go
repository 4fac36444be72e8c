package ort

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	pb "github.com/prism-serve/prism/internal/onnxpb"
)

func TestFindLibrary(t *testing.T) {
	dir := t.TempDir()
	lib := filepath.Join(dir, "libonnxruntime.so")
	os.WriteFile(lib, []byte("x"), 0o644)

	t.Run("ORT_LIB", func(t *testing.T) {
		t.Setenv("ORT_LIB", lib)
		if p, err := FindLibrary(); err != nil || p != lib {
			t.Fatalf("got %q, %v", p, err)
		}
	})
	t.Run("ORT_LIB missing", func(t *testing.T) {
		t.Setenv("ORT_LIB", filepath.Join(dir, "nope.so"))
		_, err := FindLibrary()
		if !errors.Is(err, ErrNoLibrary) || !strings.Contains(err.Error(), "nope.so") || strings.Contains(err.Error(), "\n") {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("ORT_LIB is a folder", func(t *testing.T) {
		t.Setenv("ORT_LIB", dir)
		if _, err := FindLibrary(); !errors.Is(err, ErrNoLibrary) {
			t.Fatalf("err = %v", err)
		}
	})
	t.Run("cache found upwards", func(t *testing.T) {
		t.Setenv("ORT_LIB", "")
		root := t.TempDir()
		cached := filepath.Join(root, ".cache", "ort", Version, "libonnxruntime.so")
		os.MkdirAll(filepath.Dir(cached), 0o755)
		os.WriteFile(cached, []byte("x"), 0o644)
		deep := filepath.Join(root, "a", "b")
		os.MkdirAll(deep, 0o755)
		t.Chdir(deep)
		if p, err := FindLibrary(); err != nil || p != cached {
			t.Fatalf("got %q, %v", p, err)
		}
	})
	t.Run("CUDA build preferred", func(t *testing.T) {
		t.Setenv("ORT_LIB", "")
		root := t.TempDir()
		var libs []string
		for _, v := range []string{Version, CUDADir} {
			p := filepath.Join(root, ".cache", "ort", v, "libonnxruntime.so")
			os.MkdirAll(filepath.Dir(p), 0o755)
			os.WriteFile(p, []byte("x"), 0o644)
			libs = append(libs, p)
		}
		t.Chdir(root)
		if p, err := FindLibrary(); err != nil || p != libs[1] {
			t.Fatalf("got %q, %v; want the CUDA build %s", p, err, libs[1])
		}
	})
	t.Run("nothing", func(t *testing.T) {
		t.Setenv("ORT_LIB", "")
		t.Chdir(t.TempDir())
		p, err := FindLibrary()
		// The test binary's own folder may sit inside a checkout with a
		// cache; only when it does not must the error say how to fix it.
		if err == nil {
			if !strings.Contains(p, filepath.Join(".cache", "ort")) {
				t.Fatalf("found %q", p)
			}
			return
		}
		if !strings.Contains(err.Error(), "make setup") || !strings.Contains(err.Error(), "ORT_LIB") {
			t.Fatalf("err = %v", err)
		}
	})
}

// TestCUDARefusedClearly: asking the CPU build for CUDA is an error that
// says so, not a crash. (On a CUDA build the session loads.)
func TestCUDARefusedClearly(t *testing.T) {
	if err := Init(); err != nil {
		t.Skip(err)
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "m.onnx")
	// The smallest model: Y = Identity(X).
	if err := os.WriteFile(path, identityModel(), 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := NewSession(path, SessionOptions{CUDA: true})
	if err == nil {
		s.Close()
		t.Skip("this ONNX Runtime has the CUDA execution provider")
	}
	if !strings.Contains(err.Error(), "CUDA") {
		t.Fatalf("err = %v", err)
	}
}

// TestNoOutputsRefused: a model without outputs (what the partitioner
// wrote as cpu.onnx when only a dead node landed on the CPU side) is
// refused when loaded. Loaded, its Run panicked inside the binding with
// the session's lock held, and the deferred Close then waited forever.
func TestNoOutputsRefused(t *testing.T) {
	if err := Init(); err != nil {
		t.Skip(err)
	}
	path := filepath.Join(t.TempDir(), "m.onnx")
	m := marshalModel(&pb.GraphProto{
		Name:  "dead",
		Node:  []*pb.NodeProto{{OpType: "Relu", Input: []string{"x"}, Output: []string{"y"}}},
		Input: []*pb.ValueInfoProto{floatInput("x")},
	})
	if err := os.WriteFile(path, m, 0o644); err != nil {
		t.Fatal(err)
	}
	s, err := NewSession(path, SessionOptions{IntraOpThreads: 1})
	if err == nil {
		s.Close()
		t.Fatal("a model without outputs loaded")
	}
	if !strings.Contains(err.Error(), "no outputs") {
		t.Fatalf("err = %v, want it to say the model has no outputs", err)
	}
}

// TestIntraOpThreads: given threads are kept; otherwise a single run on
// every core is left ONNX Runtime's choice (0), one on fewer cores gets
// them, and several share the process's cores, at least one each (40
// models' sessions on 64 cores: one each, where each had 64).
func TestIntraOpThreads(t *testing.T) {
	for _, tc := range []struct {
		name                      string
		threads, runs, cores, all int
		want                      int
	}{
		{"given", 3, 40, 64, 64, 3},
		{"one session, every core: ONNX Runtime's choice", 0, 1, 64, 64, 0},
		{"no session", 0, 0, 64, 64, 0},
		{"one session, fewer cores than the machine", 0, 1, 16, 64, 16},
		{"40 models share 64 cores", 0, 40, 64, 64, 1},
		{"4 models share 64 cores", 0, 4, 64, 64, 16},
		{"more sessions than cores: one each", 0, 13, 2, 2, 1},
		{"GOMAXPROCS below the machine, shared", 0, 2, 8, 64, 4},
	} {
		if got := IntraOpThreads(tc.threads, tc.runs, tc.cores, tc.all); got != tc.want {
			t.Errorf("%s: IntraOpThreads(%d, %d, %d, %d) = %d, want %d", tc.name, tc.threads, tc.runs, tc.cores, tc.all, got, tc.want)
		}
	}
}
