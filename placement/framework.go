package placement

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
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

// Status is the outcome of a filter on one node, or of scheduling one
// task.
type Status struct {
	Code   Code
	Reason string
	// Diagnosis is set on an Unschedulable scheduling result: which
	// filters refused how many nodes, and why.
	Diagnosis *Diagnosis
}

// OK reports Success.
func (s Status) OK() bool { return s.Code == Success }

// Refuse is the status a filter returns for a node that cannot host the
// task: Unschedulable, with the reason. The reason should not depend on
// the node (say "insufficient cpu", not "node n7 lacks 2 cores"), so that
// a Diagnosis can count nodes per reason.
func Refuse(reason string) Status { return Status{Code: Unschedulable, Reason: reason} }

// Diagnosis says why no node passed the filters, as kube-scheduler's
// FitError does.
type Diagnosis struct {
	Nodes int // nodes filtered
	// Refusals count the nodes per filter and reason, most nodes first.
	Refusals []Refusal
}

// Refusal is one filter's refusal of some nodes for one reason.
type Refusal struct {
	Plugin string
	Reason string
	Nodes  int
}

// String reads like kube-scheduler's FitError: "0/12 nodes are available:
// 8 Fit (not enough fully free GPUs), 4 Fit (insufficient cpu)".
func (d *Diagnosis) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "0/%d nodes are available", d.Nodes)
	for i, r := range d.Refusals {
		sep := ", "
		if i == 0 {
			sep = ": "
		}
		fmt.Fprintf(&b, "%s%d %s (%s)", sep, r.Nodes, r.Plugin, r.Reason)
	}
	return b.String()
}

// CycleState is what one scheduling cycle shares between plugins. Rand is
// the run's only source of randomness.
type CycleState struct {
	Rand *rand.Rand
	// Pick is the node a PreScore plugin chose, for Random; -1 if none.
	Pick int
}

// FilterPlugin rejects nodes that cannot host a task: Filter returns
// Success for a node that can, Refuse(reason) for one that cannot, and an
// Error status when the plugin or the state is broken, which ends the
// scheduling cycle.
type FilterPlugin interface {
	Name() string
	Filter(cs *CycleState, t *Task, n *NodeState) Status
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

func (FitFilter) Filter(_ *CycleState, t *Task, n *NodeState) Status {
	if r := n.Unfit(t); r != "" {
		return Refuse(r)
	}
	return Status{}
}

// Scheduler runs one policy over a cluster; it owns reusable buffers, so
// one Scheduler serves one goroutine.
type Scheduler struct {
	Policy *Policy
	// FirstTie breaks ties between the best nodes by taking the first in
	// cluster order instead of uniformly at random.
	FirstTie bool
	// NoDiagnosis skips counting refusals: an Unschedulable status then
	// says only "0/N nodes are available" and has no Diagnosis. Counting
	// costs about a quarter of a cycle when the filters are all the work
	// (BestFit on a full cluster); a caller that never reads the reason,
	// like Simulate without a Trace, sets it.
	NoDiagnosis bool
	feasible    []*NodeState
	scores      []float64
	refused     []refusal
}

// refusal counts the nodes one filter (by index in the policy) refused
// for one reason in the current cycle.
type refusal struct {
	filter int
	reason string
	nodes  int
}

// NewScheduler returns a scheduler for p.
func NewScheduler(p *Policy) *Scheduler { return &Scheduler{Policy: p} }

// Schedule picks a node and devices for t. It does not change the cluster.
func (s *Scheduler) Schedule(cs *CycleState, c *Cluster, t *Task) (node int, gpus []int, st Status) {
	s.feasible = s.feasible[:0]
	s.refused = s.refused[:0]
nodes:
	for _, n := range c.Nodes {
		for i, f := range s.Policy.Filters {
			st := f.Filter(cs, t, n)
			switch st.Code {
			case Success:
				continue
			case Unschedulable:
				if !s.NoDiagnosis {
					s.refuse(i, st.Reason)
				}
				continue nodes
			default:
				return -1, nil, Status{Code: Error, Reason: fmt.Sprintf("task %q: filter %s on node %q: %s", t.Name, f.Name(), n.Node.Name, st.Reason)}
			}
		}
		s.feasible = append(s.feasible, n)
	}
	if len(s.feasible) == 0 {
		if s.NoDiagnosis {
			return -1, nil, Status{Code: Unschedulable, Reason: fmt.Sprintf("task %q: 0/%d nodes are available", t.Name, len(c.Nodes))}
		}
		d := s.diagnosis(len(c.Nodes))
		return -1, nil, Status{Code: Unschedulable, Reason: fmt.Sprintf("task %q: %s", t.Name, d), Diagnosis: d}
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

// refuse counts one node refused by filter i for reason.
func (s *Scheduler) refuse(i int, reason string) {
	for k := range s.refused {
		if r := &s.refused[k]; r.filter == i && r.reason == reason {
			r.nodes++
			return
		}
	}
	s.refused = append(s.refused, refusal{filter: i, reason: reason, nodes: 1})
}

// diagnosis turns the cycle's refusals into a Diagnosis: most nodes
// first, then filter order, then reason.
func (s *Scheduler) diagnosis(nodes int) *Diagnosis {
	rs := slices.Clone(s.refused)
	slices.SortFunc(rs, func(a, b refusal) int {
		if a.nodes != b.nodes {
			return b.nodes - a.nodes
		}
		if a.filter != b.filter {
			return a.filter - b.filter
		}
		return strings.Compare(a.reason, b.reason)
	})
	d := &Diagnosis{Nodes: nodes, Refusals: make([]Refusal, len(rs))}
	for i, r := range rs {
		reason := r.reason
		if reason == "" {
			reason = "refused"
		}
		d.Refusals[i] = Refusal{Plugin: s.Policy.Filters[r.filter].Name(), Reason: reason, Nodes: r.nodes}
	}
	return d
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
