// Package sharding plans how a model's embedding tables spread over
// several embedding workers (shards): table-wise for the many small and
// medium tables, row-wise (row r on the r mod m-th of the table's m
// shards) for the tables larger than a shard's budget or hotter than a
// shard's share of the lookups, balanced by bytes and by expected
// lookups. The planner core (Plan) is deterministic and does no IO;
// FromPlan and Criteo read a plan folder and a Criteo sample for it.
package sharding

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
)

// Table is one table as the planner sees it.
type Table struct {
	Name string
	Rows int64
	Dim  int
	// Lookups is the expected row lookups per sample (the ids of every
	// lookup of the table: the sum of their bags).
	Lookups float64
	// Freq says how the lookups fall on the rows; nil is Uniform.
	Freq Freq
}

// Bytes is the table's float32 size.
func (t *Table) Bytes() int64 { return t.Rows * t.rowBytes() }

func (t *Table) rowBytes() int64 { return int64(t.Dim) * 4 }

// Options configure Plan.
type Options struct {
	// Shards is the number of shards (>= 1).
	Shards int
	// ShardBytes is a shard's budget of float32 table bytes; 0 takes
	// the fair share (all the tables' bytes over Shards) plus 25%, or
	// what every table split row-wise over all the shards needs (the
	// sum of the tables' largest parts) when that is more.
	ShardBytes int64
	// Tolerance is the lookup balance to aim at: every shard's expected
	// lookups at most (1+Tolerance) times the mean; 0 takes 0.1.
	Tolerance float64
}

// DefaultTolerance is Options.Tolerance's default.
const DefaultTolerance = 0.1

// EnsureDefaults fills the zero fields that have defaults (ShardBytes
// needs the tables: Plan fills it).
func (o *Options) EnsureDefaults() {
	if o.Tolerance == 0 {
		o.Tolerance = DefaultTolerance
	}
}

// Validate checks the options.
func (o *Options) Validate() error {
	switch {
	case o.Shards < 1:
		return fmt.Errorf("shards %d, want at least 1", o.Shards)
	case o.Shards > maxShards:
		return fmt.Errorf("shards %d, want at most %d", o.Shards, maxShards)
	case o.ShardBytes < 0:
		return fmt.Errorf("shard bytes %d, want >= 0 (0: the fair share plus 25%%)", o.ShardBytes)
	case o.Tolerance < 0 || math.IsNaN(o.Tolerance):
		return fmt.Errorf("tolerance %v, want >= 0", o.Tolerance)
	}
	return nil
}

const maxShards = 1 << 12

// ErrNoFit says the tables cannot be placed within the budget.
var ErrNoFit = errors.New("the tables do not fit the shards")

// Result is a sharding: where each table goes, and what each shard holds.
type Result struct {
	Shards     int
	ShardBytes int64
	Tolerance  float64
	// Placements, in the order of the tables given: Shards[i] holds
	// the rows r with r mod len(Shards) == i (one shard: table-wise).
	Placements []Placement
	// Bytes, Rows and Lookups (expected per sample) per shard.
	Bytes   []int64
	Rows    []int64
	Lookups []float64
	// Imbalance is max(Lookups)/mean - 1.
	Imbalance float64
}

// Placement is one table's shards.
type Placement struct {
	Table  string
	Shards []int
}

// Plan places tables on o.Shards shards. Every row of every table lands
// on exactly one shard and no shard holds more than the budget; when
// that is impossible the error (ErrNoFit) says what does not fit. Among
// the plans it finds it aims at every shard's expected lookups within
// o.Tolerance of the mean, by splitting the hottest tables row-wise;
// Result.Imbalance is what it reached (a single row hotter than the
// tolerance allows, for one, cannot be split).
//
// The method: each table starts on as many shards as its bytes need
// (ceil(bytes/budget)) and its lookups need (ceil(lookups/fair share)).
// Tables are placed largest first (by the larger of their share of the
// bytes and of the lookups), each part on the least loaded shard with
// room that does not already hold a part of the table. When a table
// finds no room, or a shard ends over the lookup tolerance, the
// offending table's shards double (at most Shards) and it places again;
// when every table is already on every shard and it still fails, an
// exhaustive search by bytes alone (bounded, for the small tight cases
// greedy packing misses) has the last word. Plan always succeeds when
// every table split over all the shards fits (the budget at least the
// sum of the tables' largest parts), and the tests check on small cases
// that it succeeds exactly when some placement fits.
func Plan(tables []Table, o Options) (*Result, error) {
	o.EnsureDefaults()
	if err := o.Validate(); err != nil {
		return nil, err
	}
	n := o.Shards
	var total int64
	var looks float64
	seen := map[string]bool{}
	for i := range tables {
		t := &tables[i]
		switch {
		case t.Name == "":
			return nil, fmt.Errorf("tables[%d]: name is empty", i)
		case seen[t.Name]:
			return nil, fmt.Errorf("table %q listed twice", t.Name)
		case t.Rows <= 0 || t.Dim <= 0:
			return nil, fmt.Errorf("table %q: %d rows of dim %d, want both > 0", t.Name, t.Rows, t.Dim)
		case t.Lookups < 0 || math.IsNaN(t.Lookups) || math.IsInf(t.Lookups, 0):
			return nil, fmt.Errorf("table %q: %v lookups per sample, want >= 0", t.Name, t.Lookups)
		}
		seen[t.Name] = true
		total += t.Bytes()
		looks += t.Lookups
	}
	budget := o.ShardBytes
	if budget == 0 {
		budget = max(total+int64(n)-1, 0) / int64(n) * 5 / 4
		// At least every table split over all the shards, the larger
		// part of each on one shard: a placement always fits then (the
		// user set no budget, so none may be unmet). Only tables of few
		// rows per shard need more than the fair share plus 25%.
		var parts int64
		for i := range tables {
			parts += tables[i].rowBytes() * ceilDiv(tables[i].Rows, int64(n))
		}
		budget = max(budget, parts)
	}
	// ceil(total/n) > budget, not total > budget*n: that overflows for
	// a budget meant as "no limit".
	if ceilDiv(total, int64(n)) > budget {
		return nil, fmt.Errorf("%w: the tables hold %d bytes, %d shards of %d bytes only %d", ErrNoFit, total, n, budget, budget*int64(n))
	}
	// The biggest table's part when split over every shard.
	for i := range tables {
		t := &tables[i]
		if part := ceilDiv(t.Rows, int64(n)) * t.rowBytes(); part > budget {
			return nil, fmt.Errorf("%w: table %q (%d bytes) split row-wise over all %d shards still puts %d bytes on one, over the budget of %d", ErrNoFit, t.Name, t.Bytes(), n, part, budget)
		}
	}
	p := &packer{tables: tables, n: n, budget: budget, tol: o.Tolerance,
		fairBytes: float64(total) / float64(n), fairLooks: looks / float64(n)}
	p.shares = make([]map[int][]float64, len(tables))
	m := make([]int, len(tables))
	for i := range tables {
		t := &tables[i]
		k := max(ceilDiv(t.Bytes(), budget), 1)
		if p.fairLooks > 0 {
			k = max(k, int64(math.Ceil(t.Lookups/p.fairLooks-1e-9)))
		}
		m[i] = int(min(k, int64(n), t.Rows))
	}
	var best *Result
	for {
		res, bad := p.pack(m)
		if res != nil {
			if best == nil || res.Imbalance < best.Imbalance-1e-12 {
				best = res
			}
			if res.Imbalance <= o.Tolerance+1e-9 || bad < 0 {
				break
			}
		}
		if bad < 0 || !p.grow(m, bad) {
			if best != nil {
				break
			}
			if r := p.exact(); r != nil {
				best = r
				break
			}
			return nil, p.noFit()
		}
	}
	best.Tolerance = o.Tolerance
	return best, nil
}

// packer is one Plan's state across its attempts.
type packer struct {
	tables               []Table
	n                    int
	budget               int64
	tol                  float64
	fairBytes, fairLooks float64
	shares               []map[int][]float64 // per table, per m: Freq.Shares
}

// bytesWeight is the weight of a shard's bytes beside its lookups when
// the planner picks the shard for a part: lookups decide, the budget
// bounds the bytes, and bytes break near ties, so shards fill evenly.
const bytesWeight = 0.25

func ceilDiv(a, b int64) int64 { return (a + b - 1) / b }

func (p *packer) share(i, m int) []float64 {
	if s, ok := p.shares[i][m]; ok {
		return s
	}
	if p.shares[i] == nil {
		p.shares[i] = map[int][]float64{}
	}
	t := &p.tables[i]
	f := t.Freq
	if f == nil {
		f = Uniform{}
	}
	s := f.Shares(t.Rows, m)
	p.shares[i][m] = s
	return s
}

// grow splits table i over more shards (doubling, at most n and its
// rows); false when it is already on as many as it can be. A table
// that cannot grow passes the growth on to the largest other table that
// can.
func (p *packer) grow(m []int, i int) bool {
	try := func(j int) bool {
		limit := int(min(int64(p.n), p.tables[j].Rows))
		if m[j] >= limit {
			return false
		}
		m[j] = min(2*m[j], limit)
		return true
	}
	if try(i) {
		return true
	}
	order := p.order(m)
	for _, j := range order {
		if j != i && try(j) {
			return true
		}
	}
	return false
}

// order is the tables by decreasing weight (the larger of their
// per-part shares of the bytes and of the lookups), then by name.
func (p *packer) order(m []int) []int {
	w := make([]float64, len(p.tables))
	idx := make([]int, len(p.tables))
	for i := range p.tables {
		t := &p.tables[i]
		w[i] = max(float64(t.Bytes())/p.fairBytes, safeDiv(t.Lookups, p.fairLooks)) / float64(m[i])
		idx[i] = i
	}
	slices.SortStableFunc(idx, func(a, b int) int {
		if c := cmp.Compare(w[b], w[a]); c != 0 {
			return c
		}
		return cmp.Compare(p.tables[a].Name, p.tables[b].Name)
	})
	return idx
}

func safeDiv(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

// pack places every table over m[i] shards. It returns the result, and
// the table to split further: the one that found no room (result nil),
// or the hottest splittable table on the most loaded shard when that
// shard is over the tolerance (-1 when none).
func (p *packer) pack(m []int) (*Result, int) {
	n := p.n
	r := &Result{Shards: n, ShardBytes: p.budget, Placements: make([]Placement, len(p.tables)),
		Bytes: make([]int64, n), Rows: make([]int64, n), Lookups: make([]float64, n)}
	on := make([][]int, n) // tables per shard
	score := func(s int, b int64, l float64) float64 {
		return safeDiv(r.Lookups[s]+l, p.fairLooks) + bytesWeight*float64(r.Bytes[s]+b)/p.fairBytes
	}
	for _, i := range p.order(m) {
		t := &p.tables[i]
		k := m[i]
		sh := p.share(i, k)
		// Parts heaviest first; each to the best shard with room that
		// holds no other part of this table.
		parts := make([]int, k)
		for j := range parts {
			parts[j] = j
		}
		rows := func(j int) int64 { return partRows(t.Rows, int64(k), int64(j)) }
		slices.SortStableFunc(parts, func(a, b int) int {
			if c := cmp.Compare(rows(b), rows(a)); c != 0 {
				return c
			}
			return cmp.Compare(sh[b], sh[a])
		})
		shards := make([]int, k)
		used := map[int]bool{}
		for _, j := range parts {
			b := rows(j) * t.rowBytes()
			l := t.Lookups * sh[j]
			best := -1
			for s := range n {
				if used[s] || r.Bytes[s]+b > p.budget {
					continue
				}
				if best < 0 || score(s, b, l) < score(best, b, l)-1e-12 {
					best = s
				}
			}
			if best < 0 {
				return nil, i
			}
			used[best] = true
			shards[j] = best
			r.Bytes[best] += b
			r.Rows[best] += rows(j)
			r.Lookups[best] += l
			on[best] = append(on[best], i)
		}
		r.Placements[i] = Placement{Table: t.Name, Shards: shards}
	}
	p.improve(r, m)
	on = make([][]int, n)
	for i, pl := range r.Placements {
		for _, s := range pl.Shards {
			on[s] = append(on[s], i)
		}
	}
	hot, maxL := 0, 0.0
	for s, l := range r.Lookups {
		if l > maxL {
			hot, maxL = s, l
		}
	}
	r.Imbalance = safeDiv(maxL, p.fairLooks) - 1
	if p.fairLooks == 0 {
		r.Imbalance = 0
	}
	if r.Imbalance <= p.tol+1e-9 {
		return r, -1
	}
	// The hottest table of the hottest shard that can still split.
	split, splitL := -1, 0.0
	for _, i := range on[hot] {
		if m[i] >= int(min(int64(p.n), p.tables[i].Rows)) {
			continue
		}
		if l := p.tables[i].Lookups / float64(m[i]); l > splitL {
			split, splitL = i, l
		}
	}
	return r, split
}

// noFit explains why no split fits: every table row-wise on every shard
// it can be and still a shard over the budget.
func (p *packer) noFit() error {
	m := make([]int, len(p.tables))
	for i := range m {
		m[i] = int(min(int64(p.n), p.tables[i].Rows))
	}
	_, bad := p.pack(m)
	name := ""
	if bad >= 0 {
		name = fmt.Sprintf(" (table %q found no room)", p.tables[bad].Name)
	}
	return fmt.Errorf("%w: even with every table split row-wise over all %d shards some shard exceeds the budget of %d bytes%s", ErrNoFit, p.n, p.budget, name)
}

// improve moves parts off the shard with the most expected lookups while
// that lowers its lookups without raising another above them and fits
// the budget: a part to a shard not holding the table, or a swap of two
// tables' parts. Greedy placement leaves the last small tables where
// they fell; this evens out what it left.
func (p *packer) improve(r *Result, m []int) {
	type part struct {
		table, j int
		bytes    int64
		looks    float64
	}
	partOf := func(i, j int) part {
		t := &p.tables[i]
		k := int64(m[i])
		return part{table: i, j: j, bytes: partRows(t.Rows, k, int64(j)) * t.rowBytes(), looks: t.Lookups * p.share(i, m[i])[j]}
	}
	holds := func(s, i int) bool { return slices.Contains(r.Placements[i].Shards, s) }
	move := func(pt part, from, to int) {
		r.Placements[pt.table].Shards[pt.j] = to
		rows := partRows(p.tables[pt.table].Rows, int64(m[pt.table]), int64(pt.j))
		r.Bytes[from] -= pt.bytes
		r.Rows[from] -= rows
		r.Lookups[from] -= pt.looks
		r.Bytes[to] += pt.bytes
		r.Rows[to] += rows
		r.Lookups[to] += pt.looks
	}
	for range 4 * len(p.tables) * p.n {
		hot := 0
		for s := range p.n {
			if r.Lookups[s] > r.Lookups[hot] {
				hot = s
			}
		}
		var parts []part
		for i, pl := range r.Placements {
			for j, s := range pl.Shards {
				if s == hot {
					parts = append(parts, partOf(i, j))
				}
			}
		}
		// The best single change: the lowest resulting max of the two
		// shards it touches, if below the hot shard's lookups now.
		bestMax := r.Lookups[hot] - 1e-9*max(1, r.Lookups[hot])
		var do func()
		for _, a := range parts {
			for s := range p.n {
				if s == hot || r.Lookups[s] >= r.Lookups[hot] {
					continue
				}
				if !holds(s, a.table) && r.Bytes[s]+a.bytes <= p.budget {
					if mx := max(r.Lookups[hot]-a.looks, r.Lookups[s]+a.looks); mx < bestMax {
						a, s := a, s
						bestMax, do = mx, func() { move(a, hot, s) }
					}
				}
				for i, pl := range r.Placements {
					for j, t := range pl.Shards {
						if t != s || i == a.table || holds(hot, i) || holds(s, a.table) {
							continue
						}
						b := partOf(i, j)
						if b.looks >= a.looks || r.Bytes[s]-b.bytes+a.bytes > p.budget || r.Bytes[hot]-a.bytes+b.bytes > p.budget {
							continue
						}
						if mx := max(r.Lookups[hot]-a.looks+b.looks, r.Lookups[s]+a.looks-b.looks); mx < bestMax {
							a, b, s := a, b, s
							bestMax, do = mx, func() { move(a, hot, s); move(b, s, hot) }
						}
					}
				}
			}
		}
		if do == nil {
			return
		}
		do()
	}
}

// exactNodes bounds exact's search.
const exactNodes = 200_000

// exact searches every placement by bytes alone (per table a shard
// count, and which shards take its larger and its smaller parts), for
// the cases the greedy packing misses: tight budgets on few tables and
// shards. nil when none fits or the search gives up.
func (p *packer) exact() *Result {
	n := p.n
	order := p.order(make([]int, len(p.tables))) // any fixed order
	load := make([]int64, n)
	shards := make([][]int, len(p.tables))
	nodes := 0
	var rec func(k int) bool
	rec = func(k int) bool {
		if k == len(order) {
			return true
		}
		i := order[k]
		t := &p.tables[i]
		for m := 1; m <= n && int64(m) <= t.Rows; m++ {
			big := int(t.Rows % int64(m)) // parts 0..big-1 hold one row more
			var pick func(j, from int, used []bool, chosen []int) bool
			pick = func(j, from int, used []bool, chosen []int) bool {
				if nodes++; nodes > exactNodes {
					return false
				}
				if j == m {
					shards[i] = slices.Clone(chosen)
					return rec(k + 1)
				}
				if j == big {
					from = 0 // the smaller parts: again in increasing shard order
				}
				b := partRows(t.Rows, int64(m), int64(j)) * t.rowBytes()
				for s := from; s < n; s++ {
					if used[s] || load[s]+b > p.budget {
						continue
					}
					used[s] = true
					load[s] += b
					if pick(j+1, s+1, used, append(chosen, s)) {
						return true
					}
					used[s] = false
					load[s] -= b
				}
				return false
			}
			if pick(0, 0, make([]bool, n), nil) {
				return true
			}
		}
		return false
	}
	if !rec(0) {
		return nil
	}
	m := make([]int, len(p.tables))
	r := &Result{Shards: n, ShardBytes: p.budget, Placements: make([]Placement, len(p.tables)),
		Bytes: make([]int64, n), Rows: make([]int64, n), Lookups: make([]float64, n)}
	for i := range p.tables {
		t := &p.tables[i]
		m[i] = len(shards[i])
		sh := p.share(i, m[i])
		r.Placements[i] = Placement{Table: t.Name, Shards: shards[i]}
		for j, s := range shards[i] {
			rows := partRows(t.Rows, int64(m[i]), int64(j))
			r.Bytes[s] += rows * t.rowBytes()
			r.Rows[s] += rows
			r.Lookups[s] += t.Lookups * sh[j]
		}
	}
	p.improve(r, m)
	maxL := slices.Max(r.Lookups)
	r.Imbalance = max(safeDiv(maxL, p.fairLooks)-1, 0)
	return r
}
