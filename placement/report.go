package placement

import (
	"encoding/csv"
	"io"
	"math"
	"strconv"
)

// Summary is the mean and spread of one policy over seeds at one arrived
// load.
type Summary struct {
	Policy    string
	Seeds     int
	ArrivedAt int
	AllocMean float64
	AllocStd  float64
	FragMean  float64
	// FailedPct is the mean share of the tasks arrived by ArrivedAt that
	// found no node, in percent.
	FailedPct float64
}

// Summarize groups results by policy (in first-seen order) at arrived
// percent pct.
func Summarize(results []*SimResult, pct int) []Summary {
	order, by := ByPolicy(results)
	var out []Summary
	for _, p := range order {
		rs := by[p]
		s := Summary{Policy: p, Seeds: len(rs), ArrivedAt: pct}
		for _, r := range rs {
			s.AllocMean += r.AllocAt(pct)
			s.FragMean += r.FragAt(pct)
			s.FailedPct += r.FailedAt(pct)
		}
		n := float64(len(rs))
		s.AllocMean /= n
		s.FragMean /= n
		s.FailedPct /= n
		for _, r := range rs {
			d := r.AllocAt(pct) - s.AllocMean
			s.AllocStd += d * d
		}
		if len(rs) > 1 {
			s.AllocStd = math.Sqrt(s.AllocStd / (n - 1))
		}
		out = append(out, s)
	}
	return out
}

// WriteCurvesCSV writes one row per (policy, seed, arrived percent).
func WriteCurvesCSV(w io.Writer, results []*SimResult) error {
	cw := csv.NewWriter(w)
	if err := cw.Write([]string{"policy", "seed", "arrived_pct", "alloc_pct", "frag_pct", "frag_ratio_pct"}); err != nil {
		return err
	}
	f := func(v float64) string { return strconv.FormatFloat(v, 'f', 4, 64) }
	for _, r := range results {
		for _, p := range r.Curve {
			if err := cw.Write([]string{r.Policy, strconv.FormatUint(r.Seed, 10), strconv.Itoa(p.ArrivedPct), f(p.AllocPct), f(p.FragPct), f(p.FragRatioPct)}); err != nil {
				return err
			}
		}
	}
	cw.Flush()
	return cw.Error()
}

// WriteSummaryCSV writes Summarize's rows.
func WriteSummaryCSV(w io.Writer, sums []Summary) error {
	cw := csv.NewWriter(w)
	if err := cw.Write([]string{"policy", "seeds", "arrived_pct", "alloc_mean_pct", "alloc_std_pct", "frag_mean_pct", "failed_tasks_pct"}); err != nil {
		return err
	}
	f := func(v float64) string { return strconv.FormatFloat(v, 'f', 3, 64) }
	for _, s := range sums {
		if err := cw.Write([]string{s.Policy, strconv.Itoa(s.Seeds), strconv.Itoa(s.ArrivedAt), f(s.AllocMean), f(s.AllocStd), f(s.FragMean), f(s.FailedPct)}); err != nil {
			return err
		}
	}
	cw.Flush()
	return cw.Error()
}

// ByPolicy groups results by policy, policies in first-seen order.
func ByPolicy(results []*SimResult) ([]string, map[string][]*SimResult) {
	var order []string
	by := map[string][]*SimResult{}
	for _, r := range results {
		if _, ok := by[r.Policy]; !ok {
			order = append(order, r.Policy)
		}
		by[r.Policy] = append(by[r.Policy], r)
	}
	return order, by
}
