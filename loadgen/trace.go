package loadgen

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prism-serve/prism/internal/csvtab"
)

// TraceOptions say how to read a rate trace.
type TraceOptions struct {
	// TimeColumn and ValueColumn name the columns; empty picks the first
	// header among timestamp, timestamp_anon, time, ts (time) and value,
	// rate, qps, count (value).
	TimeColumn, ValueColumn string
	// Count says the values are request counts per row rather than rates
	// per second; they are divided by the window. A value column named
	// count holds counts whatever Count says.
	Count bool
	// Window is the width of one trace step; rows within a window are
	// summed (a trace with one row per container and time). Zero infers
	// it as the smallest gap between successive distinct timestamps.
	Window time.Duration
	// KeyColumn names the column saying which source (container,
	// instance) a row's rate is of: within a window each source's rates
	// are averaged, then the sources summed, so a window wider than the
	// sampling interval counts each source once, not once a sample.
	// Empty picks the first of container_ip, container, instance, pod
	// the header has; "none" reads no key (every row summed). Counts
	// (Count) are summed per window whatever the key.
	KeyColumn string
}

// NoKey is the KeyColumn that reads no source key.
const NoKey = "none"

// Trace is a replayable rate series: Rates[i] is the rate, requests/s,
// over [i*Step, (i+1)*Step) of trace time.
type Trace struct {
	Step  time.Duration
	Rates []float64
	// Filled counts the windows with no row, each given the rate of the
	// window before it; LongestGap is the longest run of them.
	Filled     int
	LongestGap time.Duration
}

var timeNames = []string{"timestamp", "timestamp_anon", "time", "ts"}
var valueNames = []string{"value", "rate", "qps", "count"}
var keyNames = []string{"container_ip", "container", "instance", "pod"}

// ParseTrace reads a CSV trace with a header line: one row per
// (timestamp in seconds, value), extra columns ignored, rows in time
// order. Rows with equal or same-window timestamps are summed, each
// source's (KeyColumn) rates averaged first. A window
// with no rows repeats the previous window's rate: in a scraped metric a
// missing point is a gap in the scrape, not a gap in traffic. name is used
// in error messages, which carry the line number.
func ParseTrace(r io.Reader, name string, o TraceOptions) (*Trace, error) {
	t, err := csvtab.NewLenientReader(name, r)
	if err != nil {
		return nil, fmt.Errorf("trace %w", err)
	}
	header := t.Header()
	tc, err := column(t, o.TimeColumn, timeNames)
	if err != nil {
		return nil, fmt.Errorf("trace %w", err)
	}
	vc, err := column(t, o.ValueColumn, valueNames)
	if err != nil {
		return nil, fmt.Errorf("trace %w", err)
	}
	// A column named count is counts per row: read as rates, a trace of
	// requests per minute was replayed at 60 times its load.
	count := o.Count || strings.EqualFold(vc, "count")
	need := max(slices.Index(header, tc), slices.Index(header, vc)) + 1
	// The source key: rates of one source in one window are averaged.
	kc := ""
	switch {
	case strings.EqualFold(o.KeyColumn, NoKey):
	case o.KeyColumn != "":
		if kc, err = column(t, o.KeyColumn, nil); err != nil {
			return nil, fmt.Errorf("trace %w", err)
		}
	default:
		kc, _ = t.Find(keyNames...)
	}
	if count {
		kc = "" // counts add up, whichever source they are of
	}
	if kc != "" {
		need = max(need, slices.Index(header, kc)+1)
	}
	// keys numbers the sources in order of appearance.
	keys := map[string]int{}
	type point struct {
		t, v float64
		key  int
	}
	var pts []point
	for {
		row, err := t.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("trace %w", err)
		}
		if row.Blank() {
			continue
		}
		if row.Len() < need {
			return nil, fmt.Errorf("trace %w", row.Errorf("%d columns, the header names %d", row.Len(), len(header)))
		}
		tv, err := strconv.ParseFloat(row.Str(tc), 64)
		if err != nil || math.IsNaN(tv) || math.IsInf(tv, 0) {
			return nil, fmt.Errorf("trace %w", row.Errorf("time %q is not a number", row.Str(tc)))
		}
		v, err := strconv.ParseFloat(row.Str(vc), 64)
		if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
			return nil, fmt.Errorf("trace %w", row.Errorf("value %q is not a number", row.Str(vc)))
		}
		if v < 0 {
			return nil, fmt.Errorf("trace %w", row.Errorf("value %v is negative", v))
		}
		if n := len(pts); n > 0 && tv < pts[n-1].t {
			return nil, fmt.Errorf("trace %w", row.Errorf("time %v goes back from %v (rows must be in time order)", tv, pts[n-1].t))
		}
		key := 0
		if kc != "" {
			k, ok := keys[row.Str(kc)]
			if !ok {
				k = len(keys)
				keys[row.Str(kc)] = k
			}
			key = k
		}
		if n := len(pts); n > 0 && tv == pts[n-1].t && kc == "" {
			pts[n-1].v += v
			continue
		}
		pts = append(pts, point{tv, v, key})
	}
	if len(pts) == 0 {
		return nil, fmt.Errorf("trace %s: no rows after the header", name)
	}
	win := o.Window.Seconds()
	if win <= 0 {
		win = math.Inf(1)
		for i := 1; i < len(pts); i++ {
			if d := pts[i].t - pts[i-1].t; d > 0 { // rows of several sources share a time
				win = math.Min(win, d)
			}
		}
		if math.IsInf(win, 1) {
			win = 1
		}
	}
	// window is the index of the window a time is in. Decimal times are
	// inexact (0.3/0.1 is 2.9999999999999996, and a Unix time near 1.7e9
	// is held to within 2.4e-7 s): a slack of a few units in the last
	// place of the largest time, as a share of the window, keeps a row
	// from falling into the window before its own, and no more.
	maxT := 0.0
	for _, p := range pts {
		maxT = math.Max(maxT, math.Abs(p.t))
	}
	slack := 8*(math.Nextafter(maxT, math.Inf(1))-maxT)/win + 1e-9
	window := func(t float64) int { return int(math.Floor((t-pts[0].t)/win + slack)) }
	n := window(pts[len(pts)-1].t) + 1
	if n > 10_000_000 {
		return nil, fmt.Errorf("trace %s: %d windows of %gs; give a wider window", name, n, win)
	}
	rates := make([]float64, n)
	seen := make([]bool, n)
	if kc == "" {
		for _, p := range pts {
			i := min(window(p.t), n-1)
			v := p.v
			if count {
				v /= win
			}
			rates[i] += v
			seen[i] = true
		}
	} else {
		// Per window, each source's mean rate, summed: the points are in
		// time order, so one window's are together.
		type mean struct {
			sum float64
			n   int
		}
		sources := map[int]*mean{}
		flush := func(i int) {
			for k, m := range sources {
				rates[i] += m.sum / float64(m.n)
				delete(sources, k)
			}
		}
		cur := -1
		for _, p := range pts {
			i := min(window(p.t), n-1)
			if i != cur && cur >= 0 {
				flush(cur)
			}
			cur = i
			m := sources[p.key]
			if m == nil {
				m = &mean{}
				sources[p.key] = m
			}
			m.sum += p.v
			m.n++
			seen[i] = true
		}
		flush(cur)
	}
	tr := &Trace{Step: time.Duration(win * float64(time.Second)), Rates: rates}
	run := 0
	for i := 1; i < n; i++ {
		if seen[i] {
			run = 0
			continue
		}
		rates[i] = rates[i-1]
		tr.Filled++
		run++
		tr.LongestGap = max(tr.LongestGap, time.Duration(run)*tr.Step)
	}
	return tr, nil
}

// column picks the time or value column: want if given, else the first
// of defaults the header has, compared case-insensitively.
func column(t *csvtab.Reader, want string, defaults []string) (string, error) {
	names := defaults
	if want != "" {
		names = []string{want}
	}
	if c, ok := t.Find(names...); ok {
		return c, nil
	}
	return "", t.Errorf(1, "header %q has no column %s", strings.Join(t.Header(), ","), strings.Join(names, " or "))
}

// Duration is the trace's length in trace time.
func (t *Trace) Duration() time.Duration { return time.Duration(len(t.Rates)) * t.Step }

// Peak is the highest rate of the trace.
func (t *Trace) Peak() float64 {
	m := 0.0
	for _, r := range t.Rates {
		m = math.Max(m, r)
	}
	return m
}

// Replay plays a trace back: Speedup compresses time (60 plays an hour of
// trace in a minute) and Scale multiplies every rate. Past its end the
// trace starts over.
type Replay struct {
	Trace   *Trace
	Speedup float64
	Scale   float64
}

var _ Profile = (*Replay)(nil)

func (r *Replay) Rate(t time.Duration) float64 {
	tt := float64(t) * r.Speedup
	i := int(tt/float64(r.Trace.Step)) % len(r.Trace.Rates)
	return r.Scale * r.Trace.Rates[max(i, 0)]
}

func (r *Replay) MaxRate() float64 { return r.Scale * r.Trace.Peak() }
