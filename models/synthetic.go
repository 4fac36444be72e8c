package models

import (
	"errors"
	"math"
	"math/rand/v2"
)

// Source yields batches of samples. Next returns io.EOF when a finite
// source is exhausted; a final short batch comes before it.
type Source interface {
	Next(n int) (*Batch, error)
}

// SyntheticOptions shape synthetic requests.
type SyntheticOptions struct {
	Seed uint64
	// ZipfS is the exponent of the per-table id popularity (default 1.05;
	// values near 1 match production embedding access skew).
	ZipfS float64
	// Uniform draws ids uniformly instead (no skew).
	Uniform bool
	// Stream, when not 0, draws the samples from a sequence of their own:
	// the same ids are popular (each table's popularity order comes from
	// Seed) but the samples differ from stream to stream, as one day's
	// traffic differs from the next over the same catalogue. 0: the
	// seed's one sequence.
	Stream uint64
}

// Synthetic draws samples for a signature: sparse ids Zipf-distributed
// per table (each table with its own hot set), dense features
// log(1+X) with X log-normal, the shape Criteo's dense counts have after
// DLRM's log transform. Deterministic for a seed.
type Synthetic struct {
	sig   *Signature
	r     *rand.Rand
	zipfs []*Zipf
	perms []idPermutation
	// per-value samplers of inputs with Ranges (nil for dense values)
	vzipfs [][]*Zipf
	vperms [][]idPermutation
	opts   SyntheticOptions
}

var _ Source = (*Synthetic)(nil)

// NewSynthetic returns a synthetic source for sig.
func NewSynthetic(sig Signature, o SyntheticOptions) (*Synthetic, error) {
	if o.ZipfS == 0 {
		o.ZipfS = 1.05
	}
	// pr orders each table's ids by popularity; s.r draws the samples
	// (the same generator unless a Stream is given).
	pr := rand.New(rand.NewPCG(o.Seed, 0x5eed))
	s := &Synthetic{sig: &sig, r: pr, opts: o}
	if o.Stream != 0 {
		s.r = rand.New(rand.NewPCG(o.Seed^0x9E3779B97F4A7C15, o.Stream))
	}
	s.zipfs = make([]*Zipf, len(sig.Inputs))
	s.perms = make([]idPermutation, len(sig.Inputs))
	s.vzipfs = make([][]*Zipf, len(sig.Inputs))
	s.vperms = make([][]idPermutation, len(sig.Inputs))
	for i, in := range sig.Inputs {
		if in.Ranges != nil {
			if len(in.Ranges) != in.Width {
				return nil, errors.New("synthetic: input " + in.Name + ": ranges do not match its width")
			}
			s.vzipfs[i] = make([]*Zipf, in.Width)
			s.vperms[i] = make([]idPermutation, in.Width)
			for j, r := range in.Ranges {
				if !r.IsID() {
					if in.Kind == SparseKind {
						return nil, errors.New("synthetic: input " + in.Name + " has a value with no id range")
					}
					continue
				}
				z, err := NewZipf(s.r, o.ZipfS, r.Hi-r.Lo)
				if err != nil {
					return nil, err
				}
				s.vzipfs[i][j] = z
				s.vperms[i][j] = newIDPermutation(pr, r.Hi-r.Lo)
			}
			continue
		}
		if in.Kind != SparseKind {
			continue
		}
		if in.Rows <= 0 {
			return nil, errors.New("synthetic: input " + in.Name + " has no id range")
		}
		z, err := NewZipf(s.r, o.ZipfS, in.Rows)
		if err != nil {
			return nil, err
		}
		s.zipfs[i] = z
		s.perms[i] = newIDPermutation(pr, in.Rows)
	}
	return s, nil
}

// Next draws n samples.
func (s *Synthetic) Next(n int) (*Batch, error) {
	b := &Batch{N: n, Sig: s.sig, Columns: make([]Column, len(s.sig.Inputs))}
	bags := s.drawBags(n)
	for i, in := range s.sig.Inputs {
		if in.Offsets != "" || in.Kind == OffsetsKind {
			s.nextJagged(b, i, in, bags)
			continue
		}
		if in.Ranges != nil {
			s.nextRanged(b, i, in, n)
			continue
		}
		switch in.Kind {
		case DenseKind:
			v := make([]float32, n*in.Width)
			for j := range v {
				v[j] = float32(math.Log1p(math.Exp(1 + 1.5*s.r.NormFloat64())))
			}
			b.Columns[i].F32 = v
		case SparseKind:
			v := make([]int64, n*in.Width)
			for j := range v {
				if s.opts.Uniform {
					v[j] = s.r.Int64N(in.Rows)
				} else {
					v[j] = s.perms[i].id(s.zipfs[i].Rank())
				}
			}
			b.Columns[i].I64 = v
		}
	}
	return b, nil
}

// nextRanged draws an input with per-value ranges: each id value from its
// own range (Zipf, or uniform), each dense value as Next does.
func (s *Synthetic) nextRanged(b *Batch, i int, in InputSpec, n int) {
	id := func(j int) int64 {
		r := in.Ranges[j]
		if s.opts.Uniform {
			return r.Lo + s.r.Int64N(r.Hi-r.Lo)
		}
		return r.Lo + s.vperms[i][j].id(s.vzipfs[i][j].Rank())
	}
	if in.Kind == SparseKind {
		v := make([]int64, n*in.Width)
		for k := range v {
			v[k] = id(k % in.Width)
		}
		b.Columns[i].I64 = v
		return
	}
	v := make([]float32, n*in.Width)
	for k := range v {
		if j := k % in.Width; in.Ranges[j].IsID() {
			v[k] = float32(id(j))
		} else {
			v[k] = float32(math.Log1p(math.Exp(1 + 1.5*s.r.NormFloat64())))
		}
	}
	b.Columns[i].F32 = v
}
