package loadgen

import (
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prism-serve/prism/internal/shareddata/sharedtest"
)

func TestParseTraceErrors(t *testing.T) {
	for _, c := range []struct{ name, in, want string }{
		{"empty", "", "empty file"},
		{"no time column", "when,value\n1,2\n", "trace t.csv:1: header \"when,value\" has no column timestamp or"},
		{"no value column", "timestamp,x\n1,2\n", "trace t.csv:1: header \"timestamp,x\" has no column value or"},
		{"short row", "timestamp,value\n1,2\n3\n", "trace t.csv:3: 1 columns"},
		{"bad time", "timestamp,value\n1,2\nabc,3\n", "trace t.csv:3: time \"abc\" is not a number"},
		{"bad value", "timestamp,value\n1,2\n2,x\n", "trace t.csv:3: value \"x\" is not a number"},
		{"negative", "timestamp,value\n1,-2\n", "trace t.csv:2: value -2 is negative"},
		{"back in time", "timestamp,value\n1,2\n5,1\n\n4,1\n", "trace t.csv:5: time 4 goes back from 5"},
		{"line of empty fields", "time,value\n1,2\n,\n3,4\n", `trace t.csv:3: time "" is not a number`},
		{"header only", "timestamp,value\n", "no rows"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := ParseTrace(strings.NewReader(c.in), "t.csv", TraceOptions{})
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want %q", err, c.want)
			}
		})
	}
}

// A stray quote in a column the trace reader never reads (free text)
// does not fail the file.
func TestParseTraceStrayQuote(t *testing.T) {
	tr, err := ParseTrace(strings.NewReader("time,value,note\n1,2,a\"b\n2,3,c\n"), "t.csv", TraceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(tr.Rates) != 2 || tr.Rates[0] != 2 || tr.Rates[1] != 3 {
		t.Fatalf("rates %v, want [2 3]", tr.Rates)
	}
}

func TestParseTraceSumsAndFills(t *testing.T) {
	in := "ts,x,rate\n0,a,1\n0,b,2\n10,a,4\n30,a,5\n31,b,1\n"
	tr, err := ParseTrace(strings.NewReader(in), "t", TraceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Smallest gap 1s would make 32 windows; a 10s window sums 30 and 31.
	if tr.Step != time.Second || len(tr.Rates) != 32 {
		t.Fatalf("step %v, %d windows", tr.Step, len(tr.Rates))
	}
	tr, err = ParseTrace(strings.NewReader(in), "t", TraceOptions{Window: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	want := []float64{3, 4, 4, 6} // window 2 has no rows: it repeats window 1
	if len(tr.Rates) != len(want) {
		t.Fatalf("rates %v, want %v", tr.Rates, want)
	}
	for i := range want {
		if tr.Rates[i] != want[i] {
			t.Fatalf("rates %v, want %v", tr.Rates, want)
		}
	}
	tr, err = ParseTrace(strings.NewReader("time,count\n0,50\n10,100\n"), "t", TraceOptions{Count: true})
	if err != nil {
		t.Fatal(err)
	}
	if tr.Rates[0] != 5 || tr.Rates[1] != 10 {
		t.Fatalf("counts over 10s windows: rates %v, want [5 10]", tr.Rates)
	}
}

// The gateway trace: one row per container and minute; summed per window.
func TestParseGatewayTrace(t *testing.T) {
	f, err := os.Open(sharedtest.Path(t, "qps/genai_gateway_qps.csv"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr, err := ParseTrace(f, "genai_gateway_qps.csv", TraceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if tr.Step != 57*time.Second {
		t.Fatalf("step %v, want 57s", tr.Step)
	}
	if h := tr.Duration().Hours(); h < 22 || h > 22.5 {
		t.Fatalf("trace of %.1fh, want about 22.3h", h)
	}
	lo := math.Inf(1)
	for _, r := range tr.Rates {
		lo = math.Min(lo, r)
	}
	if tr.Peak() < 9 || tr.Peak()/lo < 6 {
		t.Fatalf("peak %.2f valley %.2f: want the gateway's swing (peak 9.6 req/s, ratio > 6)", tr.Peak(), lo)
	}
	// Wider windows than its 57 s sampling: each container's rates are
	// averaged in a window (container_ip), not summed once a sample, so
	// the peak stays the gateway's. Summed (the key off), 1m read it
	// 16.2 and 5m 44.5 req/s (4.6 times).
	for _, tc := range []struct {
		window time.Duration
		key    string
		lo, hi float64
	}{
		{time.Minute, "", 9, 11.5},
		{5 * time.Minute, "", 9, 11.5},
		{15 * time.Minute, "container_ip", 9, 11.5},
		{5 * time.Minute, NoKey, 40, 50},
	} {
		if _, err := f.Seek(0, 0); err != nil {
			t.Fatal(err)
		}
		w, err := ParseTrace(f, "genai_gateway_qps.csv", TraceOptions{Window: tc.window, KeyColumn: tc.key})
		if err != nil {
			t.Fatal(err)
		}
		if p := w.Peak(); p < tc.lo || p > tc.hi {
			t.Errorf("window %v, key %q: peak %.1f req/s, want %g to %g", tc.window, tc.key, p, tc.lo, tc.hi)
		}
	}
}

// TestTraceSourceKey: rows of one source (KeyColumn, container_ip by
// default) in one window are averaged, then the sources summed: two
// containers sampled every 10 s at 5 req/s each are 10 req/s in a 60 s
// window, not 60; duplicate rows of one container count once. Counts
// are summed whatever the key; "none" sums every row, as before.
func TestTraceSourceKey(t *testing.T) {
	var b strings.Builder
	b.WriteString("timestamp,value,container_ip\n")
	for ts := 0; ts < 120; ts += 10 {
		fmt.Fprintf(&b, "%d,5,a\n%d,5,b\n", ts, ts)
		if ts == 20 {
			fmt.Fprintf(&b, "%d,5,b\n", ts) // a duplicate row
		}
	}
	in := b.String()
	for _, tc := range []struct {
		name string
		o    TraceOptions
		in   string
		want []float64
		err  string
	}{
		{"by container", TraceOptions{Window: time.Minute}, in, []float64{10, 10}, ""},
		{"by container, window inferred", TraceOptions{}, in, []float64{10, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10}, ""},
		{"named key", TraceOptions{Window: time.Minute, KeyColumn: "CONTAINER_IP"}, in, []float64{10, 10}, ""},
		{"no key", TraceOptions{Window: time.Minute, KeyColumn: NoKey}, in, []float64{65, 60}, ""},
		{"counts", TraceOptions{Window: time.Minute, Count: true}, in, []float64{65.0 / 60, 1}, ""},
		{"missing key column", TraceOptions{KeyColumn: "pod"}, in, nil, `has no column pod`},
		{"an instance column", TraceOptions{Window: time.Minute}, strings.ReplaceAll(in, "container_ip", "instance"), []float64{10, 10}, ""},
	} {
		tr, err := ParseTrace(strings.NewReader(tc.in), "t.csv", tc.o)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%s: %v, want %q", tc.name, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if !slices.EqualFunc(tr.Rates, tc.want, func(a, b float64) bool { return math.Abs(a-b) < 1e-9 }) {
			t.Errorf("%s: rates %v, want %v", tc.name, tr.Rates, tc.want)
		}
	}
}

// TestTraceDecimalTimestamps: with decimal timestamps and a missing row,
// the row of t=0.3 goes in the window of 0.3, not of 0.2 (in floating
// point 0.3/0.1 is 2.9999999999999996): the gap repeats the rate before
// it, and the trace is not a window short.
func TestTraceDecimalTimestamps(t *testing.T) {
	csv := "timestamp,value\n0,10\n0.1,20\n0.3,40\n"
	tr, err := ParseTrace(strings.NewReader(csv), "t.csv", TraceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := []float64{10, 20, 20, 40} // the 0.2 window repeats 0.1's rate
	if !slices.Equal(tr.Rates, want) {
		t.Fatalf("step %v rates %v, want %v", tr.Step, tr.Rates, want)
	}
}

// TestTraceEpochDecimalTimestamps: Unix times with tenths of a second,
// read in windows of 100 ms, each land in their own window.
func TestTraceEpochDecimalTimestamps(t *testing.T) {
	var b strings.Builder
	b.WriteString("timestamp,value\n")
	var want []float64
	for i := range 40 {
		fmt.Fprintf(&b, "%d.%d,%d\n", 1700000000+i/10, i%10, 10+i) // 0.1 s apart
		want = append(want, float64(10+i))
	}
	tr, err := ParseTrace(strings.NewReader(b.String()), "t.csv", TraceOptions{Window: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(tr.Rates, want) {
		t.Fatalf("step %v rates\n%v\nwant\n%v", tr.Step, tr.Rates, want)
	}
}

// TestTraceWideWindowEdges: a row just before a window's end stays in
// it, however wide the window (a slack relative to the window moved a
// row 1 ms before a 10 s window's end into the next).
func TestTraceWideWindowEdges(t *testing.T) {
	for _, tc := range []struct {
		csv    string
		window time.Duration
		want   []float64
	}{
		{"timestamp,value\n0,1\n9.999,2\n10,4\n", 10 * time.Second, []float64{3, 4}},
		{"timestamp,value\n1700000000.000,1\n1700000059.995,2\n1700000060.000,4\n", time.Minute, []float64{3, 4}},
	} {
		tr, err := ParseTrace(strings.NewReader(tc.csv), "t.csv", TraceOptions{Window: tc.window})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(tr.Rates, tc.want) {
			t.Errorf("%q over %v: rates %v, want %v", tc.csv, tc.window, tr.Rates, tc.want)
		}
	}
}

// TestTraceCountColumn: a column named count, which ParseTrace picks as
// the values when no value, rate or qps column is there, holds counts
// per row: read as rates per second, 600 requests a minute replayed as
// 600 requests a second, 60 times the trace's load.
func TestTraceCountColumn(t *testing.T) {
	for _, o := range []TraceOptions{{}, {Count: true}} {
		tr, err := ParseTrace(strings.NewReader("timestamp,count\n0,600\n60,1200\n"), "t.csv", o)
		if err != nil {
			t.Fatal(err)
		}
		if want := []float64{10, 20}; !slices.Equal(tr.Rates, want) {
			t.Errorf("count=%v: rates %v, want %v", o.Count, tr.Rates, want)
		}
	}
	// A rate column stays a rate.
	tr, err := ParseTrace(strings.NewReader("timestamp,qps\n0,600\n60,1200\n"), "t.csv", TraceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if want := []float64{600, 1200}; !slices.Equal(tr.Rates, want) {
		t.Errorf("qps: rates %v, want %v", tr.Rates, want)
	}
}

// TestTraceGaps: the windows without a row, each given the rate before
// it, are counted, and the longest run of them.
func TestTraceGaps(t *testing.T) {
	tr, err := ParseTrace(strings.NewReader("time,value\n0,1\n10,2\n40,3\n50,4\n80,5\n"), "t.csv", TraceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if tr.Filled != 4 || tr.LongestGap != 20*time.Second || !slices.Equal(tr.Rates, []float64{1, 2, 2, 2, 3, 4, 4, 4, 5}) {
		t.Errorf("rates %v, %d filled, longest gap %v; want 4 filled, 20s", tr.Rates, tr.Filled, tr.LongestGap)
	}
}
