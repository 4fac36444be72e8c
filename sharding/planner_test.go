package sharding

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

func TestPlanTable(t *testing.T) {
	small := func(name string, rows int64) Table { return Table{Name: name, Rows: rows, Dim: 4, Lookups: 1} }
	for _, tc := range []struct {
		name   string
		tables []Table
		o      Options
		// want: per table, its shard count (1: table-wise); wantErr: a
		// substring of the error.
		want    []int
		wantErr string
	}{
		{name: "one shard holds all", tables: []Table{small("a", 10), small("b", 20)}, o: Options{Shards: 1}, want: []int{1, 1}},
		{name: "small tables stay whole", tables: []Table{small("a", 100), small("b", 100), small("c", 100), small("d", 100)},
			o: Options{Shards: 2, ShardBytes: 4 * 16 * 100}, want: []int{1, 1, 1, 1}},
		{name: "a table over the budget splits by rows", tables: []Table{{Name: "big", Rows: 1000, Dim: 4, Lookups: 0.2}, {Name: "b", Rows: 10, Dim: 4, Lookups: 0.1}, {Name: "c", Rows: 10, Dim: 4, Lookups: 0.1}},
			o: Options{Shards: 4, ShardBytes: 300 * 16, Tolerance: 10}, want: []int{4, 1, 1}},
		{name: "a hot table splits by lookups", tables: []Table{{Name: "hot", Rows: 100, Dim: 4, Lookups: 10}, small("b", 100), small("c", 100)},
			o: Options{Shards: 2, ShardBytes: 1 << 20}, want: []int{2, 1, 1}},
		{name: "over the total", tables: []Table{small("a", 100), small("b", 100)},
			o: Options{Shards: 2, ShardBytes: 16 * 90}, wantErr: "the tables hold 3200 bytes, 2 shards of 1440 bytes only 2880"},
		{name: "the biggest table split still too big", tables: []Table{small("a", 3), {Name: "b", Rows: 1, Dim: 1}},
			o: Options{Shards: 2, ShardBytes: 30}, wantErr: `table "a" (48 bytes) split row-wise over all 2 shards still puts 32 bytes on one, over the budget of 30`},
		{name: "bad options", tables: []Table{small("a", 1)}, o: Options{Shards: 0}, wantErr: "shards 0"},
		{name: "duplicate table", tables: []Table{small("a", 1), small("a", 1)}, o: Options{Shards: 1}, wantErr: `table "a" listed twice`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, err := Plan(tc.tables, tc.o)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []int
			for _, p := range r.Placements {
				got = append(got, len(p.Shards))
			}
			if !slices.Equal(got, tc.want) {
				t.Fatalf("shards per table %v, want %v (%+v)", got, tc.want, r)
			}
			checkResult(t, tc.tables, tc.o, r)
		})
	}
}

// checkResult checks the invariants of any plan: every row of every
// table on exactly one shard (distinct shards per table, modulo parts),
// the shards' sums as placed, none over the budget.
func checkResult(t *testing.T, tables []Table, o Options, r *Result) {
	t.Helper()
	n := o.Shards
	bytes := make([]int64, n)
	rows := make([]int64, n)
	for i, tb := range tables {
		p := r.Placements[i]
		if p.Table != tb.Name {
			t.Fatalf("placement %d is %q, want %q", i, p.Table, tb.Name)
		}
		m := int64(len(p.Shards))
		if m < 1 || m > tb.Rows {
			t.Fatalf("table %q on %d shards with %d rows", tb.Name, m, tb.Rows)
		}
		seen := map[int]bool{}
		for _, s := range p.Shards {
			if s < 0 || s >= n || seen[s] {
				t.Fatalf("table %q: shards %v", tb.Name, p.Shards)
			}
			seen[s] = true
		}
		// Every row on exactly one shard: count by row for small tables.
		var sum int64
		for j, s := range p.Shards {
			k := partRows(tb.Rows, m, int64(j))
			sum += k
			rows[s] += k
			bytes[s] += k * tb.rowBytes()
		}
		if sum != tb.Rows {
			t.Fatalf("table %q: parts hold %d rows of %d", tb.Name, sum, tb.Rows)
		}
	}
	for s := range n {
		if bytes[s] != r.Bytes[s] || rows[s] != r.Rows[s] {
			t.Fatalf("shard %d: result says %d bytes %d rows, placements make %d, %d", s, r.Bytes[s], r.Rows[s], bytes[s], rows[s])
		}
		if bytes[s] > r.ShardBytes {
			t.Fatalf("shard %d: %d bytes over the budget %d", s, bytes[s], r.ShardBytes)
		}
	}
}

func randTables(rng *rand.Rand, k int, maxRows int64) []Table {
	ts := make([]Table, k)
	for i := range ts {
		rows := int64(math.Exp(rng.Float64()*math.Log(float64(maxRows)))) + 1
		ts[i] = Table{Name: fmt.Sprintf("t%02d", i), Rows: rows, Dim: 1 + rng.IntN(32), Lookups: float64(1 + rng.IntN(3))}
		if rng.IntN(2) == 0 {
			ts[i].Freq = Zipf{S: 0.8 + 0.4*rng.Float64()}
		}
	}
	return ts
}

// When the all-row-wise layout fits (a solution exists), Plan finds one,
// and every plan keeps the invariants.
func TestPlanPropertyFits(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for it := range 400 {
		n := 1 + rng.IntN(8)
		ts := randTables(rng, 1+rng.IntN(30), 1e5)
		var allRow int64
		for _, tb := range ts {
			allRow += ceilDiv(tb.Rows, int64(n)) * tb.rowBytes()
		}
		o := Options{Shards: n, ShardBytes: allRow + rng.Int64N(allRow/2+1)}
		r, err := Plan(ts, o)
		if err != nil {
			t.Fatalf("case %d: %d shards of %d, all row-wise fits, got %v", it, n, o.ShardBytes, err)
		}
		checkResult(t, ts, o, r)
	}
}

// On tiny cases, Plan succeeds exactly when some modulo placement fits
// the budget (found by exhaustive search), and errors with ErrNoFit
// otherwise.
func TestPlanPropertyExhaustive(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for it := range 1500 {
		n := 1 + rng.IntN(3)
		ts := randTables(rng, 1+rng.IntN(4), 7)
		for i := range ts {
			ts[i].Dim = 1 + rng.IntN(3)
		}
		var total int64
		for _, tb := range ts {
			total += tb.Bytes()
		}
		o := Options{Shards: n, ShardBytes: max(1, total/int64(n)+rng.Int64N(8)-3)}
		exists := feasible(ts, n, o.ShardBytes)
		r, err := Plan(ts, o)
		switch {
		case exists && err != nil:
			t.Fatalf("case %d: %+v on %d shards of %d: a placement fits, Plan says %v", it, ts, n, o.ShardBytes, err)
		case !exists && err == nil:
			t.Fatalf("case %d: no placement fits, Plan found %+v", it, r)
		case err != nil && !errors.Is(err, ErrNoFit):
			t.Fatalf("case %d: error %v is not ErrNoFit", it, err)
		case err == nil:
			checkResult(t, ts, o, r)
		}
	}
}

// feasible searches every placement: per table an ordered choice of
// distinct shards (row r on the r mod m-th).
func feasible(ts []Table, n int, budget int64) bool {
	load := make([]int64, n)
	var rec func(i int) bool
	rec = func(i int) bool {
		if i == len(ts) {
			return true
		}
		tb := ts[i]
		for m := 1; m <= n && int64(m) <= tb.Rows; m++ {
			var perm func(j int, used []bool, order []int) bool
			perm = func(j int, used []bool, order []int) bool {
				if j == m {
					ok := true
					for k, s := range order {
						load[s] += partRows(tb.Rows, int64(m), int64(k)) * tb.rowBytes()
						if load[s] > budget {
							ok = false
						}
					}
					if ok && rec(i+1) {
						return true
					}
					for k, s := range order {
						load[s] -= partRows(tb.Rows, int64(m), int64(k)) * tb.rowBytes()
					}
					return false
				}
				for s := range n {
					if !used[s] {
						used[s] = true
						if perm(j+1, used, append(order, s)) {
							return true
						}
						used[s] = false
					}
				}
				return false
			}
			if perm(0, make([]bool, n), nil) {
				return true
			}
		}
		return false
	}
	return rec(0)
}

// With many tables of comparable heat and room to spare, the expected
// lookups are balanced within the tolerance.
func TestPlanPropertyBalance(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for it := range 200 {
		n := 2 + rng.IntN(7)
		ts := randTables(rng, 4*n+rng.IntN(20), 1e6)
		o := Options{Shards: n}
		r, err := Plan(ts, o)
		if err != nil {
			t.Fatalf("case %d: %v", it, err)
		}
		checkResult(t, ts, Options{Shards: n}, r)
		var mean, maxL float64
		for _, l := range r.Lookups {
			mean += l / float64(n)
			maxL = max(maxL, l)
		}
		if maxL > mean*(1+DefaultTolerance)+1e-9 {
			for i, tb := range ts {
				t.Logf("%s rows %d dim %d lookups %v freq %v on %v", tb.Name, tb.Rows, tb.Dim, tb.Lookups, tb.Freq, r.Placements[i].Shards)
			}
			t.Fatalf("case %d: %d shards, lookups %v: max %.3f over mean %.3f by more than %v", it, n, r.Lookups, maxL, mean, DefaultTolerance)
		}
		if math.Abs(r.Imbalance-(maxL/mean-1)) > 1e-9 {
			t.Fatalf("case %d: imbalance %v, lookups say %v", it, r.Imbalance, maxL/mean-1)
		}
	}
}

// Plan is deterministic: the same input gives the same plan.
func TestPlanDeterministic(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	ts := randTables(rng, 40, 1e6)
	a, err := Plan(ts, Options{Shards: 5})
	if err != nil {
		t.Fatal(err)
	}
	for range 5 {
		b, err := Plan(slices.Clone(ts), Options{Shards: 5})
		if err != nil {
			t.Fatal(err)
		}
		if fmt.Sprint(a) != fmt.Sprint(b) {
			t.Fatalf("plans differ:\n%v\n%v", a, b)
		}
	}
}

func TestShares(t *testing.T) {
	for _, f := range []Freq{Uniform{}, Zipf{S: 1.05}, Zipf{S: 1}, Counts{Rows: map[int64]float64{0: 3, 5: 1}}} {
		for _, rows := range []int64{1, 7, 1000, 1 << 20} {
			for _, m := range []int{1, 2, 3, 8} {
				s := f.Shares(rows, m)
				var sum float64
				for _, v := range s {
					sum += v
				}
				if len(s) != m || math.Abs(sum-1) > 1e-9 {
					t.Fatalf("%v rows %d m %d: shares %v", f, rows, m, s)
				}
			}
		}
	}
	// Zipf's tail integral agrees with the exact sum.
	z := Zipf{S: 1.05}
	exact := make([]float64, 3)
	var tot float64
	for r := range int64(200000) {
		w := math.Pow(float64(r+1), -z.S)
		exact[r%3] += w
		tot += w
	}
	got := z.Shares(200000, 3)
	for i := range exact {
		if math.Abs(exact[i]/tot-got[i]) > 1e-4 {
			t.Fatalf("zipf shares %v, exact %v", got, exact)
		}
	}
	// Modulo spreads the hot head: the first part of a Zipf table gets
	// a bit more than its rows' share, far less than a contiguous range.
	if s := z.Shares(1<<20, 4); s[0] > 0.4 {
		t.Fatalf("zipf modulo shares %v", s)
	}
}
