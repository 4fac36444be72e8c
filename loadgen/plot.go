package loadgen

import (
	"fmt"
	"image/color"
	"io"
	"math"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"

	"github.com/prism-serve/prism/internal/atomicfile"
)

// Plot draws the picture a capacity planner looks at first: offered rate
// and achieved throughput (req/s) above, p99 latency with the SLO below,
// on one time axis.
func (s *Summary) Plot(path string) error {
	offered, done, p99 := plotter.XYs{}, plotter.XYs{}, plotter.XYs{}
	for _, p := range s.Series {
		x := float64(p.T) + 0.5
		offered = append(offered, plotter.XY{X: x, Y: float64(p.Offered)})
		done = append(done, plotter.XY{X: x, Y: float64(p.Completed)})
		if !math.IsNaN(p.P99Ms) {
			p99 = append(p99, plotter.XY{X: x, Y: p.P99Ms})
		}
	}
	top := plot.New()
	what, _, _, _ := units(s.Kind)
	top.Title.Text = fmt.Sprintf("loadgen: %s loop, %d %s sent, p99 %.2fms, SLO attainment %.1f%%", s.Mode, s.Sent, what, s.P99, 100*s.SLOAttained)
	top.Y.Label.Text = what + "/s"
	top.Y.Min = 0
	if err := addLine(top, "offered", offered, color.RGBA{R: 120, G: 120, B: 120, A: 255}, true); err != nil {
		return err
	}
	if err := addLine(top, "achieved", done, color.RGBA{B: 200, A: 255}, false); err != nil {
		return err
	}
	top.Legend.Top = true
	bot := plot.New()
	bot.X.Label.Text = "seconds"
	bot.Y.Label.Text = "p99 latency (ms)"
	bot.Y.Min = 0
	if err := addLine(bot, "p99", p99, color.RGBA{R: 200, A: 255}, false); err != nil {
		return err
	}
	if len(s.Series) > 0 {
		slo := plotter.XYs{{X: 0, Y: s.SLOMs}, {X: float64(len(s.Series)), Y: s.SLOMs}}
		if err := addLine(bot, "SLO", slo, color.RGBA{G: 150, A: 255}, true); err != nil {
			return err
		}
	}
	bot.Legend.Top = true
	bot.X.Min, bot.X.Max = 0, math.Max(1, float64(len(s.Series)))
	top.X.Min, top.X.Max = bot.X.Min, bot.X.Max
	rows := [][]*plot.Plot{{top}, {bot}}
	if s.Watched != "" {
		// The watched number (borrowed workers) as a step line.
		w := plotter.XYs{}
		for _, p := range s.Series {
			if !math.IsNaN(p.Watched) {
				w = append(w, plotter.XY{X: float64(p.T), Y: p.Watched}, plotter.XY{X: float64(p.T) + 1, Y: p.Watched})
			}
		}
		wp := plot.New()
		wp.Y.Label.Text = s.Watched
		wp.Y.Min = 0
		wp.X.Min, wp.X.Max = bot.X.Min, bot.X.Max
		if err := addLine(wp, s.Watched, w, color.RGBA{R: 200, G: 120, A: 255}, false); err != nil {
			return err
		}
		wp.Legend.Top = true
		bot.X.Label.Text = ""
		wp.X.Label.Text = "seconds"
		rows = append(rows, []*plot.Plot{wp})
	}

	img := vgimg.New(10*vg.Inch, vg.Length(3.5*float64(len(rows)))*vg.Inch)
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: len(rows), Cols: 1, PadY: vg.Millimeter * 4, PadTop: vg.Millimeter * 2, PadBottom: vg.Millimeter * 2, PadLeft: vg.Millimeter * 2, PadRight: vg.Millimeter * 4}
	canvases := plot.Align(rows, tiles, dc)
	for i, r := range rows {
		r[0].Draw(canvases[i][0])
	}
	if err := atomicfile.WriteFile(path, func(w io.Writer) error {
		_, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(w)
		return err
	}); err != nil {
		return fmt.Errorf("write plot: %w", err)
	}
	return nil
}

func addLine(p *plot.Plot, name string, xys plotter.XYs, c color.Color, dashed bool) error {
	if len(xys) == 0 {
		return nil
	}
	l, err := plotter.NewLine(xys)
	if err != nil {
		return fmt.Errorf("plot %s: %w", name, err)
	}
	l.Color = c
	l.Width = vg.Points(1.5)
	if dashed {
		l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
	}
	p.Add(l)
	p.Legend.Add(name, l)
	return nil
}
