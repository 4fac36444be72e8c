package models

import (
	"fmt"
	"math"
)

// Reference scores a batch with plain Go float64 arithmetic, straight from
// the model's weights and the papers' equations, sharing no code with the
// ONNX graph builder: it is the independent check that the graphs compute
// what they claim. b must have c.Signature()'s layout.
func (m *Model) Reference(b *Batch) ([]float64, error) {
	if err := b.Check(); err != nil {
		return nil, err
	}
	c := &m.Config
	inputs := 1 + c.NumTables()
	// id is sample s's j-th id of table k.
	id := func(s, k, j int) int64 { return b.Columns[1+k].I64[s*c.Bag(k)+j] }
	if c.Packed {
		inputs = 2
		id = func(s, k, _ int) int64 { return b.Columns[1].I64[s*c.NumTables()+k] }
	}
	if len(b.Columns) != inputs {
		return nil, fmt.Errorf("reference %s: batch has %d inputs, model %d", c.Name, len(b.Columns), inputs)
	}
	out := make([]float64, b.N)
	d := c.EmbDim
	for s := range b.N {
		dense := make([]float64, c.NumDense)
		for i := range dense {
			dense[i] = float64(b.Columns[0].F32[s*c.NumDense+i])
		}
		embs := make([][]float64, c.NumTables())
		for k := range embs {
			bag := c.Bag(k)
			v := make([]float64, d)
			for j := range bag {
				id := id(s, k, j)
				row := m.Tables[k][id*int64(d) : (id+1)*int64(d)]
				for i := range v {
					v[i] += float64(row[i])
				}
			}
			embs[k] = v
		}
		var logit float64
		switch c.Family {
		case DLRM:
			x := refMLP(dense, m.Bottom, false)
			vecs := append([][]float64{x}, embs...)
			r := append([]float64(nil), x...)
			for i := range vecs {
				for j := range i {
					r = append(r, dot(vecs[i], vecs[j]))
				}
			}
			logit = refMLP(r, m.Top, true)[0]
		case DCNv2:
			x := refMLP(dense, m.Bottom, false)
			x0 := append([]float64(nil), x...)
			for _, e := range embs {
				x0 = append(x0, e...)
			}
			xl := x0
			for _, cr := range m.Cross {
				w := refLinear(refLinear(xl, cr.V), cr.W)
				next := make([]float64, len(xl))
				for i := range next {
					next[i] = x0[i]*w[i] + xl[i]
				}
				xl = next
			}
			logit = refMLP(xl, m.Top, true)[0]
		case DeepFM:
			first := refLinear(dense, m.DenseLinear)[0]
			for k := range embs {
				first += float64(m.FirstOrder[k][id(s, k, 0)])
			}
			var fm float64
			for i := range d {
				var sum, sq float64
				for _, e := range embs {
					sum += e[i]
					sq += e[i] * e[i]
				}
				fm += sum*sum - sq
			}
			var deepIn []float64
			for _, e := range embs {
				deepIn = append(deepIn, e...)
			}
			deepIn = append(deepIn, dense...)
			logit = first + 0.5*fm + refMLP(deepIn, m.Top, true)[0]
		}
		out[s] = 1 / (1 + math.Exp(-logit))
	}
	return out, nil
}

func dot(a, b []float64) float64 {
	var s float64
	for i := range a {
		s += a[i] * b[i]
	}
	return s
}

func refLinear(x []float64, l Linear) []float64 {
	y := make([]float64, l.Out)
	for o := range l.Out {
		s := 0.0
		if l.B != nil {
			s = float64(l.B[o])
		}
		w := l.W[o*l.In : (o+1)*l.In]
		for i, v := range x {
			s += float64(w[i]) * v
		}
		y[o] = s
	}
	return y
}

func refMLP(x []float64, layers []Linear, lastLinear bool) []float64 {
	for i, l := range layers {
		x = refLinear(x, l)
		if !(lastLinear && i == len(layers)-1) {
			for j := range x {
				x[j] = max(x[j], 0)
			}
		}
	}
	return x
}
