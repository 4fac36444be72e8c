package score

import (
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/prism-serve/prism/models"
	"github.com/prism-serve/prism/models/exporters"
)

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		o  Options
		ok bool
	}{
		{Options{Samples: 10, Batch: 4}, true},
		{Options{Criteo: "x.tsv", Batch: 4}, true},
		{Options{Samples: 10, Batch: 0}, false},
		{Options{Samples: 0, Batch: 4}, false},
		{Options{Samples: 10, Batch: 4, Threads: -1}, false},
	} {
		if err := tc.o.Validate(); (err == nil) != tc.ok {
			t.Errorf("%+v: %v", tc.o, err)
		}
	}
}

func TestLogLoss(t *testing.T) {
	if got := LogLoss([]float32{0.5, 0.5}, []float32{1, 0}); math.Abs(got-math.Ln2) > 1e-9 {
		t.Errorf("LogLoss at 0.5 = %v, want ln 2", got)
	}
	// Clipped: a confident wrong answer costs -ln(1e-7), not infinity.
	if got := LogLoss([]float32{0}, []float32{1}); math.IsInf(got, 0) || got < 16 {
		t.Errorf("LogLoss of a certain miss = %v", got)
	}
}

func TestPercentile(t *testing.T) {
	lat := []time.Duration{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	if p := percentile(lat, 0.5); p != 5 {
		t.Errorf("p50 = %v", p)
	}
	if p := percentile(lat, 0.99); p != 10 {
		t.Errorf("p99 = %v", p)
	}
	hundred := make([]time.Duration, 100)
	for i := range hundred {
		hundred[i] = time.Duration(i + 1)
	}
	if p := percentile(hundred, 0.99); p != 99 {
		t.Errorf("p99 of 100 = %v, want the 99th (not the slowest)", p)
	}
	if p := percentile(hundred, 0); p != 1 {
		t.Errorf("p0 of 100 = %v", p)
	}
	if p := percentile(nil, 0.5); p != 0 {
		t.Errorf("p50 of nothing = %v", p)
	}
}

func TestWriteScores(t *testing.T) {
	path := filepath.Join(t.TempDir(), "s.txt")
	if err := WriteScores(path, []float32{0.25, 1}); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(path)
	if string(b) != "0.25\n1\n" {
		t.Errorf("wrote %q", b)
	}
}

// TestWriteScoresThrough: --scores-out given a symbolic link writes
// the file it points to, and given a stream (a named pipe, as
// /dev/stdout or a shell's <(...) are) writes into it; both were
// replaced by a regular file renamed over them (found by review: the
// link's target kept its old scores, a pipe's reader got nothing, and
// --scores-out /dev/stdout, run as root, replaced /dev/stdout).
func TestWriteScoresThrough(t *testing.T) {
	scores := []float32{0.25, 1}
	const want = "0.25\n1\n"
	for _, tc := range []struct {
		name string
		// make makes the path in dir and returns it, and how to read
		// what was written.
		make func(t *testing.T, dir string) (path string, read func() string)
		mode fs.FileMode // what the path stays (its Lstat type bits)
	}{
		{"symbolic link", func(t *testing.T, dir string) (string, func() string) {
			target := filepath.Join(t.TempDir(), "target.txt")
			if err := os.WriteFile(target, []byte("0.5\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			link := filepath.Join(dir, "s.txt")
			if err := os.Symlink(target, link); err != nil {
				t.Fatal(err)
			}
			return link, func() string { b, _ := os.ReadFile(target); return string(b) }
		}, fs.ModeSymlink},
		{"named pipe", func(t *testing.T, dir string) (string, func() string) {
			pipe := filepath.Join(dir, "s.pipe")
			if err := syscall.Mkfifo(pipe, 0o644); err != nil {
				t.Skipf("mkfifo: %v", err)
			}
			// Opened for reading without blocking, so the writer's open
			// does not wait and nothing waits if it never opens it.
			r, err := os.OpenFile(pipe, os.O_RDONLY|syscall.O_NONBLOCK, 0)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { r.Close() })
			return pipe, func() string {
				b := make([]byte, 64)
				n, _ := r.Read(b)
				return string(b[:max(n, 0)])
			}
		}, fs.ModeNamedPipe},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path, read := tc.make(t, dir)
			if err := WriteScores(path, scores); err != nil {
				t.Fatal(err)
			}
			if got := read(); got != want {
				t.Errorf("read %q through %s, want %q", got, path, want)
			}
			if fi, err := os.Lstat(path); err != nil || fi.Mode().Type() != tc.mode {
				t.Errorf("%s is now %v (%v), want it left a %v", path, fi.Mode().Type(), err, tc.mode)
			}
			if ents, _ := os.ReadDir(dir); len(ents) != 1 {
				t.Errorf("the folder holds %d entries, want the one", len(ents))
			}
		})
	}
}

// TestDrawIndependentOfBatch: the synthetic samples scored, and so the
// scores, are the same whatever --batch cuts them into (drawn per batch,
// input by input, they were not: sample 0 scored 0.1827, 0.1773 and
// 0.1752 at batches 64, 128 and 256).
func TestDrawIndependentOfBatch(t *testing.T) {
	p, err := models.Lookup("dlrm-tiny")
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := p.Resolve(models.ScaleOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sig := cfg.Signature()
	flat := func(batch int) [][]float64 {
		bs, err := draw(sig, Options{Samples: 100, Batch: batch, Seed: 3, Zipf: 1.05})
		if err != nil {
			t.Fatal(err)
		}
		cols := make([][]float64, len(sig.Inputs))
		n := 0
		for _, b := range bs {
			n += b.N
			for c := range sig.Inputs {
				for _, v := range b.Columns[c].F32 {
					cols[c] = append(cols[c], float64(v))
				}
				for _, v := range b.Columns[c].I64 {
					cols[c] = append(cols[c], float64(v))
				}
			}
		}
		if n != 100 {
			t.Fatalf("batch %d: %d samples, want 100", batch, n)
		}
		return cols
	}
	want := flat(100)
	for _, batch := range []int{1, 7, 64} {
		got := flat(batch)
		for c := range want {
			if !slices.Equal(got[c], want[c]) {
				t.Fatalf("batch %d: input %s differs from one batch of 100", batch, sig.Inputs[c].Name)
			}
		}
	}
}

// TestFixedBatch: a model exported with a fixed batch (torch.onnx.export
// without dynamic axes, as the exporter corpus writes it) is scored in
// batches of that size, and --samples that are not a multiple of it are
// refused with the fix before ONNX Runtime's three-line dimension error.
func TestFixedBatch(t *testing.T) {
	m := exporters.ByName("ts-fixed-batch-view", 11)
	if got := fixedBatch(m.Proto); got != int(m.Batch) || got <= 0 {
		t.Fatalf("fixedBatch = %d, want the export's %d", got, m.Batch)
	}
	if got := fixedBatch(exporters.ByName("ts-select-embedding", 11).Proto); got != 0 {
		t.Fatalf("fixedBatch of a dynamic-batch export = %d, want 0", got)
	}
	path := filepath.Join(t.TempDir(), "model.onnx")
	buf, err := proto.Marshal(m.Proto)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, buf, 0o644); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	err = Run(&out, path, Options{Samples: int(m.Batch)*3 + 1, Batch: 256, Seed: 1, Show: 0})
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("fixed batch of %d (exported so): give --samples a multiple of %d", m.Batch, m.Batch)) {
		t.Fatalf("Run with samples not a multiple of the fixed batch: %v", err)
	}
}
