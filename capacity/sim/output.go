package sim

import (
	"encoding/json"
	"fmt"
	"image/color"
	"io"
	"os"
	"path/filepath"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"

	"github.com/prism-serve/prism/loadgen"
)

// ReadTrace reads a QPS trace CSV the way the load generator does
// (loadgen.ParseTrace with o: rows summed per time window, a gap repeats
// the last window) and multiplies its rates by scale.
func ReadTrace(path string, scale float64, o loadgen.TraceOptions) (*loadgen.Trace, error) {
	if !(scale > 0) {
		return nil, fmt.Errorf("trace scale must be positive, got %v", scale)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open trace: %w", err)
	}
	defer f.Close()
	tr, err := loadgen.ParseTrace(f, filepath.Base(path), o)
	if err != nil {
		return nil, err
	}
	for i := range tr.Rates {
		tr.Rates[i] *= scale
	}
	return tr, nil
}

// WriteSummary prints a report for people, the paper's claim beside it.
func WriteSummary(w io.Writer, r Report) {
	fmt.Fprintf(w, "policy %s: %.1f h of trace, peak demand %.0f samples/s, %.0f samples/s per worker\n", r.Policy, r.TraceHours, r.PeakDemand, r.CapacityPerWorker)
	fmt.Fprintf(w, "  static for the peak:  %d GPUs, %.0f GPU-hours\n", r.StaticGPUs, r.StaticGPUHours)
	fmt.Fprintf(w, "  owned + loaning:      %d owned, peak %d borrowed (%d borrows), %.1f borrowed GPU-hours, %.0f GPU-hours in all\n", r.OwnedGPUs, r.PeakBorrowed, r.BorrowedWorkers, r.BorrowedGPUHours, r.LoanGPUHours)
	if above := r.StaticGPUs - r.OwnedGPUs; above > 0 {
		fmt.Fprintf(w, "  saved:                %.1f%% of static's GPU-hours; %.1f%% of the GPU-hours of the %d GPUs static adds above the owned ones\n", r.GPUHoursSavedPct, r.PeakGPUHoursSavedPct, above)
	} else {
		fmt.Fprintf(w, "  saved:                %.1f%% of static's GPU-hours (the %d owned GPUs already cover the peak: static adds none above them)\n", r.GPUHoursSavedPct, r.OwnedGPUs)
	}
	decision := fmt.Sprintf("decision to serving %.0fs", r.DecisionToServingS)
	if r.BorrowedWorkers == 0 {
		decision = "nothing borrowed"
	}
	fmt.Fprintf(w, "  SLO attainment:       %.2f%% of samples (%.2f%% of the time), %s\n", r.SLOAttainmentPct, r.TicksInSLOPct, decision)
	if r.SLOAttainmentPct < 99 {
		fmt.Fprintf(w, "  note:                 loaning misses the SLO for %.2f%% of samples, where static for the peak holds it: the GPU-hours saved are not at the same SLO\n", 100-r.SLOAttainmentPct)
	}
	fmt.Fprintf(w, "  reclaims:             %d injected, %d survived (no work in flight at release), %d found nothing borrowed\n", r.Reclaims, r.ReclaimsSurvived, r.ReclaimsSkipped)
	fmt.Fprintf(w, "  paper: %s\n", r.Claim)
}

// WriteOutputs writes report.json (the reports, one per policy) and
// loan.png (demand, serving capacity and borrowed workers over time, per
// policy) to dir.
func WriteOutputs(dir string, results []*Result) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("output folder %q: %w", dir, err)
	}
	reps := make([]Report, len(results))
	for i, r := range results {
		reps[i] = r.Report
	}
	b, err := json.MarshalIndent(reps, "", "  ")
	if err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "report.json"), append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	return Plot(filepath.Join(dir, "loan.png"), results)
}

// Plot draws, in workers, the demand (demand over capacity per worker),
// the serving workers and the borrowed workers over trace hours; one
// demand line, a pair of lines per policy.
func Plot(path string, results []*Result) error {
	if len(results) == 0 {
		return fmt.Errorf("plot %q: no results", path)
	}
	p := plot.New()
	p.Title.Text = "Capacity loaning: demand, serving capacity, borrowed workers"
	p.X.Label.Text = "trace time (hours)"
	p.Y.Label.Text = "workers (demand / capacity per worker)"
	p.Add(plotter.NewGrid())
	line := func(r *Result, y func(Point) float64) plotter.XYs {
		xy := make(plotter.XYs, len(r.Points))
		for i, pt := range r.Points {
			xy[i].X, xy[i].Y = pt.T.Hours(), y(pt)
		}
		return xy
	}
	add := func(name string, xy plotter.XYs, c color.Color, dashes []vg.Length) error {
		l, err := plotter.NewLine(xy)
		if err != nil {
			return fmt.Errorf("plot %s: %w", name, err)
		}
		l.Color, l.Dashes, l.Width = c, dashes, vg.Points(1)
		p.Add(l)
		p.Legend.Add(name, l)
		return nil
	}
	cap0 := results[0].Report.CapacityPerWorker
	if err := add("demand", line(results[0], func(pt Point) float64 { return pt.Demand / cap0 }), color.Black, nil); err != nil {
		return err
	}
	for i, r := range results {
		c := plotutil.Color(i + 1)
		if err := add(r.Report.Policy+" serving", line(r, func(pt Point) float64 { return float64(pt.Serving) }), c, nil); err != nil {
			return err
		}
		if err := add(r.Report.Policy+" borrowed", line(r, func(pt Point) float64 { return float64(pt.Borrowed) }), c, plotutil.Dashes(1)); err != nil {
			return err
		}
	}
	p.Legend.Top = true
	if err := p.Save(10*vg.Inch, 5*vg.Inch, path); err != nil {
		return fmt.Errorf("plot %q: %w", path, err)
	}
	return nil
}
