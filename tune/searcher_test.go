package tune

import (
	"math"
	"strconv"
	"testing"
)

// testSpace has 4 x 4 x 3 x 2 = 96 points.
func testSpace() Space {
	return Space{Dims: []Dim{
		{Flag: "micro-batch", Values: []string{"64", "128", "256", "512"}},
		{Flag: "max-batch", Values: []string{"256", "512", "1024", "2048"}},
		{Flag: "max-delay", Values: []string{"1ms", "2ms", "4ms"}},
		{Flag: "threads", Values: []string{"1", "2"}},
	}}
}

// bowl is a synthetic objective in samples/s: peak at opt, falling
// quadratically with the unit-cube distance, scaled by scale.
func bowl(s Space, opt Point, scale float64) func(Point) float64 {
	c := s.Coords(opt)
	return func(p Point) float64 {
		x := s.Coords(p)
		var d2 float64
		for i := range x {
			d2 += (x[i] - c[i]) * (x[i] - c[i])
		}
		return scale * math.Max(0.05, 1-0.5*d2)
	}
}

// search runs a searcher against f until it stops; it returns the
// points tried and why it stopped.
func search(t *testing.T, o SearcherOptions, f func(Point) float64) ([]Point, string) {
	t.Helper()
	s, err := NewSearcher(o)
	if err != nil {
		t.Fatal(err)
	}
	var tried []Point
	for range 1000 {
		p := s.Next()
		if p.Stop != "" {
			return tried, p.Stop
		}
		tried = append(tried, p.Point)
		s.Observe(p.Point, f(p.Point))
	}
	t.Fatal("searcher did not stop")
	return nil, ""
}

func bestOf(tried []Point, f func(Point) float64) float64 {
	b := 0.0
	for _, p := range tried {
		b = math.Max(b, f(p))
	}
	return b
}

// priorFrom is a full grid of another "model" (objective g) as prior
// points, normalised by its best, with weight w.
func priorFrom(s Space, g func(Point) float64, w float64) []PriorPoint {
	best := 0.0
	for _, p := range s.All() {
		best = math.Max(best, g(p))
	}
	var out []PriorPoint
	for _, p := range s.All() {
		out = append(out, PriorPoint{Coords: s.Coords(p), Score: g(p) / best, Weight: w})
	}
	return out
}

func TestSearcherFindsOptimum(t *testing.T) {
	s := testSpace()
	for _, tc := range []struct {
		name      string
		opt       Point
		prior     []PriorPoint
		maxTrials int // the search must reach within 1% of the optimum in at most this many
		wantStop  string
	}{
		{name: "no prior, optimum at a corner", opt: Point{3, 0, 2, 1}, maxTrials: 20, wantStop: StopThreshold},
		{name: "no prior, optimum inside", opt: Point{2, 1, 1, 0}, maxTrials: 15, wantStop: StopThreshold},
		{name: "prior of the same shape", opt: Point{3, 0, 2, 1}, prior: priorFrom(s, bowl(s, Point{3, 0, 2, 1}, 5e4), 1), maxTrials: 4, wantStop: StopThreshold},
		{name: "prior one step off", opt: Point{3, 1, 2, 1}, prior: priorFrom(s, bowl(s, Point{3, 0, 2, 1}, 5e4), 0.8), maxTrials: 8, wantStop: StopThreshold},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := bowl(s, tc.opt, 1e5)
			tried, stop := search(t, SearcherOptions{Space: s, Prior: tc.prior, Start: Point{1, 1, 1, 0}}, f)
			if stop != tc.wantStop && stop != StopLocal {
				t.Errorf("stopped by %s, want %s", stop, tc.wantStop)
			}
			reached := -1
			for i := range tried {
				if bestOf(tried[:i+1], f) >= 0.99*f(tc.opt) {
					reached = i + 1
					break
				}
			}
			if reached < 0 || reached > tc.maxTrials {
				t.Errorf("within 1%% of the optimum after %d trials (-1: never; %d tried), want <= %d", reached, len(tried), tc.maxTrials)
			}
			if len(tried) >= s.Size() {
				t.Errorf("tried all %d points", len(tried))
			}
			t.Logf("%d trials, reached after %d", len(tried), reached)
		})
	}
}

func TestSearcherPriorSavesTrials(t *testing.T) {
	s := testSpace()
	f := bowl(s, Point{3, 0, 2, 1}, 1e5)
	without, _ := search(t, SearcherOptions{Space: s, Start: Point{1, 1, 1, 0}}, f)
	with, _ := search(t, SearcherOptions{Space: s, Start: Point{1, 1, 1, 0}, Prior: priorFrom(s, bowl(s, Point{3, 0, 2, 1}, 3e4), 0.7)}, f)
	if len(with) >= len(without) {
		t.Errorf("with a prior %d trials, without %d: the prior should save trials", len(with), len(without))
	}
	// The first proposal is the prior's best, not the start.
	if key(with[0]) != key(Point{3, 0, 2, 1}) {
		t.Errorf("first proposal with a prior %v, want the prior's best [3 0 2 1]", with[0])
	}
	if key(without[0]) != key(Point{1, 1, 1, 0}) {
		t.Errorf("first proposal without a prior %v, want the start", without[0])
	}
}

func TestSearcherThresholdAndMaxTrials(t *testing.T) {
	s := testSpace()
	f := bowl(s, Point{2, 1, 1, 0}, 1e5)
	var last int
	for _, th := range []float64{0.001, 0.01, 0.05, 0.2} {
		tried, stop := search(t, SearcherOptions{Space: s, Start: Point{1, 1, 1, 0}, Threshold: th}, f)
		t.Logf("threshold %v: %d trials (%s)", th, len(tried), stop)
		if last > 0 && len(tried) > last {
			t.Errorf("threshold %v took %d trials, more than a smaller threshold's %d", th, len(tried), last)
		}
		last = len(tried)
	}
	if last > 4 {
		t.Errorf("threshold 0.2 took %d trials, want a few", last)
	}
	tried, stop := search(t, SearcherOptions{Space: s, Start: Point{1, 1, 1, 0}, Threshold: 1e-9, MaxTrials: 5}, f)
	if len(tried) != 5 || stop != StopMaxTrials {
		t.Errorf("max trials 5: %d trials, stop %s", len(tried), stop)
	}
	// A tiny space is exhausted.
	tiny := Space{Dims: []Dim{{Flag: "threads", Values: []string{"1", "2"}}}}
	tried, stop = search(t, SearcherOptions{Space: tiny, Threshold: 1e-9, MaxTrials: 10}, func(p Point) float64 { return float64(1 + p[0]) })
	if len(tried) != 2 || stop != StopExhausted {
		t.Errorf("tiny space: %d trials, stop %s", len(tried), stop)
	}
}

func TestSearcherDeterministic(t *testing.T) {
	s := testSpace()
	f := bowl(s, Point{3, 2, 0, 1}, 1e5)
	prior := priorFrom(s, bowl(s, Point{2, 2, 0, 1}, 1e4), 0.5)
	a, _ := search(t, SearcherOptions{Space: s, Prior: prior}, f)
	b, _ := search(t, SearcherOptions{Space: s, Prior: prior}, f)
	if len(a) != len(b) {
		t.Fatalf("two runs: %d and %d trials", len(a), len(b))
	}
	for i := range a {
		if key(a[i]) != key(b[i]) {
			t.Fatalf("trial %d: %v then %v", i, a[i], b[i])
		}
	}
}

func TestSearcherFailedTrials(t *testing.T) {
	// Every trial fails (score 0): the search still ends, by the
	// threshold or the space.
	s := testSpace()
	tried, stop := search(t, SearcherOptions{Space: s, MaxTrials: 10}, func(Point) float64 { return 0 })
	if len(tried) == 0 || stop == "" {
		t.Errorf("%d trials, stop %q", len(tried), stop)
	}
}

func TestSpace(t *testing.T) {
	s := testSpace()
	if s.Size() != 96 || len(s.All()) != 96 {
		t.Fatalf("size %d, all %d", s.Size(), len(s.All()))
	}
	if got := s.String(Point{0, 3, 1, 1}); got != "micro-batch=64 max-batch=2048 max-delay=2ms threads=2" {
		t.Errorf("String: %s", got)
	}
	if n := len(s.Neighbours(Point{0, 3, 1, 1})); n != 1+1+2+1 {
		t.Errorf("neighbours of a corner: %d", n)
	}
	for _, tc := range []struct {
		c    Config
		want []float64
		ok   bool
	}{
		{Config{"micro-batch": "128", "max-batch": "2048", "max-delay": "1ms", "threads": "2"}, []float64{1.0 / 3, 1, 0, 1}, true},
		// Between 256 and 512 on a log scale; a delay past the end clamps.
		{Config{"micro-batch": strconv.Itoa(362), "max-batch": "128", "max-delay": "8ms", "threads": "1"}, []float64{(2 + math.Log(362.0/256)/math.Log(2)) / 3, 0, 1, 0}, true},
		{Config{"micro-batch": "128", "max-batch": "2048", "max-delay": "1ms"}, nil, false},
		{Config{"micro-batch": "many", "max-batch": "2048", "max-delay": "1ms", "threads": "1"}, nil, false},
	} {
		got, ok := s.CoordsOf(tc.c)
		if ok != tc.ok {
			t.Errorf("CoordsOf(%v): ok %v", tc.c, ok)
			continue
		}
		for i := range tc.want {
			if math.Abs(got[i]-tc.want[i]) > 1e-9 {
				t.Errorf("CoordsOf(%v) = %v, want %v", tc.c, got, tc.want)
				break
			}
		}
	}
	// A dimension with a default places configurations measured before
	// it existed.
	s.Dims = append(s.Dims, Dim{Flag: "dense-sessions", Values: []string{"1", "2"}, Default: "1"})
	if got, ok := s.CoordsOf(Config{"micro-batch": "128", "max-batch": "2048", "max-delay": "1ms", "threads": "2"}); !ok || got[4] != 0 {
		t.Errorf("CoordsOf without dense-sessions: %v, %v", got, ok)
	}
	if got, ok := s.CoordsOf(Config{"micro-batch": "128", "max-batch": "2048", "max-delay": "1ms", "threads": "2", "dense-sessions": "2"}); !ok || got[4] != 1 {
		t.Errorf("CoordsOf with dense-sessions 2: %v, %v", got, ok)
	}
	s.Dims = s.Dims[:4]
	if got := StartConfig(s, Config{"micro-batch": "512", "max-delay": "3ms"}); got["micro-batch"] != "512" || got["max-delay"] != "2ms" || got["threads"] != "1" {
		t.Errorf("StartConfig: %v", got)
	}
	for _, bad := range []Space{
		{},
		{Dims: []Dim{{Flag: "threads"}}},
		{Dims: []Dim{{Flag: "threads", Values: []string{"1", "1"}}}},
		{Dims: []Dim{{Flag: "threads", Values: []string{"1"}}, {Flag: "threads", Values: []string{"2"}}}},
	} {
		if bad.Validate() == nil {
			t.Errorf("space %v validated", bad)
		}
	}
}

// TestSearcherNoThresholdStopWithoutSuccess: a prior from a model whose
// best was at large batches, on a machine where max-batch 1024 and 2048
// miss the SLO. The threshold is a fraction of the best measured: with
// no trial succeeded there is none, and the search goes on to the
// configurations that serve (it stopped after three failures, and tune
// reported that no configuration met the SLO). The prior still orders
// the trials.
func TestSearcherNoThresholdStopWithoutSuccess(t *testing.T) {
	s := testSpace()
	prior := priorFrom(s, bowl(s, Point{3, 3, 2, 1}, 5e4), 1)
	g := bowl(s, Point{3, 3, 2, 1}, 1e5)
	f := func(p Point) float64 {
		if p[1] >= 2 {
			return 0
		}
		return g(p)
	}
	tried, stop := search(t, SearcherOptions{Space: s, Prior: prior}, f)
	if best, want := bestOf(tried, f), f(Point{3, 1, 2, 1}); best < want {
		t.Errorf("stopped (%s) after %d trials %v with best %v, want the feasible optimum's %v", stop, len(tried), tried, best, want)
	}
	// Where nothing serves, the trials' own surrogate still ends the
	// search before the space does.
	tried, stop = search(t, SearcherOptions{Space: s, Prior: prior}, func(Point) float64 { return 0 })
	if stop != StopThreshold || len(tried) >= s.Size()/2 {
		t.Errorf("every trial failing: stopped by %s after %d trials of %d", stop, len(tried), s.Size())
	}
}

// TestSearcherSparsePriorFirstTrial: a prior of few records (another
// model's search, a run of one trial) starts the search where they
// scored well. The surrogate's optimism where nothing is known made the
// first trial the point farthest from every record: the lowest value of
// every flag for one record of score 1 (every point tied at 1), the far
// corner for a search's dozen trials, whose neighbourhood the search
// then stopped in at 5% of the optimum.
func TestSearcherSparsePriorFirstTrial(t *testing.T) {
	s := testSpace()
	opt := Point{3, 0, 2, 1}
	f := bowl(s, opt, 4e4)
	// Model A's search, without a prior, as its prior records.
	tried, _ := search(t, SearcherOptions{Space: s, Start: Point{1, 1, 1, 0}}, f)
	best := bestOf(tried, f)
	var searched []PriorPoint
	for _, p := range tried {
		searched = append(searched, PriorPoint{Coords: s.Coords(p), Score: f(p) / best, Weight: 0.8})
	}
	for _, tc := range []struct {
		name  string
		prior []PriorPoint
		// near: the first trial at most this squared unit-cube
		// distance from opt.
		near float64
	}{
		{"one record of score 1", []PriorPoint{{Coords: s.Coords(opt), Score: 1, Weight: 1}}, 0},
		{"one record of score 0.5", []PriorPoint{{Coords: s.Coords(opt), Score: 0.5, Weight: 1}}, 0},
		{"another model's search", searched, 0.12}, // one step of max-batch (1/3)
		// A dense prior whose best is a corner, where fewer records are
		// near: still the first trial.
		{"another model's grid", priorFrom(s, f, 0.3), 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := SearcherOptions{Space: s, Start: Point{1, 1, 1, 0}, Prior: tc.prior}
			se, err := NewSearcher(o)
			if err != nil {
				t.Fatal(err)
			}
			if first := se.Next().Point; s.distance(first, opt) > tc.near {
				t.Errorf("first trial %v, want within %v of the prior's best %v", first, tc.near, opt)
			}
			g := bowl(s, opt, 9e4)
			tried, stop := search(t, o, g)
			if got := bestOf(tried, g); got < 0.95*9e4 {
				t.Errorf("search found %.0f (%.0f%% of the optimum) in %d trials (%s): %v", got, 100*got/9e4, len(tried), stop, tried)
			}
		})
	}
}
