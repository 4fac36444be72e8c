package plot

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prism-serve/prism/placement"
)

func TestCurvesPNG(t *testing.T) {
	curve := func(alloc ...float64) []placement.Point {
		var ps []placement.Point
		for i, a := range alloc {
			ps = append(ps, placement.Point{ArrivedPct: i, AllocPct: a, FragPct: 100 - a})
		}
		return ps
	}
	results := []*placement.SimResult{
		{Policy: "A", Seed: 1, Curve: curve(0, 1, 2)},
		{Policy: "A", Seed: 2, Curve: curve(0, 3)},
		{Policy: "B", Seed: 1, Curve: curve(0, 1, 1)},
	}
	if got := meanCurve(results[:2], func(p placement.Point) float64 { return p.AllocPct }); len(got) != 2 || got[1].Y != 2 {
		t.Fatalf("mean curve %v, want 2 points ending at 2", got)
	}
	dir := t.TempDir()
	for _, m := range []string{"alloc", "frag"} {
		path := filepath.Join(dir, "sub", m+".png")
		if err := CurvesPNG(path, results, m); err != nil {
			t.Fatal(err)
		}
		b, err := os.ReadFile(path)
		if err != nil || !bytes.HasPrefix(b, []byte("\x89PNG")) {
			t.Fatalf("%s: not a PNG (%v)", path, err)
		}
	}
	if err := CurvesPNG(filepath.Join(dir, "x.png"), results, "speed"); err == nil || !strings.Contains(err.Error(), `unknown metric "speed"`) {
		t.Fatalf("unknown metric: %v", err)
	}
}
