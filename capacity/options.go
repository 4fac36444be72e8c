package capacity

import (
	"errors"
	"fmt"
	"time"
)

// Policy says how the controller decides to borrow.
type Policy string

const (
	// Reactive borrows on what the router observes: utilization above the
	// high-water mark, shed requests, a p99 or a queue over their limits.
	Reactive Policy = "reactive"
	// Predictive also borrows ahead of the forecast demand, by the
	// measured time a borrowed worker needs to serve, and keeps borrowed
	// workers the forecast still needs.
	Predictive Policy = "predictive"
)

// ParsePolicy reads a policy name.
func ParsePolicy(s string) (Policy, error) {
	switch p := Policy(s); p {
	case Reactive, Predictive:
		return p, nil
	}
	return "", fmt.Errorf("unknown capacity policy %q (want %s or %s)", s, Reactive, Predictive)
}

// Options tune the controller. The thresholds are utilizations: offered
// samples/s over the capacity of the workers counted (owned and borrowed,
// starting or serving, and borrows asked for but not yet arrived).
type Options struct {
	// Policy is Reactive (default) or Predictive.
	Policy Policy
	// Target is the utilization the controller sizes a borrow to (0.7).
	Target float64
	// High is the utilization above which it borrows (0.85).
	High float64
	// Low is the utilization a return must leave at most (default
	// Target): returning k workers needs offered <= Low x (workers - k) x
	// capacity, so a return never puts the model back over High; the band
	// between Low and High is the hysteresis. A Low under Target keeps
	// borrowed workers longer.
	Low float64
	// P99Limit: a p99 above it is pressure to borrow (0: p99 not used).
	P99Limit time.Duration
	// QueueLimit: a queue deeper than it is pressure to borrow (0: not used).
	QueueLimit int
	// MinLease is how long a borrowed worker serves at least before the
	// controller returns it for low demand (10m); a reclaim ignores it.
	MinLease time.Duration
	// CoolDown follows each return (5m): no further return, and a borrow
	// only for a real shortage (offered above the capacity counted, or
	// requests shed), not for crossing High.
	CoolDown time.Duration
	// MaxBorrowed bounds the workers borrowed at once over all models
	// (0: no bound but the lender's).
	MaxBorrowed int
	// StartupEstimate is the time from a borrow decision to the worker
	// serving, used until one has been measured (2m).
	StartupEstimate time.Duration
	// BorrowTimeout: a borrow whose worker has not appeared after it is
	// given up, and a borrowed worker that has not served by then, or
	// that served and has been out of the registry this long since
	// (its lender still lists it running), is drained and returned (10m,
	// or twice StartupEstimate if longer; it must exceed
	// StartupEstimate).
	BorrowTimeout time.Duration
	// DrainTimeout: a worker drained for low demand is returned when its
	// in-flight work is done or after this long (1m). A reclaim uses the
	// lender's grace instead.
	DrainTimeout time.Duration
	// LostAfter is how many observations in a row a borrowed worker
	// must be missing from (gone without notice, not just a failed
	// scrape) before it is drained, and then returned (3).
	LostAfter int
	// Exact: a zero Target, High, MinLease or CoolDown means zero, not
	// the default named beside it (prism plan loan sets them from flags
	// whose defaults are those: --min-lease 0 asks for returns as soon as
	// the demand allows, and --high 0 is refused). Low 0 is Target still.
	Exact bool
}

// EnsureDefaults fills zero fields.
func (o *Options) EnsureDefaults() {
	if o.Policy == "" {
		o.Policy = Reactive
	}
	if o.Target == 0 && !o.Exact {
		o.Target = 0.7
	}
	if o.High == 0 && !o.Exact {
		o.High = 0.85
	}
	if o.Low == 0 {
		o.Low = o.Target
	}
	if o.MinLease == 0 && !o.Exact {
		o.MinLease = 10 * time.Minute
	}
	if o.CoolDown == 0 && !o.Exact {
		o.CoolDown = 5 * time.Minute
	}
	if o.StartupEstimate == 0 {
		o.StartupEstimate = 2 * time.Minute
	}
	if o.BorrowTimeout == 0 {
		// Past twice the expected start: a slow start is not given up.
		o.BorrowTimeout = max(10*time.Minute, 2*o.StartupEstimate)
	}
	if o.DrainTimeout == 0 {
		o.DrainTimeout = time.Minute
	}
	if o.LostAfter == 0 {
		o.LostAfter = 3
	}
}

// Validate checks o after EnsureDefaults.
func (o *Options) Validate() error {
	var errs []error
	if _, err := ParsePolicy(string(o.Policy)); err != nil {
		errs = append(errs, err)
	}
	if !(0 < o.Low && o.Low <= o.Target && o.Target < o.High && o.High <= 1) {
		errs = append(errs, fmt.Errorf("capacity thresholds must keep 0 < low <= target < high <= 1, got low %v, target %v, high %v", o.Low, o.Target, o.High))
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"p99 limit", o.P99Limit}, {"minimum lease", o.MinLease}, {"cool-down", o.CoolDown}, {"startup estimate", o.StartupEstimate}, {"borrow timeout", o.BorrowTimeout}, {"drain timeout", o.DrainTimeout}} {
		if d.v < 0 {
			errs = append(errs, fmt.Errorf("capacity %s must not be negative, got %v", d.name, d.v))
		}
	}
	if o.BorrowTimeout <= o.StartupEstimate {
		errs = append(errs, fmt.Errorf("capacity borrow timeout %v must exceed the startup estimate %v: a worker starting as expected would be given up", o.BorrowTimeout, o.StartupEstimate))
	}
	if o.QueueLimit < 0 {
		errs = append(errs, fmt.Errorf("capacity queue limit must not be negative, got %d", o.QueueLimit))
	}
	if o.LostAfter < 0 {
		errs = append(errs, fmt.Errorf("capacity lost-after must not be negative, got %d", o.LostAfter))
	}
	if o.MaxBorrowed < 0 {
		errs = append(errs, fmt.Errorf("capacity max borrowed must not be negative, got %d", o.MaxBorrowed))
	}
	return errors.Join(errs...)
}
