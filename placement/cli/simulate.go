package cli

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"

	"github.com/prism-serve/prism/internal/progress"
	"github.com/prism-serve/prism/placement"
	"github.com/prism-serve/prism/placement/plot"
)

// SimulateConfig is one `plan simulate`: every policy runs once per seed.
type SimulateConfig struct {
	Nodes, Tasks string // node and task CSV paths
	// Policies are registry names (ParsePolicies).
	Policies []string
	Seeds    []uint64
	// Inflation, Coverage and TieBreak are placement.SimOptions'.
	Inflation, Coverage float64
	TieBreak            string
	// At is the arrived load, percent of GPU capacity, the summary reports.
	At int
	// Bound adds placement.AllocBound for the same runs to the summary.
	Bound bool
	// Out, if set, is the directory for curves.csv, summary.csv, alloc.png
	// and frag.png.
	Out string
}

// Simulate runs c: progress on stderr, the summary table on stdout, and
// the files under c.Out.
func Simulate(stdout, stderr io.Writer, c SimulateConfig) error {
	nodes, err := placement.LoadNodes(c.Nodes)
	if err != nil {
		return err
	}
	tasks, err := placement.LoadTasks(c.Tasks)
	if err != nil {
		return err
	}
	if c.Out != "" {
		// Before the runs, which take minutes: a folder that cannot be
		// made fails now, not after them.
		if err := os.MkdirAll(c.Out, 0o755); err != nil {
			return fmt.Errorf("--out: %w", err)
		}
	}
	reg := placement.NewRegistry()
	var results []*placement.SimResult
	total := len(c.Policies) * len(c.Seeds)
	// In place on a terminal; otherwise (a log, CI) a line per run.
	tty := progress.IsTerminal(stderr)
	cr := ""
	if tty {
		cr = "\r"
	}
	for i, name := range c.Policies {
		for j, seed := range c.Seeds {
			run := i*len(c.Seeds) + j + 1
			opts := placement.SimOptions{Seed: seed, Inflation: c.Inflation, Coverage: c.Coverage, TieBreak: c.TieBreak, ProgressEvery: 2000}
			if tty {
				opts.Progress = func(done, n int) {
					fmt.Fprintf(stderr, "\r[%d/%d] %s seed %d: %d/%d tasks", run, total, name, seed, done, n)
				}
			}
			r, err := placement.Simulate(nodes, tasks, name, reg, opts)
			if err != nil {
				return err
			}
			at := min(c.At, len(r.Curve)-1)
			fmt.Fprintf(stderr, "%s[%d/%d] %s seed %d: %d tasks, %d failed, alloc %.2f%% at %d%% arrived\n",
				cr, run, total, r.Policy, seed, r.Tasks, r.Failed, r.AllocAt(at), at)
			results = append(results, r)
		}
	}
	// The summary reports at --at only if every run arrived there (a
	// trace as is, --inflation <= 0, may arrive short of it): otherwise
	// at the load every run reached, and says so.
	at := c.At
	for _, r := range results {
		at = min(at, len(r.Curve)-1)
	}
	if at < c.At {
		fmt.Fprintf(stderr, "note: the runs arrived at %d%% of GPU capacity, short of --at %d: the summary reports at %d%%\n", at, c.At, at)
	}
	sums := placement.Summarize(results, at)
	WriteSummary(stdout, sums, at)
	if c.Bound {
		var sum float64
		for _, seed := range c.Seeds {
			b, err := placement.AllocBound(nodes, tasks, placement.SimOptions{Seed: seed, Inflation: c.Inflation, Coverage: c.Coverage, TieBreak: c.TieBreak}, at)
			if err != nil {
				return err
			}
			sum += b
		}
		fmt.Fprintf(stdout, "%-14s %5d %11.2f%%  (upper bound for any policy: one GPU pool, dual feasible function)\n", "bound", len(c.Seeds), sum/float64(len(c.Seeds)))
	}
	if c.Out == "" {
		return nil
	}
	if err := WriteOutputs(c.Out, results, sums); err != nil {
		return err
	}
	fmt.Fprintf(stderr, "wrote %s/{curves.csv,summary.csv,alloc.png,frag.png}\n", c.Out)
	return nil
}

// WriteSummary prints Summarize's rows as a table.
func WriteSummary(w io.Writer, sums []placement.Summary, at int) {
	fmt.Fprintf(w, "%-14s %5s %12s %8s %10s %8s\n", "policy", "seeds", "alloc@"+strconv.Itoa(at)+"%", "std", "frag", "failed")
	for _, s := range sums {
		fmt.Fprintf(w, "%-14s %5d %11.2f%% %8.2f %9.2f%% %7.2f%%\n", s.Policy, s.Seeds, s.AllocMean, s.AllocStd, s.FragMean, s.FailedPct)
	}
}

// WriteOutputs writes curves.csv, summary.csv, alloc.png and frag.png to
// dir, creating it.
func WriteOutputs(dir string, results []*placement.SimResult, sums []placement.Summary) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create %q: %w", dir, err)
	}
	if err := writeFile(filepath.Join(dir, "curves.csv"), func(f *os.File) error { return placement.WriteCurvesCSV(f, results) }); err != nil {
		return err
	}
	if err := writeFile(filepath.Join(dir, "summary.csv"), func(f *os.File) error { return placement.WriteSummaryCSV(f, sums) }); err != nil {
		return err
	}
	for _, m := range []string{"alloc", "frag"} {
		if err := plot.CurvesPNG(filepath.Join(dir, m+".png"), results, m); err != nil {
			return err
		}
	}
	return nil
}
