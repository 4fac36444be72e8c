package loadgen

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
)

// A mix of models: one run whose requests are split across several
// models by share, as a site's traffic is (a CTR and a CVR model behind
// one router during a promotion). One arrival process drives the run;
// each request picks its model by a seeded draw, so a run's choices are
// reproducible, and each model's requests are built as a run of that
// model alone builds them.

// MixModel is one model of a mix and its weight, as given.
type MixModel struct {
	Name   string
	Weight float64
}

// Mix is the models of a run and their weights, in the order given.
type Mix []MixModel

// ParseMix reads --model values: each "NAME" or a comma-separated list
// of "NAME=WEIGHT" (values may be repeated: "a=7" "b=3" is "a=7,b=3").
// Weights are relative, normalised to shares by Shares. Every model of
// a mix of several has a weight, or none does (equal shares): "a=0.7,b"
// is refused, since b's share would be a guess. A weight that is not a
// positive finite number, an empty name and a name given twice are
// refused. One model, with or without a weight, is a mix of one.
func ParseMix(values []string) (Mix, error) {
	var m Mix
	seen := map[string]bool{}
	weighted, bare := 0, 0
	for _, v := range values {
		for item := range strings.SplitSeq(v, ",") {
			item = strings.TrimSpace(item)
			name, w, hasWeight := strings.Cut(item, "=")
			name = strings.TrimSpace(name)
			if name == "" {
				return nil, fmt.Errorf("--model %q: an empty model name (want NAME or NAME=WEIGHT,NAME=WEIGHT...)", v)
			}
			weight := 1.0
			if hasWeight {
				weighted++
				f, err := strconv.ParseFloat(strings.TrimSpace(w), 64)
				if err != nil || math.IsNaN(f) || math.IsInf(f, 0) || f <= 0 {
					return nil, fmt.Errorf("--model %q: model %s's weight %q: want a positive number", v, name, strings.TrimSpace(w))
				}
				weight = f
			} else {
				bare++
			}
			if seen[name] {
				return nil, fmt.Errorf("--model: model %s is given twice; give each model once, with its weight", name)
			}
			seen[name] = true
			m = append(m, MixModel{Name: name, Weight: weight})
		}
	}
	if len(m) == 0 {
		return nil, errors.New("--model is required")
	}
	if weighted > 0 && bare > 0 {
		return nil, fmt.Errorf("--model %s: give every model of the mix a weight (NAME=WEIGHT) or none (equal shares)", strings.Join(values, " --model "))
	}
	return m, nil
}

// Names are the mix's model names, in order.
func (m Mix) Names() []string {
	out := make([]string, len(m))
	for i, e := range m {
		out[i] = e.Name
	}
	return out
}

// Shares are the weights normalised to sum to 1, in order.
func (m Mix) Shares() []float64 {
	sum := 0.0
	for _, e := range m {
		sum += e.Weight
	}
	out := make([]float64, len(m))
	for i, e := range m {
		out[i] = e.Weight / sum
	}
	return out
}

// String is the mix as shares, "a=0.70,b=0.30".
func (m Mix) String() string {
	var b strings.Builder
	for i, s := range m.Shares() {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "%s=%.2f", m[i].Name, s)
	}
	return b.String()
}

// Chooser draws each request's model by share, reproducibly for a seed.
// It is not safe for concurrent use; the runner's producer owns it.
type Chooser struct {
	cum []float64 // cumulative shares; the last is 1
	r   *rand.Rand
}

// NewChooser returns the draws of shares (summing to 1) from seed.
func NewChooser(shares []float64, seed uint64) *Chooser {
	cum := make([]float64, len(shares))
	acc := 0.0
	for i, s := range shares {
		acc += s
		cum[i] = acc
	}
	if len(cum) > 0 {
		cum[len(cum)-1] = 1 // rounding must not leave a draw unassigned
	}
	return &Chooser{cum: cum, r: rand.New(rand.NewPCG(seed, 0x6d6978))}
}

// Next is the index of the next request's model.
func (c *Chooser) Next() int {
	if len(c.cum) == 1 {
		return 0
	}
	u := c.r.Float64()
	for i, v := range c.cum {
		if u < v {
			return i
		}
	}
	return len(c.cum) - 1
}

// MixedModel is one model of NewMixedRequests: its requests' options
// and its share of the requests.
type MixedModel struct {
	Options RequestOptions
	Share   float64
}

// ModelShare names a model of a mixed request stream and its share.
type ModelShare struct {
	Name  string
	Share float64
}

// NewMixedRequests returns a request stream over several models: each
// request goes to a model drawn by share (from seed), and is that
// model's next request, as NewRequests(its options) builds them. Each
// model's request ids carry its name ("lg-NAME-N"), so that ids stay
// unique across the run.
func NewMixedRequests(ms []MixedModel, seed uint64) (*Requests, error) {
	if len(ms) < 2 {
		return nil, errors.New("requests: a mix needs two models or more")
	}
	q := &Requests{}
	shares := make([]float64, len(ms))
	for i, m := range ms {
		o := m.Options
		if o.IDPrefix == "" {
			o.IDPrefix = "lg-" + o.Model + "-"
		}
		sub, err := NewRequests(o)
		if err != nil {
			return nil, fmt.Errorf("model %s: %w", o.Model, err)
		}
		q.mix = append(q.mix, sub)
		q.shares = append(q.shares, ModelShare{Name: o.Model, Share: m.Share})
		shares[i] = m.Share
	}
	q.choose = NewChooser(shares, seed)
	return q, nil
}

// Models are a mixed stream's models and shares; nil for one model.
func (q *Requests) Models() []ModelShare { return q.shares }
