package loadgen

import (
	"bytes"
	"context"
	"math"
	"os"
	"path/filepath"
	"testing"
	"testing/synctest"
	"time"
)

// TestSeriesCompletedIsAchieved: the plot's "achieved" line and
// timeseries.csv's completed_rps are the throughput, requests answered
// OK per second, as the summary's throughput is. They counted every
// answer, refusals and failures too: a server that refused a quarter of
// its load (or all of it, ResourceExhausted at once) plotted as keeping
// up with the offered rate.
func TestSeriesCompletedIsAchieved(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sum, err := Run(context.Background(), Options{Profile: Constant(200), Duration: 2 * time.Second, MaxRequests: 1e6}, tinyRequests(t, Fixed(3)), &flaky{})
		if err != nil {
			t.Fatal(err)
		}
		var completed int64
		for _, p := range sum.Series {
			completed += p.Completed
		}
		if sum.Errors == 0 || completed != sum.OK {
			t.Fatalf("sent %d ok %d errors %d: the series completes %d, want the %d answered OK", sum.Sent, sum.OK, sum.Errors, completed, sum.OK)
		}
	})
}

// TestWriteDirReplacesWhole: the report's files are replaced, not
// rewritten in place. Truncated and rewritten, a reader of the old
// summary.json (a script, a dashboard) could read it half written, and
// a run killed or a disk filling while writing left it so. The old file,
// still linked elsewhere (as an open reader holds it), keeps its bytes.
func TestWriteDirReplacesWhole(t *testing.T) {
	dir := t.TempDir()
	old := []byte("{\"an earlier run\": true}\n")
	for _, name := range ReportFiles {
		if err := os.WriteFile(filepath.Join(dir, name), old, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Link(filepath.Join(dir, name), filepath.Join(dir, name+".reader")); err != nil {
			t.Fatal(err)
		}
	}
	s := &Summary{Mode: "open", Sent: 3, OK: 3, SLOMs: 60, Series: []Point{{T: 0, Offered: 3, Completed: 3, OK: 3, P99Ms: 1, Watched: math.NaN()}}}
	if err := s.WriteDir(dir); err != nil {
		t.Fatal(err)
	}
	for _, name := range ReportFiles {
		if b, _ := os.ReadFile(filepath.Join(dir, name+".reader")); !bytes.Equal(b, old) {
			t.Errorf("%s was rewritten in place: its old copy now holds %d bytes of the new one", name, len(b))
		}
		if b, _ := os.ReadFile(filepath.Join(dir, name)); bytes.Equal(b, old) {
			t.Errorf("%s was not written", name)
		}
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 2*len(ReportFiles) {
		t.Errorf("%d files in the folder, want the report's and their old copies only (a temporary file left?)", len(ents))
	}
}
