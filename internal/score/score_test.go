package score

import (
	"math"
	"os"
	"path/filepath"
	"testing"
	"time"
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
	if p := percentile(lat, 0.5); p != 6 {
		t.Errorf("p50 = %v", p)
	}
	if p := percentile(lat, 0.99); p != 10 {
		t.Errorf("p99 = %v", p)
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
