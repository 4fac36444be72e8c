package score

import (
	"strings"
	"testing"

	"github.com/prism-serve/prism/models"
)

// TestDrawFits: synthetic samples past half of the memory are refused
// before they are drawn (--samples 1000000000000 ended in "fatal error:
// runtime: out of memory"); what fits, and an unknown memory, pass.
func TestDrawFits(t *testing.T) {
	sig := models.Signature{Inputs: []models.InputSpec{{Name: "dense", Width: 13}, {Name: "ids", Width: 26}, {Name: "w0"}}} // 40 values, 320 bytes a sample
	for _, tc := range []struct {
		name    string
		samples int
		mem     int64
		want    string // "" passes
	}{
		{"default", 1024, 8 << 30, ""},
		{"the most that fits", (4 << 30) / 320, 8 << 30, ""},
		{"one past it", (4<<30)/320 + 1, 8 << 30, "--samples 13421773: drawn at once, their 40 input values a sample take 4.0GiB, more than half of the 8GiB of memory this process may use: want at most 13421772"},
		{"past int64 bytes", 1 << 62, 8 << 30, "--samples 4611686018427387904: drawn at once"},
		{"memory unknown", 1 << 62, 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := drawFits(sig, tc.samples, tc.mem)
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("got %v, want %q", err, tc.want)
			}
		})
	}
}
