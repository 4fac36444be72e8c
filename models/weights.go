package models

import (
	"math"
	"math/rand/v2"
	"runtime"
	"sync"
)

// Linear is one fully connected layer, y = W x + b, with W stored
// [Out][In] row-major as torch.nn.Linear stores it.
type Linear struct {
	In, Out int
	W, B    []float32 // B is nil for a layer without bias
}

// Cross is one low-rank DCNv2 cross layer:
// x_{l+1} = x0 * (W (V x_l) + b) + x_l, with V [Rank][In] (no bias) and
// W [In][Rank] with bias.
type Cross struct {
	V Linear
	W Linear
}

// Model is a config with its weights.
type Model struct {
	Config Config
	Seed   uint64
	// Tables[k] is table k, Rows x EmbDim row-major.
	Tables [][]float32
	// FirstOrder[k] is DeepFM's per-id weight of feature k (Rows x 1).
	FirstOrder [][]float32
	// DenseLinear is DeepFM's first-order weight of the dense features.
	DenseLinear Linear
	Bottom      []Linear
	Cross       []Cross
	Top         []Linear
}

// New builds c with weights drawn from seed, deterministically: the same
// config and seed give the same bits on any machine and core count.
// Initialisation follows Meta's DLRM reference: tables uniform in
// ±sqrt(1/rows), weights normal with std sqrt(2/(in+out)), biases normal
// with std sqrt(1/out).
func New(c Config, seed uint64) (*Model, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	m := &Model{Config: c, Seed: seed}
	stream := uint64(0)
	next := func() uint64 { stream++; return stream }

	m.Tables = make([][]float32, c.NumTables())
	var jobs []func()
	for k, rows := range c.TableRows {
		t := make([]float32, rows*int64(c.EmbDim))
		m.Tables[k] = t
		s := next()
		jobs = append(jobs, uniformJobs(t, float32(math.Sqrt(1/float64(rows))), seed, s)...)
	}
	if c.Family == DeepFM {
		m.FirstOrder = make([][]float32, c.NumTables())
		for k, rows := range c.TableRows {
			t := make([]float32, rows)
			m.FirstOrder[k] = t
			jobs = append(jobs, uniformJobs(t, float32(math.Sqrt(1/float64(rows))), seed, next())...)
		}
	}
	runParallel(jobs)

	mlp := func(in int, widths []int) []Linear {
		out := make([]Linear, len(widths))
		for i, w := range widths {
			out[i] = newLinear(in, w, true, seed, next())
			in = w
		}
		return out
	}
	nt := c.NumTables()
	switch c.Family {
	case DLRM:
		m.Bottom = mlp(c.NumDense, c.Bottom)
		f := nt + 1
		m.Top = mlp(c.EmbDim+f*(f-1)/2, c.Top)
	case DCNv2:
		m.Bottom = mlp(c.NumDense, c.Bottom)
		in := (nt + 1) * c.EmbDim
		for range c.CrossLayers {
			v := newLinear(in, c.CrossRank, false, seed, next())
			w := newLinear(c.CrossRank, in, true, seed, next())
			m.Cross = append(m.Cross, Cross{V: v, W: w})
		}
		m.Top = mlp(in, c.Top)
	case DeepFM:
		m.DenseLinear = newLinear(c.NumDense, 1, true, seed, next())
		m.Top = mlp(nt*c.EmbDim+c.NumDense, c.Top)
	}
	return m, nil
}

func newLinear(in, out int, bias bool, seed, stream uint64) Linear {
	r := rand.New(rand.NewPCG(seed, stream))
	l := Linear{In: in, Out: out, W: make([]float32, in*out)}
	std := math.Sqrt(2 / float64(in+out))
	for i := range l.W {
		l.W[i] = float32(r.NormFloat64() * std)
	}
	if bias {
		l.B = make([]float32, out)
		std := math.Sqrt(1 / float64(out))
		for i := range l.B {
			l.B[i] = float32(r.NormFloat64() * std)
		}
	}
	return l
}

// uniformChunk is the unit of parallel table initialisation; each chunk
// has its own PCG stream so the result does not depend on scheduling.
const uniformChunk = 1 << 20

func uniformJobs(dst []float32, a float32, seed, stream uint64) []func() {
	var jobs []func()
	for off := 0; off < len(dst); off += uniformChunk {
		part := dst[off:min(off+uniformChunk, len(dst))]
		chunk := uint64(off / uniformChunk)
		jobs = append(jobs, func() {
			r := rand.New(rand.NewPCG(seed^0x9e3779b97f4a7c15, stream<<32|chunk))
			for i := 0; i < len(part); i += 2 {
				u := r.Uint64()
				part[i] = (float32(u>>40)/(1<<24)*2 - 1) * a
				if i+1 < len(part) {
					part[i+1] = (float32(u&(1<<24-1))/(1<<24)*2 - 1) * a
				}
			}
		})
	}
	return jobs
}

func runParallel(jobs []func()) {
	ch := make(chan func())
	var wg sync.WaitGroup
	for range runtime.GOMAXPROCS(0) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range ch {
				j()
			}
		}()
	}
	for _, j := range jobs {
		ch <- j
	}
	close(ch)
	wg.Wait()
}
