package placement

import (
	"fmt"
	"math/rand/v2"
)

// Code tells "cannot place" apart from "broken", as the Kubernetes
// scheduler framework's status codes do.
type Code int

const (
	// Success: the task has a node.
	Success Code = iota
	// Unschedulable: no node passes the filters; the cluster is full for
	// this task, nothing is wrong.
	Unschedulable
	// Error: a plugin or the state is broken.
	Error
)

func (c Code) String() string {
	switch c {
	case Success:
		return "Success"
	case Unschedulable:
		return "Unschedulable"
	case Error:
		return "Error"
	}
	return fmt.Sprintf("Code(%d)", int(c))
}

// Status is the outcome of scheduling one task.
type Status struct {
	Code   Code
	Reason string
}

// OK reports Success.
func (s Status) OK() bool { return s.Code == Success }

// CycleState is what one scheduling cycle shares between plugins. Rand is
// the run's only source of randomness.
type CycleState struct {
	Rand *rand.Rand
	// Pick is the node a PreScore plugin chose, for Random; -1 if none.
	Pick int
}

// FilterPlugin rejects nodes that cannot host a task.
type FilterPlugin interface {
	Name() string
	Filter(cs *CycleState, t *Task, n *NodeState) bool
}

// ScorePlugin ranks the nodes that passed the filters; higher is better.
// The reference policies return whole numbers in [0,100], as Kubernetes
// score plugins do, which makes ties (broken at random) part of the
// method.
type ScorePlugin interface {
	Name() string
	Score(cs *CycleState, t *Task, n *NodeState) float64
}

// PreScorePlugin sees the feasible nodes before scoring.
type PreScorePlugin interface {
	PreScore(cs *CycleState, t *Task, feasible []*NodeState)
}

// NormalizePlugin rescales the scores of all feasible nodes in place.
type NormalizePlugin interface {
	Normalize(scores []float64)
}

// GPUChooser picks the devices of the chosen node for a task. A score
// plugin that implements it (FGD) chooses its own devices; other policies
// use the policy's GPUSelect.
type GPUChooser interface {
	ChooseGPUs(cs *CycleState, t *Task, n *NodeState) []int
}

// GPUSelect is a device selection method: "best" (least free share that
// fits) or "random" for fractional tasks; whole-GPU tasks always take the
// first free devices.
type GPUSelect string

const (
	SelectBest   GPUSelect = "best"
	SelectRandom GPUSelect = "random"
)

// Policy is a scheduler profile: filters, one score plugin, and a GPU
// selection method.
type Policy struct {
	Name    string
	Filters []FilterPlugin
	Score   ScorePlugin
	GPUSel  GPUSelect
}

// FitFilter is the default filter: CPU, memory, RNIC, per-node instance
// cap, GPU model and GPU capacity.
type FitFilter struct{}

var _ FilterPlugin = FitFilter{}

func (FitFilter) Name() string { return "Fit" }

func (FitFilter) Filter(_ *CycleState, t *Task, n *NodeState) bool { return n.Fits(t) }

// Scheduler runs one policy over a cluster; it owns reusable buffers, so
// one Scheduler serves one goroutine.
type Scheduler struct {
	Policy *Policy
	// FirstTie breaks ties between the best nodes by taking the first in
	// cluster order instead of uniformly at random.
	FirstTie bool
	feasible []*NodeState
	scores   []float64
}

// NewScheduler returns a scheduler for p.
func NewScheduler(p *Policy) *Scheduler { return &Scheduler{Policy: p} }

// Schedule picks a node and devices for t. It does not change the cluster.
func (s *Scheduler) Schedule(cs *CycleState, c *Cluster, t *Task) (node int, gpus []int, st Status) {
	s.feasible = s.feasible[:0]
	for _, n := range c.Nodes {
		ok := true
		for _, f := range s.Policy.Filters {
			if !f.Filter(cs, t, n) {
				ok = false
				break
			}
		}
		if ok {
			s.feasible = append(s.feasible, n)
		}
	}
	if len(s.feasible) == 0 {
		return -1, nil, Status{Code: Unschedulable, Reason: fmt.Sprintf("task %q: no node fits", t.Name)}
	}
	cs.Pick = -1
	if ps, ok := s.Policy.Score.(PreScorePlugin); ok {
		ps.PreScore(cs, t, s.feasible)
	}
	s.scores = s.scores[:0]
	for _, n := range s.feasible {
		s.scores = append(s.scores, s.Policy.Score.Score(cs, t, n))
	}
	if np, ok := s.Policy.Score.(NormalizePlugin); ok {
		np.Normalize(s.scores)
	}
	// Reservoir sampling over the best scores: every tied node is equally
	// likely, as in kube-scheduler's selectHost.
	best, cnt := 0, 1
	for i := 1; i < len(s.scores); i++ {
		switch {
		case s.scores[i] > s.scores[best]:
			best, cnt = i, 1
		case s.scores[i] == s.scores[best] && !s.FirstTie:
			cnt++
			if cs.Rand.IntN(cnt) == 0 {
				best = i
			}
		}
	}
	n := s.feasible[best]
	if t.GPUs == 0 {
		return n.Index, nil, Status{Code: Success}
	}
	if ch, ok := s.Policy.Score.(GPUChooser); ok {
		gpus = ch.ChooseGPUs(cs, t, n)
	} else {
		gpus = SelectGPUs(cs, s.Policy.GPUSel, t, n)
	}
	if len(gpus) != t.GPUs {
		return -1, nil, Status{Code: Error, Reason: fmt.Sprintf("task %q: policy %s chose %d gpus on node %q, want %d", t.Name, s.Policy.Name, len(gpus), n.Node.Name, t.GPUs)}
	}
	return n.Index, gpus, Status{Code: Success}
}

// SelectGPUs applies a device selection method.
func SelectGPUs(cs *CycleState, sel GPUSelect, t *Task, n *NodeState) []int {
	if !t.IsShare() {
		return n.FirstFreeGPUs(t.GPUs)
	}
	switch sel {
	case SelectRandom:
		pick, cnt := -1, 0
		for i, g := range n.GPUs() {
			if g >= t.GPUMilli {
				cnt++
				if cs.Rand.IntN(cnt) == 0 {
					pick = i
				}
			}
		}
		if pick < 0 {
			return nil
		}
		return []int{pick}
	default:
		if g := n.BestFitGPU(t.GPUMilli); g >= 0 {
			return []int{g}
		}
		return nil
	}
}
