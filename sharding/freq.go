package sharding

import (
	"fmt"
	"math"
)

// Freq is how a table's lookups fall on its rows.
type Freq interface {
	// Shares returns, for a table of rows rows split into m parts by
	// row modulo m, each part's share of the table's lookups (m values
	// summing to 1).
	Shares(rows int64, m int) []float64
	// String names the estimate as plan.json records it.
	String() string
}

// Uniform: every row alike.
type Uniform struct{}

func (Uniform) String() string { return "uniform" }

// Shares is each part's share of the rows.
func (Uniform) Shares(rows int64, m int) []float64 {
	out := make([]float64, m)
	for i := range out {
		out[i] = float64(partRows(rows, int64(m), int64(i))) / float64(rows)
	}
	return out
}

// Zipf: row r is looked up with weight 1/(r+1)^S, ids in frequency order
// (the hottest the lowest), as frequency-sorted hashing of Criteo's
// categorical values leaves them.
type Zipf struct{ S float64 }

func (z Zipf) String() string { return fmt.Sprintf("zipf:%g", z.S) }

// zipfExact is how many head rows Shares sums one by one; the tail is
// spread over the parts by their rows (its weights differ little from
// row to row, so its rows fall evenly on the residues).
const zipfExact = 1 << 16

// Shares sums the weights of the first rows exactly and integrates the tail.
func (z Zipf) Shares(rows int64, m int) []float64 {
	out := make([]float64, m)
	head := min(rows, zipfExact)
	var total float64
	for r := range head {
		w := math.Pow(float64(r+1), -z.S)
		out[r%int64(m)] += w
		total += w
	}
	if rows > head {
		// ∫ (x+1)^-s dx from head-0.5 to rows-0.5 (midpoint rule per row).
		a, b := float64(head)+0.5, float64(rows)+0.5
		var tail float64
		if math.Abs(z.S-1) < 1e-12 {
			tail = math.Log(b / a)
		} else {
			tail = (math.Pow(b, 1-z.S) - math.Pow(a, 1-z.S)) / (1 - z.S)
		}
		n := rows - head
		for i := range out {
			// Tail rows of residue i: those of [head, rows) congruent to i.
			k := partRows(rows, int64(m), int64(i)) - partRows(head, int64(m), int64(i))
			out[i] += tail * float64(k) / float64(n)
		}
		total += tail
	}
	for i := range out {
		out[i] /= total
	}
	return out
}

// Counts is an observed sample: lookups per row of one table (rows
// absent were not seen). An empty sample is taken as uniform.
type Counts struct {
	Rows   map[int64]float64
	Source string
}

func (c Counts) String() string { return c.Source }

// Shares is each part's share of the observed lookups.
func (c Counts) Shares(rows int64, m int) []float64 {
	out := make([]float64, m)
	var total float64
	for r, n := range c.Rows {
		out[r%int64(m)] += n
		total += n
	}
	if total == 0 {
		return Uniform{}.Shares(rows, m)
	}
	for i := range out {
		out[i] /= total
	}
	return out
}

func partRows(rows, m, rem int64) int64 {
	if m <= 1 {
		return rows
	}
	n := rows / m
	if rem < rows%m {
		n++
	}
	return n
}
