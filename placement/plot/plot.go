// Package plot draws the placement simulator's curves. It is apart from
// placement so that the planner does not link gonum/plot; commands call
// it after a run.
package plot

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"

	"github.com/prism-serve/prism/placement"
)

// meanCurve averages one metric of a policy's runs per arrived percent,
// up to the shortest run.
func meanCurve(rs []*placement.SimResult, metric func(placement.Point) float64) plotter.XYs {
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

// CurvesPNG draws one line per policy (mean over seeds) of the metric
// ("alloc" or "frag") against arrived load.
func CurvesPNG(path string, results []*placement.SimResult, metric string) error {
	var get func(placement.Point) float64
	var ylabel string
	switch metric {
	case "alloc":
		get, ylabel = func(p placement.Point) float64 { return p.AllocPct }, "GPU allocation (% of capacity)"
	case "frag":
		get, ylabel = func(p placement.Point) float64 { return p.FragPct }, "GPU fragmentation (% of capacity)"
	default:
		return fmt.Errorf("plot: unknown metric %q", metric)
	}
	p := plot.New()
	p.Title.Text = "Placement policies, mean over seeds"
	p.X.Label.Text = "Arrived GPU demand (% of capacity)"
	p.Y.Label.Text = ylabel
	p.Add(plotter.NewGrid())
	order, by := placement.ByPolicy(results)
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
