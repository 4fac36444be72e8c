package placement

import (
	"encoding/csv"
	"fmt"
	"image/color"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// Summary is the mean and spread of one policy over seeds at one arrived
// load.
type Summary struct {
	Policy    string
	Seeds     int
	ArrivedAt int
	AllocMean float64
	AllocStd  float64
	FragMean  float64
	FailedPct float64 // tasks that found no node, percent of tasks, mean
}

// Summarize groups results by policy (in first-seen order) at arrived
// percent pct.
func Summarize(results []*SimResult, pct int) []Summary {
	order, by := byPolicy(results)
	var out []Summary
	for _, p := range order {
		rs := by[p]
		s := Summary{Policy: p, Seeds: len(rs), ArrivedAt: pct}
		for _, r := range rs {
			s.AllocMean += r.AllocAt(pct)
			s.FragMean += r.FragAt(pct)
			s.FailedPct += 100 * float64(r.Failed) / float64(r.Tasks)
		}
		n := float64(len(rs))
		s.AllocMean /= n
		s.FragMean /= n
		s.FailedPct /= n
		for _, r := range rs {
			d := r.AllocAt(pct) - s.AllocMean
			s.AllocStd += d * d
		}
		if len(rs) > 1 {
			s.AllocStd = math.Sqrt(s.AllocStd / (n - 1))
		}
		out = append(out, s)
	}
	return out
}

// WriteCurvesCSV writes one row per (policy, seed, arrived percent).
func WriteCurvesCSV(w io.Writer, results []*SimResult) error {
	cw := csv.NewWriter(w)
	if err := cw.Write([]string{"policy", "seed", "arrived_pct", "alloc_pct", "frag_pct", "frag_ratio_pct"}); err != nil {
		return err
	}
	f := func(v float64) string { return strconv.FormatFloat(v, 'f', 4, 64) }
	for _, r := range results {
		for _, p := range r.Curve {
			if err := cw.Write([]string{r.Policy, strconv.FormatUint(r.Seed, 10), strconv.Itoa(p.ArrivedPct), f(p.AllocPct), f(p.FragPct), f(p.FragRatioPct)}); err != nil {
				return err
			}
		}
	}
	cw.Flush()
	return cw.Error()
}

// WriteSummaryCSV writes Summarize's rows.
func WriteSummaryCSV(w io.Writer, sums []Summary) error {
	cw := csv.NewWriter(w)
	if err := cw.Write([]string{"policy", "seeds", "arrived_pct", "alloc_mean_pct", "alloc_std_pct", "frag_mean_pct", "failed_tasks_pct"}); err != nil {
		return err
	}
	f := func(v float64) string { return strconv.FormatFloat(v, 'f', 3, 64) }
	for _, s := range sums {
		if err := cw.Write([]string{s.Policy, strconv.Itoa(s.Seeds), strconv.Itoa(s.ArrivedAt), f(s.AllocMean), f(s.AllocStd), f(s.FragMean), f(s.FailedPct)}); err != nil {
			return err
		}
	}
	cw.Flush()
	return cw.Error()
}

// meanCurve averages one metric of a policy's runs per arrived percent,
// up to the shortest run.
func meanCurve(rs []*SimResult, metric func(Point) float64) plotter.XYs {
	n := math.MaxInt
	for _, r := range rs {
		n = min(n, len(r.Curve))
	}
	xy := make(plotter.XYs, n)
	for i := 0; i < n; i++ {
		xy[i].X = float64(i)
		for _, r := range rs {
			xy[i].Y += metric(r.Curve[i])
		}
		xy[i].Y /= float64(len(rs))
	}
	return xy
}

// PlotCurvesPNG draws one line per policy (mean over seeds) of the metric
// ("alloc" or "frag") against arrived load.
func PlotCurvesPNG(path string, results []*SimResult, metric string) error {
	var get func(Point) float64
	var ylabel string
	switch metric {
	case "alloc":
		get, ylabel = func(p Point) float64 { return p.AllocPct }, "GPU allocation (% of capacity)"
	case "frag":
		get, ylabel = func(p Point) float64 { return p.FragPct }, "GPU fragmentation (% of capacity)"
	default:
		return fmt.Errorf("plot: unknown metric %q", metric)
	}
	p := plot.New()
	p.Title.Text = "Placement policies, mean over seeds"
	p.X.Label.Text = "Arrived GPU demand (% of capacity)"
	p.Y.Label.Text = ylabel
	p.Add(plotter.NewGrid())
	order, by := byPolicy(results)
	for i, name := range order {
		l, err := plotter.NewLine(meanCurve(by[name], get))
		if err != nil {
			return fmt.Errorf("plot %s: %w", name, err)
		}
		l.Color = plotutil.Color(i)
		l.Dashes = plotutil.Dashes(i / 7)
		l.Width = vg.Points(1.5)
		p.Add(l)
		p.Legend.Add(name, l)
	}
	p.Legend.Top = true
	p.Legend.Left = true
	p.Legend.TextStyle.Color = color.Black
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("plot %q: %w", path, err)
	}
	if err := p.Save(8*vg.Inch, 5*vg.Inch, path); err != nil {
		return fmt.Errorf("plot %q: %w", path, err)
	}
	return nil
}

// byPolicy groups results by policy, policies in first-seen order.
func byPolicy(results []*SimResult) ([]string, map[string][]*SimResult) {
	var order []string
	by := map[string][]*SimResult{}
	for _, r := range results {
		if _, ok := by[r.Policy]; !ok {
			order = append(order, r.Policy)
		}
		by[r.Policy] = append(by[r.Policy], r)
	}
	return order, by
}
