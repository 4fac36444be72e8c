package loadgen

import (
	"encoding/csv"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/prism-serve/prism/internal/atomicfile"
)

// Summary is the outcome of a run, as summary.json holds it.
type Summary struct {
	// Kind is "" for Recommend requests, "updates" for embedding
	// updates: then a request is an update, its samples are its rows and
	// OK is acknowledged.
	Kind string `json:"kind,omitempty"`
	Mode string `json:"mode"` // "open" or "closed"
	// Interrupted says the run was stopped by a signal (Ctrl-C,
	// SIGTERM) before its duration: a partial result.
	Interrupted  bool             `json:"interrupted,omitempty"`
	Clients      int              `json:"clients,omitempty"`
	DurationS    float64          `json:"duration_s"` // until the last answer
	Sent         int64            `json:"sent"`
	OK           int64            `json:"ok"`
	Errors       int64            `json:"errors"`
	ErrorsByCode map[string]int64 `json:"errors_by_code"`
	// FirstErrors is the first error message of each code.
	FirstErrors map[string]string `json:"first_errors,omitempty"`
	OfferedRPS  float64           `json:"offered_rps"`
	// RPS and SamplesPS are answered OK per second: those answered by
	// the end of the duration plus the SLO, over the duration (a run
	// stopped early: all, over the time to the last answer).
	RPS       float64 `json:"throughput_rps"`
	SamplesPS float64 `json:"throughput_samples_per_s"`
	MeanCand  float64 `json:"mean_candidates"`
	// Latencies in milliseconds, from the intended send time, of the
	// requests answered OK and of those that timed out (DeadlineExceeded).
	P50, P90, P99, P999, Max float64            `json:"-"`
	Latency                  map[string]float64 `json:"latency_ms"`
	SLOMs                    float64            `json:"slo_ms"`
	SLOAttained              float64            `json:"slo_attainment"` // fraction of sent answered OK within the SLO
	SendLagP99Ms             float64            `json:"send_lag_p99_ms"`
	SendLagMaxMs             float64            `json:"send_lag_max_ms"`
	// GeneratorCPU is the CPU seconds this process used during the run.
	GeneratorCPU float64 `json:"generator_cpu_s"`
	// Watched names the number sampled each second beside the run
	// (Options.Watch), WatchedSeries its values (null where a read failed).
	Watched       string     `json:"watched,omitempty"`
	WatchedSeries []*float64 `json:"watched_series,omitempty"`
	// WatchFailed counts the watched reads that failed, WatchError the
	// first one's error.
	WatchFailed int    `json:"watch_failed,omitempty"`
	WatchError  string `json:"watch_error,omitempty"`
	// Retry is what the clients' retries did (Options.Retry), nil
	// without retries.
	Retry *RetryStats `json:"retry,omitempty"`
	// Traced is the sampled share of a run with Options.TraceRatio and
	// its slowest requests' trace ids; nil without.
	Traced *TraceStats `json:"traced,omitempty"`
	// Models is each model's part of a run over a mix of models
	// (NewMixedRequests), in the mix's order; nil for one model. The
	// fields above are the totals.
	Models []ModelSummary `json:"models,omitempty"`
	Series []Point        `json:"-"`
}

// ModelSummary is one model's part of a mixed run: its requests
// counted, timed and judged against the SLO as a run of it alone would
// be, over the same window.
type ModelSummary struct {
	Model        string            `json:"model"`
	Share        float64           `json:"share"` // of the requests, as asked
	Sent         int64             `json:"sent"`
	OK           int64             `json:"ok"`
	Errors       int64             `json:"errors"`
	ErrorsByCode map[string]int64  `json:"errors_by_code"`
	FirstErrors  map[string]string `json:"first_errors,omitempty"`
	OfferedRPS   float64           `json:"offered_rps"`
	RPS          float64           `json:"throughput_rps"`
	SamplesPS    float64           `json:"throughput_samples_per_s"`
	MeanCand     float64           `json:"mean_candidates"`
	// Latencies in milliseconds, as Summary's.
	P50, P90, P99, P999, Max float64            `json:"-"`
	Latency                  map[string]float64 `json:"latency_ms"`
	SLOAttained              float64            `json:"slo_attainment"`
	Series                   []Point            `json:"-"`
}

// modelSummary is model m's part, from the summary of its recorder.
func modelSummary(m ModelShare, s *Summary) ModelSummary {
	return ModelSummary{Model: m.Name, Share: m.Share, Sent: s.Sent, OK: s.OK, Errors: s.Errors, ErrorsByCode: s.ErrorsByCode, FirstErrors: s.FirstErrors,
		OfferedRPS: s.OfferedRPS, RPS: s.RPS, SamplesPS: s.SamplesPS, MeanCand: s.MeanCand,
		P50: s.P50, P90: s.P90, P99: s.P99, P999: s.P999, Max: s.Max, Latency: s.Latency, SLOAttained: s.SLOAttained, Series: s.Series}
}

// Point is one second of the time series.
type Point struct {
	T         int     // second since the start
	Offered   int64   // requests intended in this second
	Completed int64   // requests answered OK in this second (failures are in Errors)
	OK        int64   // of the requests intended in this second
	Errors    int64   // likewise
	Samples   int64   // OK samples of the requests intended in this second
	P99Ms     float64 // of the requests intended in this second (OK or timed out); NaN if none
	Watched   float64 // Options.Watch at the second's start; NaN if none
}

var nan = math.NaN()

// addWatched puts the watched values into the series, which it extends
// to cover them.
func (s *Summary) addWatched(name string, vals []float64, firstErr error) {
	s.Watched = name
	for _, v := range vals {
		if math.IsNaN(v) {
			s.WatchFailed++
		}
	}
	if firstErr != nil {
		s.WatchError = firstErr.Error()
	}
	for i := range s.Series {
		s.Series[i].Watched = nan
	}
	for i, v := range vals {
		for len(s.Series) <= i {
			s.Series = append(s.Series, Point{T: len(s.Series), P99Ms: nan, Watched: nan})
		}
		s.Series[i].Watched = v
		if math.IsNaN(v) {
			s.WatchedSeries = append(s.WatchedSeries, nil)
		} else {
			s.WatchedSeries = append(s.WatchedSeries, &v)
		}
	}
}

// summary is the run's summary; windowed says the run sent over its
// whole Options.Duration (not stopped early by MaxRequests or its
// context), whose window then times the throughput.
func (r *Recorder) summary(o Options, elapsed time.Duration, windowed bool) *Summary {
	r.mu.Lock()
	defer r.mu.Unlock()
	ms := func(us int64) float64 { return float64(us) / 1000 }
	s := &Summary{Kind: o.Kind, Mode: "open", Clients: o.Clients, DurationS: elapsed.Seconds(), Sent: r.sent, OK: r.ok, ErrorsByCode: map[string]int64{}, SLOMs: float64(o.SLO) / 1e6}
	if o.Clients > 0 {
		s.Mode = "closed"
	}
	for c, n := range r.errs {
		s.ErrorsByCode[c.String()] = n
		s.Errors += n
		if msg, ok := r.firstErr[c]; ok {
			if s.FirstErrors == nil {
				s.FirstErrors = map[string]string{}
			}
			s.FirstErrors[c.String()] = msg
		}
	}
	switch el := elapsed.Seconds(); {
	case windowed && o.Duration > 0:
		// Over the window the load was offered in: the answers done by
		// its end plus the SLO. Divided by the time to the last answer,
		// one straggler answered near its timeout (10 s by default)
		// halved a 10 s run's throughput, and find-max failed the rate.
		d := o.Duration.Seconds()
		s.RPS = float64(r.okByCutoff) / d
		s.SamplesPS = float64(r.samplesCutoff) / d
	case el > 0:
		s.RPS = float64(r.ok) / el
		s.SamplesPS = float64(r.samples) / el
	}
	if d := math.Min(o.Duration.Seconds(), elapsed.Seconds()); d > 0 {
		s.OfferedRPS = float64(r.sent) / d
	}
	if o.Retry.Retries > 0 {
		s.Retry = r.retryStats(o.Retry.Retries, o.Retry.GRPC, math.Min(o.Duration.Seconds(), elapsed.Seconds()))
	}
	if r.ok > 0 {
		s.MeanCand = float64(r.samples) / float64(r.ok)
	}
	s.P50, s.P90, s.P99, s.P999 = ms(r.total.ValueAtQuantile(50)), ms(r.total.ValueAtQuantile(90)), ms(r.total.ValueAtQuantile(99)), ms(r.total.ValueAtQuantile(99.9))
	s.Max = ms(r.total.Max())
	s.Latency = map[string]float64{"p50": s.P50, "p90": s.P90, "p99": s.P99, "p99.9": s.P999, "max": s.Max, "mean": r.total.Mean() / 1000}
	if r.sent > 0 {
		s.SLOAttained = float64(r.inSLO) / float64(r.sent)
	}
	s.SendLagP99Ms, s.SendLagMaxMs = ms(r.lag.ValueAtQuantile(99)), ms(r.lag.Max())
	for i, sec := range r.secs {
		p := Point{T: i, Offered: sec.offered, Completed: sec.completed, OK: sec.ok, Errors: sec.errs, Samples: sec.samples, P99Ms: math.NaN(), Watched: math.NaN()}
		if sec.hist != nil {
			p.P99Ms = ms(sec.hist.ValueAtQuantile(99))
		}
		s.Series = append(s.Series, p)
	}
	return s
}

// WriteText prints the summary for people.
func (s *Summary) WriteText(w io.Writer) {
	fmt.Fprintf(w, "mode        %s", s.Mode)
	if s.Mode == "closed" {
		fmt.Fprintf(w, " (%d clients)", s.Clients)
	}
	fmt.Fprintf(w, ", %.1fs", s.DurationS)
	if s.Interrupted {
		fmt.Fprint(w, " (interrupted: a partial result)")
	}
	fmt.Fprintln(w)
	what, perSecond, samples, per := units(s.Kind)
	fmt.Fprintf(w, "%-11s sent %d  ok %d  errors %d\n", what, s.Sent, s.OK, s.Errors)
	if len(s.ErrorsByCode) > 0 {
		codes := make([]string, 0, len(s.ErrorsByCode))
		for c := range s.ErrorsByCode {
			codes = append(codes, c)
		}
		sort.Strings(codes)
		fmt.Fprint(w, "errors by   ")
		for _, c := range codes {
			fmt.Fprintf(w, " %s %d", c, s.ErrorsByCode[c])
		}
		fmt.Fprintln(w)
		for _, c := range codes {
			if msg, ok := s.FirstErrors[c]; ok {
				fmt.Fprintf(w, "            %s: %s\n", c, msg)
			}
		}
	}
	fmt.Fprintf(w, "throughput  %.1f %s  %.0f %s/s  (offered %.1f %s, %.1f %s)\n", s.RPS, perSecond, s.SamplesPS, samples, s.OfferedRPS, perSecond, s.MeanCand, per)
	if s.OK == 0 && s.Max == 0 {
		// No latency was measured (every request refused or failed at
		// once): zeros would read as instant answers.
		fmt.Fprintf(w, "latency     n/a (no %s answered OK or timed out)\n", strings.TrimSuffix(what, "s"))
	} else {
		fmt.Fprintf(w, "latency     p50 %.3fms  p90 %.3fms  p99 %.3fms  p99.9 %.3fms  max %.3fms\n", s.P50, s.P90, s.P99, s.P999, s.Max)
	}
	fmt.Fprintf(w, "SLO         %.1f%% of %s answered OK within %gms\n", 100*s.SLOAttained, what, s.SLOMs)
	s.writeModels(w)
	if s.Retry != nil {
		s.Retry.writeText(w, s.Kind, s.Sent, s.OfferedRPS)
	}
	if s.Traced != nil {
		s.Traced.writeText(w, s.Sent)
	}
	if s.Watched != "" {
		peak := nan
		for _, p := range s.Series {
			if !math.IsNaN(p.Watched) && !(p.Watched <= peak) {
				peak = p.Watched
			}
		}
		n := len(s.WatchedSeries)
		switch {
		case s.WatchFailed > 0 && s.WatchFailed >= n:
			fmt.Fprintf(w, "watched     %s: no read of %d succeeded: %s\n", s.Watched, n, s.WatchError)
		case s.WatchFailed > 0:
			fmt.Fprintf(w, "watched     %s: peak %g, sampled every second (timeseries.csv); %d of %d reads failed, the first: %s\n", s.Watched, peak, s.WatchFailed, n, s.WatchError)
		default:
			fmt.Fprintf(w, "watched     %s: peak %g, sampled every second (timeseries.csv)\n", s.Watched, peak)
		}
	}
	fmt.Fprintf(w, "generator   send lag p99 %.3fms max %.3fms, %.2f CPU-s (%.2f cores)\n", s.SendLagP99Ms, s.SendLagMaxMs, s.GeneratorCPU, s.GeneratorCPU/math.Max(s.DurationS, 1e-9))
}

// writeModels prints a mixed run's part of each model, a line each
// (and a line of its errors by code, when it has some).
func (s *Summary) writeModels(w io.Writer) {
	width := 0
	for _, m := range s.Models {
		width = max(width, len(m.Model))
	}
	for _, m := range s.Models {
		lat := "latency n/a"
		if m.OK > 0 || m.Max > 0 {
			lat = fmt.Sprintf("p50 %.3fms  p99 %.3fms  p99.9 %.3fms", m.P50, m.P99, m.P999)
		}
		fmt.Fprintf(w, "model       %-*s  share %.1f%%  sent %d  ok %d  errors %d  %.1f req/s  %.0f samples/s  %s  SLO %.1f%%\n",
			width, m.Model, 100*m.Share, m.Sent, m.OK, m.Errors, m.RPS, m.SamplesPS, lat, 100*m.SLOAttained)
		if len(m.ErrorsByCode) > 0 {
			codes := make([]string, 0, len(m.ErrorsByCode))
			for c := range m.ErrorsByCode {
				codes = append(codes, c)
			}
			sort.Strings(codes)
			fmt.Fprintf(w, "            %-*s  errors by", width, "")
			for _, c := range codes {
				fmt.Fprintf(w, " %s %d", c, m.ErrorsByCode[c])
			}
			fmt.Fprintln(w)
		}
	}
}

// ReportFiles are the files WriteDir writes.
var ReportFiles = []string{"summary.json", "timeseries.csv", "plot.png"}

// WriteDir writes summary.json, timeseries.csv and plot.png into dir,
// each whole or not at all (internal/atomicfile).
func (s *Summary) WriteDir(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	buf, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	if err := atomicfile.WriteFile(filepath.Join(dir, "summary.json"), func(w io.Writer) error {
		_, err := w.Write(append(buf, '\n'))
		return err
	}); err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	if err := atomicfile.WriteFile(filepath.Join(dir, "timeseries.csv"), s.WriteCSV); err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	return s.Plot(filepath.Join(dir, "plot.png"))
}

// WriteCSV writes the per-second time series.
func (s *Summary) WriteCSV(w io.Writer) error {
	cw := csv.NewWriter(w)
	head := []string{"second", "offered_rps", "completed_rps", "ok", "errors", "samples", "p99_ms"}
	if s.Watched != "" {
		head = append(head, strings.ReplaceAll(s.Watched, " ", "_"))
	}
	// A mixed run's models each add their OK, errors and p99 per second
	// after the run's columns, which stay as one model's run has them.
	for _, m := range s.Models {
		head = append(head, m.Model+"_ok", m.Model+"_errors", m.Model+"_p99_ms")
	}
	_ = cw.Write(head)
	num := func(v float64, prec int) string {
		if math.IsNaN(v) {
			return ""
		}
		return strconv.FormatFloat(v, 'f', prec, 64)
	}
	for _, p := range s.Series {
		row := []string{strconv.Itoa(p.T), strconv.FormatInt(p.Offered, 10), strconv.FormatInt(p.Completed, 10),
			strconv.FormatInt(p.OK, 10), strconv.FormatInt(p.Errors, 10), strconv.FormatInt(p.Samples, 10), num(p.P99Ms, 3)}
		if s.Watched != "" {
			row = append(row, num(p.Watched, -1))
		}
		for _, m := range s.Models {
			if p.T < len(m.Series) {
				q := m.Series[p.T]
				row = append(row, strconv.FormatInt(q.OK, 10), strconv.FormatInt(q.Errors, 10), num(q.P99Ms, 3))
			} else {
				row = append(row, "0", "0", "")
			}
		}
		_ = cw.Write(row)
	}
	cw.Flush()
	return cw.Error()
}
