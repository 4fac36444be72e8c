package loan

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/prism-serve/prism/capacity"
)

// Spec is what prism up's --loan flag says: the lender and its
// settings, the controller's options and the driver's.
//
//	local:max=2,capacity=400,min-lease=30s,cool-down=10s,reclaim-after=20s
type Spec struct {
	// Provider is the lender: "local" (spare slots of this host).
	Provider string
	// Max is how many workers may be borrowed at once (max=).
	Max int
	// CapacityPerWorker is one dense worker's requests/s within the SLO
	// (capacity=); 0 measures it the first time the workers saturate.
	CapacityPerWorker float64
	// Controller holds policy=, high=, target=, low=, p99=, queue=,
	// min-lease=, cool-down=, startup=, borrow-timeout=, drain-timeout=.
	Controller capacity.Options
	// Tick is how often the controller runs (tick=, default 1s); Window
	// how far back the demand is measured (window=, default 2s).
	Tick, Window time.Duration
	// Grace is the grace of injected reclaims (grace=, default 30s);
	// ReclaimAfter reclaims each lent worker that long after it serves
	// (reclaim-after=); Hold keeps a reclaimed slot with the lender
	// (hold=).
	Grace, ReclaimAfter, Hold time.Duration
	// Addr is where prism up serves the controller's /metrics, /loan and
	// POST /loan/reclaim (addr=, default 127.0.0.1:0).
	Addr string
}

// ParseSpec reads a --loan value: PROVIDER:KEY=VALUE,...
func ParseSpec(s string) (Spec, error) {
	sp := Spec{Tick: time.Second, Addr: "127.0.0.1:0"}
	name, rest, _ := strings.Cut(s, ":")
	switch name {
	case "local":
	case "kubernetes", "k8s":
		return sp, fmt.Errorf("loan provider %q is not built yet (it needs client-go and a cluster); use local", name)
	default:
		return sp, fmt.Errorf("unknown loan provider %q in %q (want local:max=N,...)", name, s)
	}
	sp.Provider = name
	c := &sp.Controller
	if rest != "" {
		for kv := range strings.SplitSeq(rest, ",") {
			k, v, ok := strings.Cut(kv, "=")
			if !ok {
				return sp, fmt.Errorf("loan %q: %q is not KEY=VALUE", s, kv)
			}
			var err error
			dur := func(d *time.Duration) { *d, err = time.ParseDuration(v) }
			num := func(f *float64) { *f, err = strconv.ParseFloat(v, 64) }
			switch k {
			case "max":
				sp.Max, err = strconv.Atoi(v)
			case "capacity":
				num(&sp.CapacityPerWorker)
			case "policy":
				c.Policy, err = capacity.ParsePolicy(v)
			case "high":
				num(&c.High)
			case "target":
				num(&c.Target)
			case "low":
				num(&c.Low)
			case "p99":
				dur(&c.P99Limit)
			case "queue":
				c.QueueLimit, err = strconv.Atoi(v)
			case "min-lease":
				dur(&c.MinLease)
			case "cool-down":
				dur(&c.CoolDown)
			case "startup":
				dur(&c.StartupEstimate)
			case "borrow-timeout":
				dur(&c.BorrowTimeout)
			case "drain-timeout":
				dur(&c.DrainTimeout)
			case "tick":
				dur(&sp.Tick)
			case "window":
				dur(&sp.Window)
			case "grace":
				dur(&sp.Grace)
			case "reclaim-after":
				dur(&sp.ReclaimAfter)
			case "hold":
				dur(&sp.Hold)
			case "addr":
				sp.Addr = v
			default:
				return sp, fmt.Errorf("loan %q: unknown key %q", s, k)
			}
			if err != nil {
				return sp, fmt.Errorf("loan %q: %s: %w", s, k, err)
			}
		}
	}
	if sp.Max < 1 {
		return sp, fmt.Errorf("loan %q: max=N (at least 1) is needed", s)
	}
	if sp.CapacityPerWorker < 0 || sp.Tick <= 0 {
		return sp, fmt.Errorf("loan %q: capacity must not be negative and tick must be positive", s)
	}
	c.MaxBorrowed = sp.Max
	c.EnsureDefaults()
	if err := c.Validate(); err != nil {
		return sp, fmt.Errorf("loan %q: %w", s, err)
	}
	return sp, nil
}
