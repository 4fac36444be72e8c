package loan

import (
	"fmt"
	"math"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/prism-serve/prism/capacity"
)

// Spec is what a --loan flag says (prism up's, prism loan's): the lender
// and its settings, the controller's options and the driver's.
//
//	local:max=2,capacity=400,min-lease=30s,cool-down=10s,reclaim-after=20s
//	kubernetes:max=4,template=prism-dense,pool=pool=training,taint=pool=training:NoSchedule,priority-class=prism-loan
type Spec struct {
	// Provider is the lender: "local" (spare slots of this host) or
	// "kubernetes" (Pods on a training pool's nodes; "k8s" is read as
	// it).
	Provider string
	// Max is how many workers may be borrowed at once (max=).
	Max int
	// CapacityPerWorker is one dense worker's requests/s within the SLO
	// (capacity=); 0 measures it the first time the workers saturate.
	CapacityPerWorker float64
	// Controller holds policy= (predictive needs promo=), high=,
	// target=, low=, p99=, queue=, min-lease=, cool-down=, startup=,
	// borrow-timeout=, drain-timeout=.
	Controller capacity.Options
	// Promotions are the promotion calendar (promo=START/DURATION/FACTOR,
	// repeatable; START an RFC 3339 time): policy=predictive forecasts
	// the demand measured now scaled by it (capacity.Scaled), and
	// borrows ahead of a promotion's start by the measured start-up time.
	Promotions []Promotion
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
	// Kube are the kubernetes lender's settings.
	Kube KubeSpec
}

// Promotion is a calendar entry of a live loan: from Start for Duration
// the demand is Factor times its baseline.
type Promotion struct {
	Start    time.Time
	Duration time.Duration
	Factor   float64
}

// ParsePromotion reads START/DURATION/FACTOR, as
// 2026-11-11T00:00:00+08:00/2h/3.
func ParsePromotion(v string) (Promotion, error) {
	parts := strings.Split(v, "/")
	if len(parts) != 3 {
		return Promotion{}, fmt.Errorf("%q: want START/DURATION/FACTOR, START an RFC 3339 time (as 2026-11-11T00:00:00+08:00/2h/3)", v)
	}
	var p Promotion
	var err error
	if p.Start, err = time.Parse(time.RFC3339, parts[0]); err != nil {
		return Promotion{}, fmt.Errorf("%q: start: want an RFC 3339 time (as 2026-11-11T00:00:00+08:00): %w", v, err)
	}
	if p.Duration, err = time.ParseDuration(parts[1]); err != nil {
		return Promotion{}, fmt.Errorf("%q: duration: %w", v, err)
	}
	if p.Factor, err = strconv.ParseFloat(parts[2], 64); err != nil {
		return Promotion{}, fmt.Errorf("%q: factor: %w", v, err)
	}
	// The calendar's own checks (duration positive, factor a positive
	// number); the start is a time here, any.
	if err := (capacity.Promotion{Duration: p.Duration, Factor: p.Factor}).Validate(); err != nil {
		return Promotion{}, fmt.Errorf("%q: %w", v, err)
	}
	return p, nil
}

// Relative is the calendar in the controller's time, which counts from
// origin (the driver's start).
func Relative(ps []Promotion, origin time.Time) []capacity.Promotion {
	out := make([]capacity.Promotion, len(ps))
	for i, p := range ps {
		out[i] = capacity.Promotion{Start: p.Start.Sub(origin), Duration: p.Duration, Factor: p.Factor}
	}
	return out
}

// KubeSpec are the kubernetes lender's keys (capacity/kube.Options: the
// command turns them into it, so that this package links no client-go).
type KubeSpec struct {
	// Namespace of the dense StatefulSet and the lent Pods (namespace=;
	// "": the command's own).
	Namespace string
	// Template is the dense StatefulSet (or Deployment) whose pod template a lent worker
	// runs (template=).
	Template string
	// Pool are the training pool's node labels, KEY=VALUE (pool=,
	// repeatable: every one must match).
	Pool []string
	// Taints are the pool's taints the lent Pods tolerate,
	// KEY[=VALUE][:EFFECT] (taint=, repeatable).
	Taints []string
	// PriorityClass is the lent Pods' class, below training's
	// (priority-class=).
	PriorityClass string
	// Resource is the pool's GPU or MIG resource (resource=; "": the
	// template's).
	Resource string
	// Kubeconfig is a kubeconfig file outside a cluster (kubeconfig=;
	// "": in-cluster).
	Kubeconfig string
	// IdleRefresh reuses a count of the pool's idle devices this long
	// (idle-refresh=, default 10s).
	IdleRefresh time.Duration
}

// ParseSpec reads a --loan value: PROVIDER:KEY=VALUE,...
func ParseSpec(s string) (Spec, error) {
	sp := Spec{Tick: time.Second, Addr: "127.0.0.1:0"}
	name, rest, _ := strings.Cut(s, ":")
	switch name {
	case "local":
	case "kubernetes", "k8s":
		name = "kubernetes"
		sp.Kube.IdleRefresh = 10 * time.Second
	default:
		return sp, fmt.Errorf("unknown loan provider %q in %q (want local:max=N,... or kubernetes:max=N,...)", name, s)
	}
	sp.Provider = name
	kube := name == "kubernetes"
	c := &sp.Controller
	// The keys whose zero the controller reads as "the default" start at
	// their defaults, so that a zero given (min-lease=0: return as soon
	// as the demand allows; cool-down=0) is a zero and not the default.
	var d capacity.Options
	d.EnsureDefaults()
	c.Target, c.High, c.MinLease, c.CoolDown, c.Exact = d.Target, d.High, d.MinLease, d.CoolDown, true
	given, seen := map[string]bool{}, map[string]bool{}
	if rest != "" {
		for kv := range strings.SplitSeq(rest, ",") {
			k, v, ok := strings.Cut(kv, "=")
			if !ok {
				return sp, fmt.Errorf("loan %q: %q is not KEY=VALUE", s, kv)
			}
			// A key given twice took its last value silently (max=2,...,
			// max=20); promo=, pool= and taint= are lists.
			if seen[k] && k != "promo" && k != "pool" && k != "taint" {
				return sp, fmt.Errorf("loan %q: %s= is given twice", s, k)
			}
			seen[k] = true
			var err error
			dur := func(d *time.Duration) { *d, err = time.ParseDuration(v); given[k] = true }
			num := func(f *float64) {
				// NaN and Inf parse, and pass every comparison a check
				// makes: capacity=NaN loaned nothing, silently.
				if *f, err = strconv.ParseFloat(v, 64); err == nil && (math.IsNaN(*f) || math.IsInf(*f, 0)) {
					err = fmt.Errorf("%q is not a finite number", v)
				}
			}
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
			case "promo":
				var p Promotion
				if p, err = ParsePromotion(v); err == nil {
					sp.Promotions = append(sp.Promotions, p)
				}
			case "addr":
				// addr=10xb was taken, and the controller's listen
				// failed only once the tiers had started.
				if _, port, perr := net.SplitHostPort(v); perr != nil || port == "" {
					err = fmt.Errorf("%q: want HOST:PORT (port 0: chosen by the OS)", v)
				}
				sp.Addr = v
			case "namespace", "template", "pool", "taint", "priority-class", "resource", "kubeconfig", "idle-refresh":
				if !kube {
					return sp, fmt.Errorf("loan %q: %s= is a key of the kubernetes lender", s, k)
				}
				kv := &sp.Kube
				switch k {
				case "namespace":
					kv.Namespace = v
				case "template":
					kv.Template = v
				case "pool":
					kv.Pool = append(kv.Pool, v)
				case "taint":
					kv.Taints = append(kv.Taints, v)
				case "priority-class":
					kv.PriorityClass = v
				case "resource":
					kv.Resource = v
				case "kubeconfig":
					kv.Kubeconfig = v
				case "idle-refresh":
					dur(&kv.IdleRefresh)
				}
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
	// Given as 0 or less, these were read as their defaults (startup
	// 2m, borrow-timeout 10m, drain-timeout 1m, window 2s, grace 30s,
	// idle-refresh 10s); a negative window, grace, reclaim-after or
	// hold was taken too.
	for _, d := range []struct {
		key  string
		v    time.Duration
		zero bool // 0 is meant: none
	}{
		{"startup", c.StartupEstimate, false}, {"borrow-timeout", c.BorrowTimeout, false}, {"drain-timeout", c.DrainTimeout, false},
		{"window", sp.Window, false}, {"grace", sp.Grace, false}, {"idle-refresh", sp.Kube.IdleRefresh, false},
		{"reclaim-after", sp.ReclaimAfter, true}, {"hold", sp.Hold, true},
	} {
		switch {
		case !given[d.key]:
		case d.zero && d.v < 0:
			return sp, fmt.Errorf("loan %q: %s=%v: want 0 or more", s, d.key, d.v)
		case !d.zero && d.v <= 0:
			return sp, fmt.Errorf("loan %q: %s=%v: want a positive duration", s, d.key, d.v)
		}
	}
	if kube {
		switch {
		case sp.Kube.Template == "":
			return sp, fmt.Errorf("loan %q: template=NAME (the dense StatefulSet, or Deployment, whose Pods a lent worker copies) is needed", s)
		case len(sp.Kube.Pool) == 0:
			return sp, fmt.Errorf("loan %q: pool=KEY=VALUE (the training pool's node label) is needed", s)
		case sp.Kube.PriorityClass == "":
			return sp, fmt.Errorf("loan %q: priority-class=NAME (a class below training's, so training preempts lent workers) is needed", s)
		case sp.ReclaimAfter != 0 || sp.Hold != 0:
			return sp, fmt.Errorf("loan %q: reclaim-after= and hold= are the local lender's: on Kubernetes the cluster reclaims", s)
		}
	}
	switch {
	case c.Policy == capacity.Predictive && len(sp.Promotions) == 0:
		// The predictive policy borrows ahead of ModelObs.Forecast; a
		// live run forecasts only from a promotion calendar. Without
		// one, it would borrow exactly as reactive does while saying
		// otherwise.
		return sp, fmt.Errorf("loan %q: policy=predictive needs the promotion calendar to forecast from: give promo=START/DURATION/FACTOR (as promo=2026-11-11T00:00:00+08:00/2h/3), or policy=reactive", s)
	case c.Policy != capacity.Predictive && len(sp.Promotions) > 0:
		return sp, fmt.Errorf("loan %q: promo= is read by policy=predictive only (reactive borrows when the demand comes)", s)
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
