package models

import (
	"fmt"
	"math"
	"math/bits"
	"math/rand/v2"
)

// Zipf draws ranks 1..n with P(k) proportional to k^-s, for any s > 0
// (math/rand's Zipf needs s > 1; real id traffic is often near or below
// 1). It uses rejection-inversion sampling (Hörmann and Derflinger, 1996):
// constant time per draw, no table, any n.
type Zipf struct {
	r                *rand.Rand
	n                float64
	s                float64
	hX1, hN, sThresh float64
}

// NewZipf returns a sampler over 1..n with exponent s.
func NewZipf(r *rand.Rand, s float64, n int64) (*Zipf, error) {
	if !(s > 0) || math.IsInf(s, 0) {
		return nil, fmt.Errorf("zipf exponent must be positive, got %v", s)
	}
	if n < 1 {
		return nil, fmt.Errorf("zipf range must be at least 1, got %d", n)
	}
	z := &Zipf{r: r, n: float64(n), s: s}
	z.hX1 = z.hIntegral(1.5) - 1
	z.hN = z.hIntegral(z.n + 0.5)
	z.sThresh = 2 - z.hIntegralInv(z.hIntegral(2.5)-z.h(2))
	return z, nil
}

// Rank draws one rank in [1, n].
func (z *Zipf) Rank() int64 {
	for {
		u := z.hN + z.r.Float64()*(z.hX1-z.hN)
		x := z.hIntegralInv(u)
		k := math.Floor(x + 0.5)
		k = math.Min(math.Max(k, 1), z.n)
		if k-x <= z.sThresh || u >= z.hIntegral(k+0.5)-z.h(k) {
			return int64(k)
		}
	}
}

// h is the unnormalised density x^-s.
func (z *Zipf) h(x float64) float64 { return math.Exp(-z.s * math.Log(x)) }

// hIntegral is an antiderivative of h: (x^(1-s) - 1) / (1-s), or log x.
func (z *Zipf) hIntegral(x float64) float64 {
	lx := math.Log(x)
	return expm1OverX((1-z.s)*lx) * lx
}

func (z *Zipf) hIntegralInv(x float64) float64 {
	t := x * (1 - z.s)
	if t < -1 {
		t = -1 // rounding at the lower end
	}
	return math.Exp(log1pOverX(t) * x)
}

func expm1OverX(x float64) float64 {
	if math.Abs(x) > 1e-8 {
		return math.Expm1(x) / x
	}
	return 1 + x/2*(1+x/3*(1+x/4))
}

func log1pOverX(x float64) float64 {
	if math.Abs(x) > 1e-8 {
		return math.Log1p(x) / x
	}
	return 1 - x*(1.0/2-x*(1.0/3-x/4))
}

// idPermutation maps Zipf ranks to ids so the hot ids are spread over the
// table instead of being its first rows: id = (a*(rank-1) + c) mod rows,
// a bijection because gcd(a, rows) = 1.
type idPermutation struct {
	a, c, rows uint64
}

func newIDPermutation(r *rand.Rand, rows int64) idPermutation {
	n := uint64(rows)
	a := r.Uint64()%n | 1
	for gcd(a, n) != 1 {
		a = (a + 2) % n
		if a == 0 {
			a = 1
		}
	}
	return idPermutation{a: a, c: r.Uint64() % n, rows: n}
}

func (p idPermutation) id(rank int64) int64 {
	hi, lo := bits.Mul64(p.a, uint64(rank-1))
	_, rem := bits.Div64(hi%p.rows, lo, p.rows)
	return int64((rem + p.c) % p.rows)
}

func gcd(a, b uint64) uint64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}
