// Package tune searches the serving configuration of a model on this
// machine (prism tune): each trial starts prism up with one
// configuration and measures the highest rate whose p99 meets the SLO
// with the load generator's find-max. The search (Searcher) is a
// deterministic core with no processes and no clock: it proposes the
// next configuration from a prior learned on other models' tuning runs
// and the results measured so far, and says when the next trial is not
// expected to improve the best by more than a threshold.
package tune

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Config is one serving configuration: prism up flag names (without the
// dashes) to their values as written on the command line.
type Config map[string]string

// String is the configuration as flags, in the order of keys.
func (c Config) flags(keys []string) string {
	var b strings.Builder
	for _, k := range keys {
		if v, ok := c[k]; ok {
			if b.Len() > 0 {
				b.WriteByte(' ')
			}
			fmt.Fprintf(&b, "%s=%s", k, v)
		}
	}
	return b.String()
}

// Dim is one dimension of the search: a prism up flag and the values
// tried, in increasing order (neighbours are adjacent values).
type Dim struct {
	Flag   string   `json:"flag"`
	Values []string `json:"values"`
	// Default is the value a configuration without this flag stands for
	// (one measured before the dimension existed: a prior file's older
	// points); "" means such a configuration cannot be placed.
	Default string `json:"default,omitempty"`
}

// Space is the discrete space searched: every combination of its
// dimensions' values.
type Space struct {
	Dims []Dim `json:"dims"`
}

// Point is a configuration of a Space as one value index per dimension.
type Point []int

// Validate checks that every dimension has a flag, at least one value
// and no value twice, and that no flag appears twice.
func (s Space) Validate() error {
	if len(s.Dims) == 0 {
		return fmt.Errorf("search space has no dimensions")
	}
	seen := map[string]bool{}
	for _, d := range s.Dims {
		if d.Flag == "" {
			return fmt.Errorf("search space: a dimension has no flag")
		}
		if seen[d.Flag] {
			return fmt.Errorf("search space: %s given twice", d.Flag)
		}
		seen[d.Flag] = true
		if len(d.Values) == 0 {
			return fmt.Errorf("search space: %s has no values", d.Flag)
		}
		vs := map[string]bool{}
		for _, v := range d.Values {
			if vs[v] {
				return fmt.Errorf("search space: %s lists %q twice", d.Flag, v)
			}
			vs[v] = true
		}
		if nums, ok := numbers(d.Values); ok {
			for i := range nums {
				for j := range i {
					if nums[i] == nums[j] {
						return fmt.Errorf("search space: %s lists %q and %q, the same value", d.Flag, d.Values[j], d.Values[i])
					}
				}
			}
		}
	}
	return nil
}

// Sorted is s with the values of each dimension whose values are all
// numbers (see number) in increasing order, as Dim wants them:
// neighbours are then adjacent values, and a configuration measured
// elsewhere is placed between the values around its own. A dimension
// with a value that is not a number ("auto") keeps its order.
func (s Space) Sorted() Space {
	out := Space{Dims: make([]Dim, len(s.Dims))}
	for i, d := range s.Dims {
		d.Values = slices.Clone(d.Values)
		if nums, ok := numbers(d.Values); ok {
			idx := make([]int, len(nums))
			for j := range idx {
				idx[j] = j
			}
			sort.SliceStable(idx, func(a, b int) bool { return nums[idx[a]] < nums[idx[b]] })
			for j, k := range idx {
				d.Values[j] = s.Dims[i].Values[k]
			}
		}
		out.Dims[i] = d
	}
	return out
}

// numbers reads every value as a number (ok false when one is not).
func numbers(values []string) ([]float64, bool) {
	out := make([]float64, len(values))
	for i, v := range values {
		x, ok := number(v)
		if !ok {
			return nil, false
		}
		out[i] = x
	}
	return out, true
}

// Size is the number of points.
func (s Space) Size() int {
	n := 1
	for _, d := range s.Dims {
		n *= len(d.Values)
	}
	return n
}

// Flags are the dimensions' flags, in order.
func (s Space) Flags() []string {
	out := make([]string, len(s.Dims))
	for i, d := range s.Dims {
		out[i] = d.Flag
	}
	return out
}

// All lists every point, the last dimension varying fastest.
func (s Space) All() []Point {
	out := make([]Point, 0, s.Size())
	p := make(Point, len(s.Dims))
	for {
		out = append(out, append(Point(nil), p...))
		i := len(p) - 1
		for ; i >= 0; i-- {
			p[i]++
			if p[i] < len(s.Dims[i].Values) {
				break
			}
			p[i] = 0
		}
		if i < 0 {
			return out
		}
	}
}

// Config is p's configuration.
func (s Space) Config(p Point) Config {
	c := Config{}
	for i, d := range s.Dims {
		c[d.Flag] = d.Values[p[i]]
	}
	return c
}

// String is p as flag=value pairs.
func (s Space) String(p Point) string { return s.Config(p).flags(s.Flags()) }

// Coords are p's coordinates in the unit cube: value index over the
// dimension's last index (0 for a dimension of one value).
func (s Space) Coords(p Point) []float64 {
	out := make([]float64, len(p))
	for i, d := range s.Dims {
		if n := len(d.Values); n > 1 {
			out[i] = float64(p[i]) / float64(n-1)
		}
	}
	return out
}

// distance is the squared distance of p and q in the unit cube.
func (s Space) distance(p, q Point) float64 {
	a, b := s.Coords(p), s.Coords(q)
	var d2 float64
	for i := range a {
		d2 += (a[i] - b[i]) * (a[i] - b[i])
	}
	return d2
}

// CoordsOf places a configuration measured elsewhere (another model's
// run, maybe over other values) in this space's unit cube: per
// dimension the position of its value, exact or else interpolated
// between the numeric neighbours (clamped to the ends). ok is false
// when a dimension's flag is missing or its value cannot be placed.
func (s Space) CoordsOf(c Config) (coords []float64, ok bool) {
	out := make([]float64, len(s.Dims))
	for i, d := range s.Dims {
		v, has := c[d.Flag]
		if !has && d.Default != "" {
			v, has = d.Default, true
		}
		if !has {
			return nil, false
		}
		x, ok := position(d.Values, v)
		if !ok {
			return nil, false
		}
		out[i] = x
	}
	return out, true
}

// position is v's place among values in [0,1].
func position(values []string, v string) (float64, bool) {
	n := len(values)
	for j, w := range values {
		if w == v {
			if n == 1 {
				return 0, true
			}
			return float64(j) / float64(n-1), true
		}
	}
	x, ok := number(v)
	if !ok {
		return 0, false
	}
	nums := make([]float64, n)
	for j, w := range values {
		if nums[j], ok = number(w); !ok {
			return 0, false
		}
	}
	if n == 1 {
		return 0, true
	}
	// Interpolate on a log scale (the values are batch sizes, delays,
	// byte sizes: steps are ratios), clamped to the ends.
	lg := func(f float64) float64 { return math.Log(math.Max(f, 1e-12)) }
	if x <= nums[0] {
		return 0, true
	}
	for j := 1; j < n; j++ {
		if x <= nums[j] {
			f := (lg(x) - lg(nums[j-1])) / (lg(nums[j]) - lg(nums[j-1]))
			return (float64(j-1) + f) / float64(n-1), true
		}
	}
	return 1, true
}

// number reads a value as a number: an integer or float, a duration
// (seconds) or a byte size with a KiB/MiB/GiB suffix.
func number(v string) (float64, bool) {
	if f, err := strconv.ParseFloat(v, 64); err == nil {
		return f, true
	}
	if d, err := time.ParseDuration(v); err == nil {
		return d.Seconds(), true
	}
	for _, u := range []struct {
		suffix string
		mult   float64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"B", 1}} {
		if s, ok := strings.CutSuffix(v, u.suffix); ok {
			if f, err := strconv.ParseFloat(s, 64); err == nil {
				return f * u.mult, true
			}
		}
	}
	return 0, false
}

// Neighbours are the points one step away from p along one dimension,
// dimension by dimension, the lower value first.
func (s Space) Neighbours(p Point) []Point {
	var out []Point
	for i, d := range s.Dims {
		for _, step := range []int{-1, 1} {
			j := p[i] + step
			if j < 0 || j >= len(d.Values) {
				continue
			}
			q := append(Point(nil), p...)
			q[i] = j
			out = append(out, q)
		}
	}
	return out
}

// Index finds c's point: every dimension's value must be one of its
// values.
func (s Space) Index(c Config) (Point, bool) {
	p := make(Point, len(s.Dims))
	for i, d := range s.Dims {
		found := false
		for j, v := range d.Values {
			if c[d.Flag] == v {
				p[i], found = j, true
				break
			}
		}
		if !found {
			return nil, false
		}
	}
	return p, true
}

func key(p Point) string { return fmt.Sprint([]int(p)) }

// StartConfig is the point of s nearest to defaults: per dimension the
// default's value when s lists it, else the middle value.
func StartConfig(s Space, defaults Config) Config {
	c := Config{}
	for _, d := range s.Dims {
		c[d.Flag] = d.Values[(len(d.Values)-1)/2]
		for _, v := range d.Values {
			if v == defaults[d.Flag] {
				c[d.Flag] = v
			}
		}
	}
	return c
}
