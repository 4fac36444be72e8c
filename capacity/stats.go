package capacity

import (
	"maps"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// EventKey names a counted event: a decision's kind and reason, or a
// reclaim or failed borrow and where it came from.
type EventKey struct {
	Kind, Reason string
}

// StartupBuckets are the upper bounds, in seconds, of the histogram of
// the time from a borrow decision to the worker serving: from a local
// lender's process start (tens of milliseconds) to a Kubernetes pod's
// image pull and model load (minutes).
var StartupBuckets = []float64{0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600}

// Stats are the controller's counters, to log or export.
type Stats struct {
	// Borrowed is the workers held now per model (starting, serving or
	// draining); Pending the workers asked for and not yet arrived.
	Borrowed, Pending map[string]int
	// BorrowedWorkers counts every worker borrowed so far.
	BorrowedWorkers int
	// Events counts decisions by kind and reason, reclaims
	// ("reclaim", "lender" or "not held"), failed borrows ("borrow
	// failed", "provider" or "timeout"), adopted workers.
	Events map[EventKey]int
	// StartupCount, StartupSum and StartupMax describe the time from a
	// borrow decision to the worker serving; StartupHist counts them per
	// StartupBuckets bound (not cumulative; the last is above every bound).
	StartupCount           int
	StartupSum, StartupMax time.Duration
	StartupHist            []int
	// BorrowedGPUSeconds is the time borrowed workers were held, summed
	// (one worker is one GPU, MIG slice or core of the lender).
	BorrowedGPUSeconds float64
	// ReleasedWithInFlight is the work still in flight on workers
	// released at a deadline: requests a reclaim's grace cut off.
	ReleasedWithInFlight int
}

func newStats() Stats {
	return Stats{Events: map[EventKey]int{}, StartupHist: make([]int, len(StartupBuckets)+1)}
}

func (s *Stats) observeStartup(d time.Duration) {
	s.StartupCount++
	s.StartupSum += d
	s.StartupMax = max(s.StartupMax, d)
	i := 0
	for i < len(StartupBuckets) && d.Seconds() > StartupBuckets[i] {
		i++
	}
	s.StartupHist[i]++
}

// Stats returns a copy of the counters.
func (c *Controller) Stats() Stats {
	s := c.stats
	s.Events = maps.Clone(c.stats.Events)
	s.StartupHist = append([]int(nil), c.stats.StartupHist...)
	s.Borrowed, s.Pending = map[string]int{}, map[string]int{}
	for _, l := range c.leases {
		s.Borrowed[l.model]++
	}
	for _, p := range c.pending {
		s.Pending[p.model] += p.n
	}
	return s
}

// Collector exports Stats as Prometheus metrics. The driver passes a
// function that returns the controller's Stats under its own lock.
type Collector struct {
	stats                                        func() Stats
	borrowed, pending, events, startup, gpuHours *prometheus.Desc
	cutOff                                       *prometheus.Desc
}

var _ prometheus.Collector = (*Collector)(nil)

// NewCollector returns a collector of the stats stats returns.
func NewCollector(stats func() Stats) *Collector {
	return &Collector{
		stats:    stats,
		borrowed: prometheus.NewDesc("prism_capacity_borrowed_workers", "Borrowed dense workers held (starting, serving or draining).", []string{"model"}, nil),
		pending:  prometheus.NewDesc("prism_capacity_pending_workers", "Workers asked of the lender and not yet arrived.", []string{"model"}, nil),
		events:   prometheus.NewDesc("prism_capacity_events_total", "Borrow, drain, return, shed, reclaim and failed-borrow events by reason.", []string{"kind", "reason"}, nil),
		startup:  prometheus.NewDesc("prism_capacity_decision_to_serving_seconds", "Time from a borrow decision to the borrowed worker serving.", nil, nil),
		gpuHours: prometheus.NewDesc("prism_capacity_borrowed_gpu_hours_total", "Borrowed worker time, hours (one worker is one lent device).", nil, nil),
		cutOff:   prometheus.NewDesc("prism_capacity_released_in_flight_total", "Work still in flight on workers released at a deadline.", nil, nil),
	}
}

func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.borrowed, c.pending, c.events, c.startup, c.gpuHours, c.cutOff} {
		ch <- d
	}
}

func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	s := c.stats()
	for m, n := range s.Borrowed {
		ch <- prometheus.MustNewConstMetric(c.borrowed, prometheus.GaugeValue, float64(n), m)
	}
	for m, n := range s.Pending {
		ch <- prometheus.MustNewConstMetric(c.pending, prometheus.GaugeValue, float64(n), m)
	}
	for k, n := range s.Events {
		ch <- prometheus.MustNewConstMetric(c.events, prometheus.CounterValue, float64(n), k.Kind, k.Reason)
	}
	buckets := map[float64]uint64{}
	cum := uint64(0)
	for i, b := range StartupBuckets {
		cum += uint64(s.StartupHist[i])
		buckets[b] = cum
	}
	ch <- prometheus.MustNewConstHistogram(c.startup, uint64(s.StartupCount), s.StartupSum.Seconds(), buckets)
	ch <- prometheus.MustNewConstMetric(c.gpuHours, prometheus.CounterValue, s.BorrowedGPUSeconds/3600)
	ch <- prometheus.MustNewConstMetric(c.cutOff, prometheus.CounterValue, float64(s.ReleasedWithInFlight))
}
