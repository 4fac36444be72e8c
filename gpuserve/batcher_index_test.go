package gpuserve

import (
	"context"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prism-serve/prism/internal/ort"
)

// echoRunner answers each input as an output of its own (copied), so a
// request's outputs are the rows the batcher wrote for it; gate, when
// set, holds each run until it is closed.
type echoRunner struct {
	gate    chan struct{}
	entered atomic.Int32 // runs begun, counted before the gate
	mu      sync.Mutex
	runs    []int // samples per run
}

func (r *echoRunner) Run(in []ort.Input) ([][]float32, error) {
	r.entered.Add(1)
	if r.gate != nil {
		<-r.gate
	}
	r.mu.Lock()
	r.runs = append(r.runs, int(in[0].Shape[0]))
	r.mu.Unlock()
	outs := make([][]float32, len(in))
	for i, x := range in {
		outs[i] = slices.Clone(x.Float32)
	}
	return outs, nil
}

// TestBatcherGathersIndexedInputs: dictionary-encoded inputs (Request.Index)
// gathered straight into a batch of several requests, beside plain and
// context inputs, and into a batch of their own, give each request the
// rows its indices pick, bit for bit.
func TestBatcherGathersIndexedInputs(t *testing.T) {
	spec := []InputSpec{{Name: "emb", Width: 3, Shape: []int64{3}}, {Name: "x", Width: 2, Shape: []int64{2}}}
	type tc struct {
		req  Request
		want [][]float32 // per input, N rows expanded
	}
	indexed := func(n int, base float32, ctx bool) tc {
		rows := []float32{base, base + 1, base + 2, -base, float32(math.Inf(1)), float32(math.NaN())}
		index := make([]int32, n)
		var emb []float32
		for s := range index {
			index[s] = int32((s * 5) % 2)
			emb = append(emb, rows[3*index[s]:3*index[s]+3]...)
		}
		x := []float32{base, -base}
		var xs []float32
		if ctx {
			for range n {
				xs = append(xs, x...)
			}
		} else {
			x = make([]float32, 2*n)
			for i := range x {
				x[i] = base + float32(i)
			}
			xs = x
		}
		r := Request{N: n, Inputs: [][]float32{rows, x}, Index: [][]int32{index, nil}}
		if ctx {
			r.Context = []bool{false, true}
		}
		return tc{r, [][]float32{emb, xs}}
	}
	plain := func(n int, base float32) tc {
		emb := make([]float32, 3*n)
		x := make([]float32, 2*n)
		for i := range emb {
			emb[i] = base + float32(i)
		}
		for i := range x {
			x[i] = -base - float32(i)
		}
		return tc{Request{N: n, Inputs: [][]float32{emb, x}}, [][]float32{emb, x}}
	}
	check := func(t *testing.T, c tc, out [][]float32) {
		t.Helper()
		for i, w := range c.want {
			if len(out[i]) != len(w) {
				t.Fatalf("input %d: %d values, want %d", i, len(out[i]), len(w))
			}
			for j := range w {
				if math.Float32bits(out[i][j]) != math.Float32bits(w[j]) {
					t.Fatalf("input %d: value %d is %v, want %v", i, j, out[i][j], w[j])
				}
			}
		}
	}

	t.Run("alone", func(t *testing.T) {
		r := &echoRunner{}
		b := NewBatcher(spec, []Runner{r}, BatchOptions{MaxDelay: time.Microsecond})
		defer b.Close()
		c := indexed(7, 10, false)
		out, err := b.Submit(context.Background(), c.req)
		if err != nil {
			t.Fatal(err)
		}
		check(t, c, out)
	})
	t.Run("several requests", func(t *testing.T) {
		r := &echoRunner{gate: make(chan struct{})}
		b := NewBatcher(spec, []Runner{r}, BatchOptions{MaxBatch: 1024, MaxDelay: time.Microsecond})
		defer b.Close()
		// A first request holds the runner, so the others queue and go
		// together in the next batch.
		first := make(chan error, 1)
		go func() { _, err := b.Submit(context.Background(), plain(1, 0).req); first <- err }()
		// Its run has begun (the runner holds it at the gate): queued
		// only, it could go in one batch with the ones below.
		for r.entered.Load() < 1 {
			time.Sleep(time.Millisecond)
		}
		cases := []tc{indexed(5, 100, false), plain(3, 200), indexed(4, 300, true), indexed(6, 400, false)}
		var wg sync.WaitGroup
		outs := make([][][]float32, len(cases))
		errs := make([]error, len(cases))
		for k, c := range cases {
			wg.Add(1)
			go func() { defer wg.Done(); outs[k], errs[k] = b.Submit(context.Background(), c.req) }()
		}
		for b.QueueDepth() < 1+5+3+4+6 {
			time.Sleep(time.Millisecond)
		}
		close(r.gate)
		wg.Wait()
		if err := <-first; err != nil {
			t.Fatal(err)
		}
		for k, c := range cases {
			if errs[k] != nil {
				t.Fatal(errs[k])
			}
			check(t, c, outs[k])
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		if !slices.Equal(r.runs, []int{1, 18}) {
			t.Errorf("runs of %v samples, want [1 18]: the four requests in one batch", r.runs)
		}
	})
	t.Run("refused", func(t *testing.T) {
		b := NewBatcher(spec, []Runner{&echoRunner{}}, BatchOptions{MaxDelay: time.Microsecond})
		defer b.Close()
		for name, mut := range map[string]func(*Request){
			"index past the rows": func(r *Request) { r.Index[0][2] = 2 },
			"negative index":      func(r *Request) { r.Index[0][0] = -1 },
			"short index":         func(r *Request) { r.Index[0] = r.Index[0][:3] },
			"ragged rows":         func(r *Request) { r.Inputs[0] = r.Inputs[0][:5] },
			"indexed context":     func(r *Request) { r.Context = []bool{true, false} },
			"indices of 1 input":  func(r *Request) { r.Index = r.Index[:1] },
		} {
			c := indexed(4, 1, false)
			mut(&c.req)
			if _, err := b.Submit(context.Background(), c.req); err == nil {
				t.Errorf("%s: accepted", name)
			}
		}
	})
}
