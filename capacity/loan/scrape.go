package loan

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"
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

// parseText reads the Prometheus text exposition format (the lines the
// client library writes; comments skipped).
func parseText(r io.Reader) ([]metricLine, error) {
	var out []metricLine
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		m := metricLine{labels: map[string]string{}}
		rest := line
		if i := strings.IndexAny(line, "{ "); i >= 0 && line[i] == '{' {
			m.name = line[:i]
			j := strings.LastIndexByte(line, '}')
			if j < i {
				return nil, fmt.Errorf("metrics line %q: unclosed labels", line)
			}
			for _, kv := range splitLabels(line[i+1 : j]) {
				k, v, ok := strings.Cut(kv, "=")
				if !ok {
					continue
				}
				if uq, err := strconv.Unquote(v); err == nil {
					v = uq
				}
				m.labels[strings.TrimSpace(k)] = v
			}
			rest = line[j+1:]
		} else {
			name, r, _ := strings.Cut(line, " ")
			m.name, rest = name, r
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			return nil, fmt.Errorf("metrics line %q: no value", line)
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			return nil, fmt.Errorf("metrics line %q: %w", line, err)
		}
		m.value = v
		out = append(out, m)
	}
	return out, sc.Err()
}

// splitLabels splits a{b="x,y",c="z"}'s inside at commas outside quotes.
func splitLabels(s string) []string {
	var out []string
	start, quoted := 0, false
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '\\':
			i++
		case '"':
			quoted = !quoted
		case ',':
			if !quoted {
				out = append(out, s[start:i])
				start = i + 1
			}
		}
	}
	if start < len(s) {
		out = append(out, s[start:])
	}
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

// between is the demand from a to b, dt apart. A counter that went back
// (the router restarted) makes it nothing but the queue.
func between(a, b sample, dt time.Duration) demand {
	d := demand{queue: int(b.inflight)}
	if dt <= 0 || b.requests < a.requests || b.shed < a.shed {
		return d
	}
	s := dt.Seconds()
	d.offered = (b.requests - a.requests) / s
	d.shed = (b.shed - a.shed) / s
	d.p99 = quantile(a.buckets, b.buckets, 0.99)
	return d
}

// quantile of the histogram's growth from a to b: the upper bound of the
// bucket it falls in (the highest finite one for +Inf).
func quantile(a, b map[float64]float64, q float64) time.Duration {
	les := make([]float64, 0, len(b))
	for le := range b {
		les = append(les, le)
	}
	sort.Float64s(les)
	if len(les) == 0 {
		return 0
	}
	total := b[les[len(les)-1]] - a[les[len(les)-1]]
	if total <= 0 {
		return 0
	}
	for i, le := range les {
		if b[le]-a[le] >= q*total {
			if math.IsInf(le, 1) && i > 0 {
				le = les[i-1]
			}
			return time.Duration(le * float64(time.Second))
		}
	}
	return 0
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
