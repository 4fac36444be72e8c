package partitioner

import (
	"errors"
	"math"
)

// pin fixes a vertex to a side.
type pin uint8

const (
	free pin = iota
	pinCPU
	pinGPU
)

// problem is the placement problem without ONNX: vertices with a cost on
// each side, and tensors that a producer sends to its consumers. Data may
// only flow CPU -> GPU (the embedding tier feeds the dense tier, never the
// reverse). solve finds the placement of least total cost exactly.
type problem struct {
	cpu, gpu []int64 // cost of each vertex on each side
	pins     []pin
	tensors  []ptensor
}

// ptensor is a tensor produced by vertex from and read by vertices to;
// it costs bytes once when it crosses from the CPU side to the GPU side.
// stays: it may not cross at all (the tiers cannot send it).
type ptensor struct {
	from  int
	to    []int
	bytes int64
	stays bool
}

func (p *problem) addVertex(cpu, gpu int64, k pin) int {
	p.cpu = append(p.cpu, cpu)
	p.gpu = append(p.gpu, gpu)
	p.pins = append(p.pins, k)
	return len(p.cpu) - 1
}

// errInfeasible: the pins force data to flow from the GPU side back to
// the CPU side, or a tensor that may not cross to cross.
var errInfeasible = errors.New("no placement satisfies the pins: a node pinned to the dense side feeds one pinned to the CPU side, or one pinned to the CPU side feeds the dense side a tensor the tiers cannot send (not float32 with the batch first)")

// solve returns onCPU per vertex and the total cost, by a minimum s-t
// cut. Source side = CPU. Edges: s->v costs v's GPU time (cut when v is on
// the GPU side), v->t costs its CPU time; a tensor gets an auxiliary
// vertex a with u->a of its bytes and a->w infinite for each reader w, so
// it is paid once however many readers sit across the cut; w->u infinite
// forbids a reader on the CPU side of a GPU producer.
func (p *problem) solve() ([]bool, int64, error) {
	n := len(p.cpu)
	var finite int64
	for i := range n {
		finite = addSat(finite, p.cpu[i])
		finite = addSat(finite, p.gpu[i])
	}
	for _, t := range p.tensors {
		finite = addSat(finite, t.bytes)
	}
	if finite >= math.MaxInt64/4 {
		return nil, 0, ErrCostsTooLarge
	}
	inf := finite + 1
	net := newFlowNet(n + 2)
	s, t := n, n+1
	for v := range n {
		gpu, cpu := p.gpu[v], p.cpu[v]
		switch p.pins[v] {
		case pinCPU:
			gpu = inf
		case pinGPU:
			cpu = inf
		}
		if gpu > 0 {
			net.addEdge(s, v, gpu)
		}
		if cpu > 0 {
			net.addEdge(v, t, cpu)
		}
	}
	for _, tn := range p.tensors {
		a := net.addNode()
		if tn.stays {
			net.addEdge(tn.from, a, inf)
		} else {
			net.addEdge(tn.from, a, tn.bytes)
		}
		for _, w := range tn.to {
			net.addEdge(a, w, inf)
			net.addEdge(w, tn.from, inf)
		}
	}
	flow := net.maxFlow(s, t)
	if flow >= inf {
		return nil, 0, errInfeasible
	}
	reach := net.sourceSide(s)
	onCPU := make([]bool, n)
	for v := range n {
		onCPU[v] = reach[v]
	}
	return onCPU, flow, nil
}

// cost evaluates a placement directly (the tests check solve against it
// by brute force). ok is false when the placement breaks a pin or sends
// data from the GPU side to the CPU side.
func (p *problem) cost(onCPU []bool) (int64, bool) {
	var c int64
	for v := range p.cpu {
		switch {
		case p.pins[v] == pinCPU && !onCPU[v], p.pins[v] == pinGPU && onCPU[v]:
			return 0, false
		case onCPU[v]:
			c += p.cpu[v]
		default:
			c += p.gpu[v]
		}
	}
	for _, t := range p.tensors {
		crosses := false
		for _, w := range t.to {
			if !onCPU[t.from] && onCPU[w] {
				return 0, false
			}
			if onCPU[t.from] && !onCPU[w] {
				crosses = true
			}
		}
		if crosses && t.stays {
			return 0, false
		}
		if crosses {
			c += t.bytes
		}
	}
	return c, true
}

func addSat(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}
