package partitioner

import (
	"math/rand/v2"
	"testing"
)

// randomProblem is a random DAG of n vertices: edges only from lower to
// higher index, random costs and pins.
func randomProblem(r *rand.Rand, n int) *problem {
	p := &problem{}
	for i := range n {
		k := free
		switch x := r.IntN(10); {
		case x == 0:
			k = pinCPU
		case x == 1 && i > 0:
			k = pinGPU
		}
		p.addVertex(r.Int64N(50), r.Int64N(50), k)
	}
	for u := range n - 1 {
		if r.IntN(4) == 0 {
			continue
		}
		var to []int
		for w := u + 1; w < n; w++ {
			if r.IntN(3) == 0 {
				to = append(to, w)
			}
		}
		if len(to) > 0 {
			p.tensors = append(p.tensors, ptensor{from: u, to: to, bytes: r.Int64N(80), stays: r.IntN(6) == 0})
		}
	}
	return p
}

// TestMinCutIsOptimal: on random small DAGs the min-cut's placement costs
// exactly the best of a brute-force search over every legal placement.
func TestMinCutIsOptimal(t *testing.T) {
	r := rand.New(rand.NewPCG(42, 7))
	for iter := range 400 {
		n := 2 + r.IntN(11)
		p := randomProblem(r, n)
		best, feasible := int64(-1), false
		for mask := 0; mask < 1<<n; mask++ {
			onCPU := make([]bool, n)
			for v := range n {
				onCPU[v] = mask&(1<<v) != 0
			}
			if c, ok := p.cost(onCPU); ok && (!feasible || c < best) {
				best, feasible = c, true
			}
		}
		onCPU, flow, err := p.solve()
		if !feasible {
			if err == nil {
				t.Fatalf("iter %d: brute force finds no legal placement, solve found one of cost %d", iter, flow)
			}
			continue
		}
		if err != nil {
			t.Fatalf("iter %d: %v (brute force best %d)", iter, err, best)
		}
		got, ok := p.cost(onCPU)
		if !ok {
			t.Fatalf("iter %d: min-cut placement is illegal", iter)
		}
		if got != best || flow != best {
			t.Fatalf("iter %d (n=%d): min-cut placement costs %d (flow %d), brute force best %d", iter, n, got, flow, best)
		}
	}
}

// TestOneUpstreamTensorInsteadOfSeveral: x (16 floats) feeds three cheap
// ops whose results the dense side needs. Sending x once and running the
// three ops on the GPU beats sending the three derived tensors.
func TestOneUpstreamTensorInsteadOfSeveral(t *testing.T) {
	p := &problem{}
	src := p.addVertex(0, 0, pinCPU) // produces x
	var cheap []int
	for range 3 {
		cheap = append(cheap, p.addVertex(1, 2, free)) // slightly cheaper on CPU
	}
	dense := p.addVertex(0, 0, pinGPU)
	p.tensors = append(p.tensors, ptensor{from: src, to: cheap, bytes: 64})
	for _, c := range cheap {
		p.tensors = append(p.tensors, ptensor{from: c, to: []int{dense}, bytes: 64})
	}
	onCPU, cost, err := p.solve()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cheap {
		if onCPU[c] {
			t.Fatalf("cheap op %d on the CPU side: the cut sends derived tensors", c)
		}
	}
	if want := int64(64 + 3*2); cost != want {
		t.Fatalf("cost %d, want %d (x once + GPU compute)", cost, want)
	}
}

func TestInfeasiblePins(t *testing.T) {
	p := &problem{}
	g := p.addVertex(0, 0, pinGPU)
	c := p.addVertex(0, 0, pinCPU)
	p.tensors = append(p.tensors, ptensor{from: g, to: []int{c}, bytes: 1})
	if _, _, err := p.solve(); err != errInfeasible {
		t.Fatalf("err = %v", err)
	}
}
