package hot

import (
	"math"
	"math/rand/v2"
	"testing"
)

// int8Row is what a row stored as int8 decodes to (store.Int8: scale =
// max|x| / 127, q = round(x / scale) clamped to ±127, value q * scale).
func int8Row(x []float32) []float32 {
	var m float32
	for _, v := range x {
		m = max(m, float32(math.Abs(float64(v))))
	}
	scale := m / 127
	out := make([]float32, len(x))
	for i, v := range x {
		q := 0.0
		if scale > 0 {
			q = math.Round(float64(v / scale))
		}
		out[i] = float32(int8(max(-127, min(127, q)))) * scale
	}
	return out
}

// TestInt8Pack: every row an int8 table's rows decode to packs and widens
// back to the same bits, over widths, magnitudes from subnormal to huge,
// zero rows and rows of one sign; rows that are not a scale times int8s
// do not pack.
func TestInt8Pack(t *testing.T) {
	r := rand.New(rand.NewPCG(8, 8))
	for dim := minInt8Dim; dim <= 200; dim++ {
		words := 1 + (dim+3)/4
		for trial := range 200 {
			x := make([]float32, dim)
			mag := math.Pow(10, float64(r.IntN(80)-44))
			for i := range x {
				switch trial % 4 {
				case 0:
					x[i] = float32(r.NormFloat64() * mag)
				case 1:
					x[i] = float32(r.Float64() * mag) // one sign
				case 2:
					x[i] = float32(r.NormFloat64() * 1e-39) // subnormal scale
				case 3:
					x[i] = 0
				}
			}
			row := int8Row(x)
			packed := make([]float32, words)
			if !packInt8(packed, row) {
				t.Fatalf("dim %d: %v (from %v) does not pack", dim, row, x)
			}
			got := make([]float32, dim)
			copy(got[dim-words:], packed)
			widenInt8InPlace(got, words)
			for i := range row {
				if math.Float32bits(got[i]) != math.Float32bits(row[i]) {
					t.Fatalf("dim %d: value %d widens to %v, want %v", dim, i, got[i], row[i])
				}
			}
		}
	}
	for _, row := range [][]float32{
		{1, 0.3, 0, 0, 0, 0, 0, 0},                           // 0.3 is no q * 1/127
		{float32(math.NaN()), 1, 0, 0, 0, 0, 0, 0},           // NaN
		{float32(math.Inf(1)), 1, 0, 0, 0, 0, 0, 0},          // infinite scale
		{float32(math.Copysign(0, -1)), 0, 0, 0, 0, 0, 0, 0}, // -0 decodes from no int8
		{1, 2, 3, 4, 5, 6, 7, 1000},                          // 1000/127 * q misses 1..7
	} {
		if packInt8(make([]float32, 3), row) {
			t.Fatalf("%v packs as int8", row)
		}
	}
}

// TestWidthCodes: the width codes a class may have, and Int8Width's
// floor.
func TestWidthCodes(t *testing.T) {
	for _, c := range []struct {
		width int
		valid bool
	}{
		{1, true}, {64, true}, {dimLimit - 1, true}, {0, false}, {dimLimit, false},
		{HalfWidth(1), true}, {HalfWidth(64), true}, {halfBit, false},
		{Int8Width(64), true}, {Int8Width(minInt8Dim), true}, {int8Bit | 7, false},
		{halfBit | int8Bit | 64, false}, {1 << 26, false}, {-1, false},
	} {
		if got := ValidWidth(c.width); got != c.valid {
			t.Errorf("ValidWidth(%#x) = %v, want %v", c.width, got, c.valid)
		}
	}
	if Int8Width(minInt8Dim-1) != minInt8Dim-1 {
		t.Errorf("Int8Width(%d) = %#x: a narrow row stays float32", minInt8Dim-1, Int8Width(minInt8Dim-1))
	}
}
