package tune

import (
	"errors"
	"fmt"
	"math"
)

// PriorPoint is what an earlier tuning run (of another model, usually)
// says about one configuration: its place in this space, its score as a
// fraction of that run's best, and how much it counts (the similarity of
// that model to this one, in (0,1]).
type PriorPoint struct {
	Coords []float64
	Score  float64
	Weight float64
}

// SearcherOptions configure a Searcher.
type SearcherOptions struct {
	Space Space
	// Start is the first point tried when the prior says nothing (no
	// prior points), and the first guess's tie-break when it says as
	// much of several: usually prism up's defaults. Default: the middle
	// of every dimension.
	Start Point
	// Prior points; may be empty.
	Prior []PriorPoint
	// Threshold: stop once the expected improvement of the next trial
	// is below this fraction of the best (default 0.02). Before a trial
	// succeeded, that is judged on the trials alone, without the prior.
	Threshold float64
	// MaxTrials bounds the trials (default: the space's size).
	MaxTrials int
	// MinTrials are tried before the threshold may stop the search
	// (default 2).
	MinTrials int
	// Bandwidth of the Gaussian kernel in the unit cube (default 0.4).
	Bandwidth float64
	// Sigma is the surrogate's uncertainty, as a fraction of the best,
	// where nothing is known (default 0.25).
	Sigma float64
	// MeasuredWeight is how many prior points of weight 1 one measured
	// point counts for (default 4).
	MeasuredWeight float64
}

// EnsureDefaults fills unset fields.
func (o *SearcherOptions) EnsureDefaults() {
	if o.Threshold == 0 {
		o.Threshold = 0.02
	}
	if o.MaxTrials == 0 {
		o.MaxTrials = o.Space.Size()
	}
	if o.MinTrials == 0 {
		o.MinTrials = 2
	}
	if o.Bandwidth == 0 {
		o.Bandwidth = 0.4
	}
	if o.Sigma == 0 {
		o.Sigma = 0.25
	}
	if o.MeasuredWeight == 0 {
		o.MeasuredWeight = 4
	}
	if o.Start == nil {
		o.Start = make(Point, len(o.Space.Dims))
		for i, d := range o.Space.Dims {
			o.Start[i] = (len(d.Values) - 1) / 2
		}
	}
}

// Validate checks the options (after EnsureDefaults).
func (o *SearcherOptions) Validate() error {
	if err := o.Space.Validate(); err != nil {
		return err
	}
	if len(o.Start) != len(o.Space.Dims) {
		return fmt.Errorf("start point has %d dimensions, the space %d", len(o.Start), len(o.Space.Dims))
	}
	for i, j := range o.Start {
		if j < 0 || j >= len(o.Space.Dims[i].Values) {
			return fmt.Errorf("start point: %s index %d out of range", o.Space.Dims[i].Flag, j)
		}
	}
	for i, p := range o.Prior {
		if len(p.Coords) != len(o.Space.Dims) {
			return fmt.Errorf("prior point %d has %d coordinates, the space %d dimensions", i, len(p.Coords), len(o.Space.Dims))
		}
		if !(p.Weight > 0) || math.IsNaN(p.Score) {
			return fmt.Errorf("prior point %d: weight %v, score %v", i, p.Weight, p.Score)
		}
	}
	switch {
	case !(o.Threshold > 0):
		return fmt.Errorf("threshold %v, want > 0", o.Threshold)
	case o.MaxTrials < 1:
		return fmt.Errorf("max trials %d, want >= 1", o.MaxTrials)
	case !(o.Bandwidth > 0) || !(o.Sigma > 0) || !(o.MeasuredWeight > 0):
		return errors.New("bandwidth, sigma and measured weight must be positive")
	}
	return nil
}

// Searcher proposes configurations to try: deterministic, no clock, no
// processes. The first trial is the prior's best guess (the point its
// records score best, the nearest to Start among equals; Start without
// a prior); after that it
// refines around the best measured point, trying the unmeasured
// neighbour (one step along one dimension) of highest expected
// improvement; it stops when that is below the threshold, or when every
// neighbour of the best is measured (a local optimum). The surrogate is kernel
// regression over prior and measured points, each normalised by its
// run's best; its uncertainty shrinks with the kernel weight near a
// point.
type Searcher struct {
	o        SearcherOptions
	all      []Point
	measured map[string]float64 // key(point) -> score (<= 0: failed)
	order    []Point
	best     int // index into order, -1 when none
}

// NewSearcher checks o and returns a searcher with nothing measured.
func NewSearcher(o SearcherOptions) (*Searcher, error) {
	o.EnsureDefaults()
	if err := o.Validate(); err != nil {
		return nil, err
	}
	return &Searcher{o: o, all: o.Space.All(), measured: map[string]float64{}, best: -1}, nil
}

// Observe records a measured score (max samples/s; 0 for a trial that
// failed) for p.
func (s *Searcher) Observe(p Point, score float64) {
	k := key(p)
	if _, ok := s.measured[k]; ok {
		return
	}
	s.measured[k] = score
	s.order = append(s.order, append(Point(nil), p...))
	if score > 0 && (s.best < 0 || score > s.measured[key(s.order[s.best])]) {
		s.best = len(s.order) - 1
	}
}

// Best is the best measured point and its score (ok false when none
// succeeded).
func (s *Searcher) Best() (Point, float64, bool) {
	if s.best < 0 {
		return nil, 0, false
	}
	p := s.order[s.best]
	return p, s.measured[key(p)], true
}

// Why a search stops.
const (
	StopThreshold = "threshold"
	StopMaxTrials = "max-trials"
	StopExhausted = "exhausted"
	StopLocal     = "local-optimum" // every neighbour of the best measured
	// A run (not the searcher) ends so when a trial is stopped (Ctrl-C,
	// SIGTERM) or cannot be run.
	StopInterrupted = "interrupted"
	StopFailed      = "trial-error"
)

// Proposal is the searcher's next move.
type Proposal struct {
	Point Point
	// Predicted is the surrogate's score for Point and EI its expected
	// improvement, both as fractions of the best measured (1 before
	// anything is measured).
	Predicted, EI float64
	// Stop, when not "", says why there is no next trial (Point is nil).
	Stop string
}

// Next proposes the next point, or says why the search is over.
func (s *Searcher) Next() Proposal {
	if len(s.order) >= s.o.MaxTrials {
		return Proposal{Stop: StopMaxTrials}
	}
	if len(s.order) >= len(s.all) {
		return Proposal{Stop: StopExhausted}
	}
	if len(s.order) == 0 {
		if len(s.o.Prior) == 0 {
			mu, _ := s.predict(s.o.Start)
			return Proposal{Point: append(Point(nil), s.o.Start...), Predicted: mu, EI: math.Inf(1)}
		}
		// The prior's best guess: the point its records vouch for most,
		// then the nearest to Start. Not the surrogate's highest
		// prediction: that is optimistic where nothing is known, so a
		// sparse prior (another model's search, a dozen trials around
		// its best) sent the first trial to the corner farthest from
		// them all, and one record of score 1 (a run of one trial) to
		// the lowest value of every flag, every point tying at 1.
		var best Proposal
		bestV, bestD := 0.0, 0.0
		for _, p := range s.all {
			v, d := s.vouched(p), s.o.Space.distance(p, s.o.Start)
			if best.Point == nil || v > bestV+1e-12 || v > bestV-1e-12 && d < bestD-1e-12 {
				mu, _ := s.predict(p)
				best, bestV, bestD = Proposal{Point: p, Predicted: mu, EI: math.Inf(1)}, v, d
			}
		}
		return best
	}
	var cands []Point
	if bp, _, ok := s.Best(); ok {
		for _, q := range s.o.Space.Neighbours(bp) {
			if _, done := s.measured[key(q)]; !done {
				cands = append(cands, q)
			}
		}
	}
	if len(cands) == 0 {
		if _, _, ok := s.Best(); ok {
			return Proposal{Stop: StopLocal}
		}
		// Nothing succeeded yet: the unmeasured point the surrogate
		// likes best.
		for _, p := range s.all {
			if _, done := s.measured[key(p)]; !done {
				cands = append(cands, p)
			}
		}
	}
	var best Proposal
	for _, q := range cands {
		mu, sigma := s.predict(q)
		ei := expectedImprovement(mu, sigma, 1)
		if best.Point == nil || ei > best.EI+1e-12 {
			best = Proposal{Point: q, Predicted: mu, EI: ei}
		}
	}
	stopEI := best.EI
	if _, _, ok := s.Best(); !ok && len(s.o.Prior) > 0 {
		// Nothing has succeeded: the prior's scores are fractions of
		// best configurations that failed here, and say nothing of how
		// the others compare to one that serves. They still order the
		// trials; whether one is worth trying is the trials' own say.
		stopEI = 0
		for _, q := range cands {
			mu, sigma := s.predictFrom(q, nil)
			stopEI = math.Max(stopEI, expectedImprovement(mu, sigma, 1))
		}
	}
	if len(s.order) >= s.o.MinTrials && stopEI < s.o.Threshold {
		return Proposal{Predicted: best.Predicted, EI: stopEI, Stop: StopThreshold}
	}
	return best
}

// vouched is how well the prior says p does: the kernel-weighted mean
// of the prior's scores near p, shrunk towards 0 (not towards the best,
// as predict is) where they are few, so that a point the prior knows
// and scores high beats one it knows nothing of. The shrinking weighs a
// tenth of the prior's heaviest record: on a record itself a few
// percent, so that within a dense prior (another model's grid) a corner,
// with fewer records near it, is not passed over for the interior.
func (s *Searcher) vouched(p Point) float64 {
	x := s.o.Space.Coords(p)
	var sumW, sumWY, maxW float64
	for _, pp := range s.o.Prior {
		k := pp.Weight * s.kernel(x, pp.Coords)
		sumW += k
		sumWY += k * pp.Score
		maxW = math.Max(maxW, pp.Weight)
	}
	return sumWY / (0.1*maxW + sumW)
}

// predict is the surrogate at p: kernel-weighted mean of the prior's
// and the measured normalised scores, shrunk towards the best where the
// weight is small, and its uncertainty.
func (s *Searcher) predict(p Point) (mu, sigma float64) { return s.predictFrom(p, s.o.Prior) }

// predictFrom is predict with the prior points given.
func (s *Searcher) predictFrom(p Point, prior []PriorPoint) (mu, sigma float64) {
	x := s.o.Space.Coords(p)
	_, bestScore, haveBest := s.Best()
	var sumW, sumWY, sumWYY float64
	add := func(c []float64, y, w float64) {
		k := w * s.kernel(x, c)
		sumW += k
		sumWY += k * y
		sumWYY += k * y * y
	}
	for _, pp := range prior {
		add(pp.Coords, pp.Score, pp.Weight)
	}
	for _, q := range s.order {
		y := 0.0
		if haveBest {
			y = s.measured[key(q)] / bestScore
		}
		add(s.o.Space.Coords(q), y, s.o.MeasuredWeight)
	}
	// Where little is known the surrogate is optimistic: as good as the
	// best, with uncertainty Sigma (w0 is that belief's weight).
	const w0 = 1
	mu = (w0*1 + sumWY) / (w0 + sumW)
	// The uncertainty: what is not known, plus how much the scores
	// nearby differ from the prediction (a rugged neighbourhood is
	// worth exploring, a flat one is not).
	spread := (w0*1+sumWYY)/(w0+sumW) - mu*mu
	sigma = math.Sqrt(s.o.Sigma*s.o.Sigma*w0/(w0+sumW) + math.Max(spread, 0))
	return mu, sigma
}

func (s *Searcher) kernel(a, b []float64) float64 {
	var d2 float64
	for i := range a {
		d := a[i] - b[i]
		d2 += d * d
	}
	h := s.o.Bandwidth
	return math.Exp(-d2 / (2 * h * h))
}

// expectedImprovement of a normal (mu, sigma) over best.
func expectedImprovement(mu, sigma, best float64) float64 {
	if sigma <= 0 {
		return math.Max(mu-best, 0)
	}
	z := (mu - best) / sigma
	return (mu-best)*normCDF(z) + sigma*normPDF(z)
}

func normPDF(z float64) float64 { return math.Exp(-z*z/2) / math.Sqrt(2*math.Pi) }
func normCDF(z float64) float64 { return 0.5 * math.Erfc(-z/math.Sqrt2) }
