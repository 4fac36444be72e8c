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
	// keys of sparse inputs with Keys (nil for the others)
	keys []*keySet
	opts SyntheticOptions
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
	s.keys = make([]*keySet, len(sig.Inputs))
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
		n := in.Rows
		if in.Keys != nil {
			if in.Offsets != "" {
				return nil, errors.New("synthetic: input " + in.Name + ": keys on a jagged input")
			}
			k, err := newKeySet(in.Name, in.Keys)
			if err != nil {
				return nil, errors.New("synthetic: " + err.Error())
			}
			s.keys[i], n = k, k.n
		}
		if n <= 0 {
			return nil, errors.New("synthetic: input " + in.Name + " has no id range")
		}
		z, err := NewZipf(s.r, o.ZipfS, n)
		if err != nil {
			return nil, err
		}
		s.zipfs[i] = z
		s.perms[i] = newIDPermutation(pr, n)
	}
	return s, nil
}

// Next draws n samples, one after the other (each sample's values for
// every input before the next sample's): sample k is the same whatever
// n, and n samples drawn at once are the samples of n draws of one.
func (s *Synthetic) Next(n int) (*Batch, error) {
	ins := s.sig.Inputs
	b := &Batch{N: n, Sig: s.sig, Columns: make([]Column, len(ins))}
	for i, in := range ins {
		c := &b.Columns[i]
		switch {
		case in.Kind == OffsetsKind:
			c.I64 = make([]int64, 0, n+1)
		case in.Offsets != "" && in.Kind == SparseKind:
			c.I64 = make([]int64, 0, n*max(in.Width, 1))
		case in.Offsets != "":
			c.F32 = make([]float32, 0, n*max(in.Width, 1))
		case in.Kind == SparseKind:
			c.I64 = make([]int64, 0, n*in.Width)
		case in.Kind == DenseKind || in.Ranges != nil:
			c.F32 = make([]float32, 0, n*in.Width)
		}
		if in.Ranges != nil && in.Kind == SparseKind {
			c.F32, c.I64 = nil, make([]int64, 0, n*in.Width)
		}
	}
	most := s.bagWidths()
	bag := map[string]int{}  // offsets input -> this sample's bag length
	at := map[string]int64{} // offsets input -> values so far
	for range n {
		// The sample's bags first, then its inputs in order.
		for i, in := range ins {
			if in.Kind != OffsetsKind {
				continue
			}
			l := 1 + s.r.IntN(most[in.Name])
			bag[in.Name] = l
			b.Columns[i].I64 = append(b.Columns[i].I64, at[in.Name])
			at[in.Name] += int64(l)
		}
		for i, in := range ins {
			c := &b.Columns[i]
			switch {
			case in.Kind == OffsetsKind:
			case in.Offsets != "":
				s.drawJagged(c, i, in, bag[in.Offsets])
			case in.Ranges != nil:
				s.drawRanged(c, i, in)
			case in.Kind == DenseKind:
				for range in.Width {
					c.F32 = append(c.F32, s.dense())
				}
			case in.Kind == SparseKind && s.keys[i] != nil:
				k := s.keys[i]
				for range in.Width {
					if s.opts.Uniform {
						c.I64 = append(c.I64, k.at(s.r.Int64N(k.n)))
					} else {
						c.I64 = append(c.I64, k.at(s.perms[i].id(s.zipfs[i].Rank())))
					}
				}
			case in.Kind == SparseKind:
				for range in.Width {
					if s.opts.Uniform {
						c.I64 = append(c.I64, s.r.Int64N(in.Rows))
					} else {
						c.I64 = append(c.I64, s.perms[i].id(s.zipfs[i].Rank()))
					}
				}
			}
		}
	}
	for i, in := range ins {
		if in.Kind == OffsetsKind && in.LastOffset {
			b.Columns[i].I64 = append(b.Columns[i].I64, at[in.Name])
		}
	}
	return b, nil
}

// dense draws a dense feature: log(1+X), X log-normal.
func (s *Synthetic) dense() float32 {
	return float32(math.Log1p(math.Exp(1 + 1.5*s.r.NormFloat64())))
}

// drawRanged appends one sample of an input with per-value ranges: each
// id value from its own range (Zipf, or uniform), each dense value as a
// dense feature.
func (s *Synthetic) drawRanged(c *Column, i int, in InputSpec) {
	for j, r := range in.Ranges {
		var id int64
		if r.IsID() {
			if s.opts.Uniform {
				id = r.Lo + s.r.Int64N(r.Hi-r.Lo)
			} else {
				id = r.Lo + s.vperms[i][j].id(s.vzipfs[i][j].Rank())
			}
		}
		switch {
		case in.Kind == SparseKind:
			c.I64 = append(c.I64, id)
		case r.IsID():
			c.F32 = append(c.F32, float32(id))
		default:
			c.F32 = append(c.F32, s.dense())
		}
	}
}
