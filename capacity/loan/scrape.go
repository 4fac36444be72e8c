package loan

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"sort"
	"strconv"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// recommendMethod is the router's public RPC whose counters and latency
// histogram (internal/serve's prism_rpc_*) measure the demand.
const recommendMethod = "/prism.v1.Recommender/Recommend"

// sample is one scrape of the router's /metrics: cumulative counters.
type sample struct {
	requests float64 // Recommend answered, every code
	shed     float64 // of them ResourceExhausted (admission, overload)
	inflight float64 // prism_router_inflight_samples
	buckets  map[float64]float64
	// routers are the /metrics URLs summed, comma-separated: counters
	// of different sets of routers do not compare.
	routers string
}

// demand is what happened between two samples.
type demand struct {
	offered, shed float64 // requests/s
	p99           time.Duration
	queue         int
}

// metricLine is one sample line of the Prometheus text format.
type metricLine struct {
	name   string
	labels map[string]string
	value  float64
}

// parseText reads the Prometheus text exposition format with the
// Prometheus library's own parser and flattens it into sample lines: a
// histogram family becomes its _bucket lines (le label, +Inf included),
// _sum and _count, as the text names them.
func parseText(r io.Reader) ([]metricLine, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	var out []metricLine
	for name, mf := range fams {
		for _, m := range mf.GetMetric() {
			labels := make(map[string]string, len(m.GetLabel())+1)
			for _, lp := range m.GetLabel() {
				labels[lp.GetName()] = lp.GetValue()
			}
			switch mf.GetType() {
			case dto.MetricType_COUNTER:
				out = append(out, metricLine{name, labels, m.GetCounter().GetValue()})
			case dto.MetricType_GAUGE:
				out = append(out, metricLine{name, labels, m.GetGauge().GetValue()})
			case dto.MetricType_UNTYPED:
				out = append(out, metricLine{name, labels, m.GetUntyped().GetValue()})
			case dto.MetricType_HISTOGRAM:
				h := m.GetHistogram()
				count := float64(h.GetSampleCount()) + h.GetSampleCountFloat()
				inf := false
				for _, b := range h.GetBucket() {
					bl := withLabel(labels, "le", strconv.FormatFloat(b.GetUpperBound(), 'g', -1, 64))
					inf = inf || math.IsInf(b.GetUpperBound(), 1)
					out = append(out, metricLine{name + "_bucket", bl, float64(b.GetCumulativeCount()) + b.GetCumulativeCountFloat()})
				}
				if !inf {
					out = append(out, metricLine{name + "_bucket", withLabel(labels, "le", "+Inf"), count})
				}
				out = append(out, metricLine{name + "_sum", labels, h.GetSampleSum()}, metricLine{name + "_count", labels, count})
			case dto.MetricType_SUMMARY:
				s := m.GetSummary()
				out = append(out, metricLine{name + "_sum", labels, s.GetSampleSum()}, metricLine{name + "_count", labels, float64(s.GetSampleCount())})
			}
		}
	}
	return out, nil
}

// withLabel is labels plus k=v, a copy.
func withLabel(labels map[string]string, k, v string) map[string]string {
	out := make(map[string]string, len(labels)+1)
	for lk, lv := range labels {
		out[lk] = lv
	}
	out[k] = v
	return out
}

// routerSample picks the demand's counters out of the router's metrics.
func routerSample(lines []metricLine) sample {
	s := sample{buckets: map[float64]float64{}}
	for _, m := range lines {
		switch {
		case m.name == "prism_rpc_requests_total" && m.labels["method"] == recommendMethod:
			s.requests += m.value
			if m.labels["code"] == "ResourceExhausted" {
				s.shed += m.value
			}
		case m.name == "prism_rpc_latency_seconds_bucket" && m.labels["method"] == recommendMethod:
			le, err := strconv.ParseFloat(m.labels["le"], 64)
			if err == nil {
				s.buckets[le] += m.value
			}
		case m.name == "prism_router_inflight_samples":
			s.inflight += m.value // summed over the routers scraped
		}
	}
	return s
}

// between is the demand from a to b, dt apart; ok is false when it is
// not known: a counter went back (a router restarted: what it counted
// before is gone, so the difference says nothing of the demand) or no
// time passed.
func between(a, b sample, dt time.Duration) (d demand, ok bool) {
	d = demand{queue: int(b.inflight)}
	if dt <= 0 || b.requests < a.requests || b.shed < a.shed {
		return d, false
	}
	s := dt.Seconds()
	d.offered = (b.requests - a.requests) / s
	d.shed = (b.shed - a.shed) / s
	d.p99 = quantile(a.buckets, b.buckets, 0.99)
	return d, true
}

// quantile of the histogram's growth from a to b: the upper bound of the
// bucket it falls in (the highest finite one for +Inf). The bounds are
// those of a and b together, each read at its own highest bound below
// (cumAt), so a histogram whose buckets changed between the two (a
// router restarted into another release) still reads as one.
func quantile(a, b map[float64]float64, q float64) time.Duration {
	les := bounds(a, b)
	if len(les) == 0 {
		return 0
	}
	top := les[len(les)-1]
	total := cumAt(b, top) - cumAt(a, top)
	if total <= 0 {
		return 0
	}
	for i, le := range les {
		if cumAt(b, le)-cumAt(a, le) >= q*total {
			if math.IsInf(le, 1) && i > 0 {
				le = les[i-1]
			}
			return time.Duration(le * float64(time.Second))
		}
	}
	return 0
}

// bounds are the bucket bounds of the histograms hs, sorted, each once.
func bounds(hs ...map[float64]float64) []float64 {
	var les []float64
	for _, h := range hs {
		for le := range h {
			les = append(les, le)
		}
	}
	sort.Float64s(les)
	out := les[:0]
	for i, le := range les {
		if i == 0 || le != les[i-1] {
			out = append(out, le)
		}
	}
	return out
}

// cumAt is histogram h's cumulative count at le: its count at its own
// highest bound at or below le, the requests it knows took at most le
// (0 when it has none so low).
func cumAt(h map[float64]float64, le float64) float64 {
	best, v := math.Inf(-1), 0.0
	for b, c := range h {
		if b <= le && b > best {
			best, v = b, c
		}
	}
	return v
}

// add sums o, another router's sample, into s. Routers of different
// releases may bucket their latency histograms differently: summed
// bound by bound, only +Inf held every router's count, and a p99 of 10
// ms read as the highest finite bound. Each router's count at a bound
// of either is its count at its own highest bound below it (cumAt): a
// lower bound of the requests that took at most that long.
func (s *sample) add(o sample) {
	s.requests += o.requests
	s.shed += o.shed
	s.inflight += o.inflight
	sum := make(map[float64]float64, len(s.buckets)+len(o.buckets))
	for _, le := range bounds(s.buckets, o.buckets) {
		sum[le] = cumAt(s.buckets, le) + cumAt(o.buckets, le)
	}
	s.buckets = sum
}

// scrape fetches url's metrics.
func scrape(ctx context.Context, c *http.Client, url string) ([]metricLine, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scrape %s: %s", url, resp.Status)
	}
	return parseText(resp.Body)
}
