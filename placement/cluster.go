package placement

import (
	"fmt"
	"slices"
)

// MilliGPU is one whole GPU in the unit tasks and nodes use for GPU shares.
const MilliGPU = 1000

// MaxGPUsPerNode bounds the GPUs of one node; the fixed-size arrays in the
// hot path depend on it.
const MaxGPUsPerNode = 16

// Node is the static description of one machine.
type Node struct {
	Name     string
	CPUMilli int64 // allocatable CPU in milli-cores
	MemMiB   int64 // allocatable memory in MiB; 0 means unchecked
	GPUs     int   // number of GPUs
	Model    string
	RNICs    int // RDMA NICs; 0 means the node has none (tasks asking RNIC share cannot go there)
}

// Task is one instance to place.
type Task struct {
	Name     string
	CPUMilli int64
	MemMiB   int64
	// GPUs is the number of GPUs; with GPUMilli < 1000 it must be 1 (a
	// fraction of one GPU).
	GPUs     int
	GPUMilli int64 // per-GPU share in milli-GPU, 1000 for whole GPUs
	// Models lists GPU models the task accepts; empty means any.
	Models []string
	// RNICMilli is the share of one RNIC in milli-RNIC (Prism's rdma_request
	// of 25% is 250); 0 means none.
	RNICMilli int64
	// Group and MaxPerNode cap the instances of one service on a node
	// (Prism's max_instance_per_node); MaxPerNode 0 means no cap.
	Group      string
	MaxPerNode int
}

// TotalGPUMilli is the task's GPU demand in milli-GPU.
func (t *Task) TotalGPUMilli() int64 { return int64(t.GPUs) * t.GPUMilli }

// IsShare reports whether the task asks for a fraction of one GPU.
func (t *Task) IsShare() bool { return t.GPUs == 1 && t.GPUMilli < MilliGPU }

// Validate reports a task the cluster model cannot represent.
func (t *Task) Validate() error {
	switch {
	case t.CPUMilli < 0 || t.MemMiB < 0 || t.RNICMilli < 0:
		return fmt.Errorf("task %q: negative request", t.Name)
	case t.GPUs < 0 || t.GPUs > MaxGPUsPerNode:
		return fmt.Errorf("task %q: gpu count %d out of range [0,%d]", t.Name, t.GPUs, MaxGPUsPerNode)
	case t.GPUs == 0 && t.GPUMilli != 0:
		return fmt.Errorf("task %q: gpu_milli %d without gpus", t.Name, t.GPUMilli)
	case t.GPUs > 0 && (t.GPUMilli <= 0 || t.GPUMilli > MilliGPU):
		return fmt.Errorf("task %q: gpu_milli %d out of range (0,1000]", t.Name, t.GPUMilli)
	case t.GPUs > 1 && t.GPUMilli != MilliGPU:
		return fmt.Errorf("task %q: %d gpus must be whole gpus, got gpu_milli %d", t.Name, t.GPUs, t.GPUMilli)
	}
	return nil
}

// Accepts reports whether a node of this GPU model satisfies the task's
// model constraint.
func (t *Task) Accepts(model string) bool {
	return len(t.Models) == 0 || slices.Contains(t.Models, model)
}

// NodeState is a node with what is left of it. The simulator owns it;
// plugins read it and must not change it.
type NodeState struct {
	Node     *Node
	Index    int
	CPULeft  int64
	MemLeft  int64
	RNICLeft int64 // milli-RNIC
	GPULeft  [MaxGPUsPerNode]int64
	// Affinity counts placed GPU tasks by shape tag ("share", "1-gpu",
	// "2-gpu", ...), for GpuClustering.
	Affinity map[string]int
	// Groups counts placed instances per task group, for MaxPerNode.
	Groups map[string]int
	Tasks  int

	// version changes whenever the state changes; plugins key caches on it.
	version uint64
}

// NewNodeState returns the empty state of n.
func NewNodeState(n *Node, index int) *NodeState {
	s := &NodeState{Node: n, Index: index, CPULeft: n.CPUMilli, MemLeft: n.MemMiB, RNICLeft: int64(n.RNICs) * 1000}
	for i := 0; i < n.GPUs; i++ {
		s.GPULeft[i] = MilliGPU
	}
	return s
}

// Version identifies the state's contents for caches: it changes on every
// Assign and Release.
func (s *NodeState) Version() uint64 { return s.version }

// GPUs returns the per-GPU free milli, indexed by device.
func (s *NodeState) GPUs() []int64 { return s.GPULeft[:s.Node.GPUs] }

// GPULeftTotal is the free GPU capacity of the node in milli-GPU.
func (s *NodeState) GPULeftTotal() int64 {
	var t int64
	for _, g := range s.GPUs() {
		t += g
	}
	return t
}

// FullyFreeGPUs counts the GPUs nobody uses.
func (s *NodeState) FullyFreeGPUs() int {
	n := 0
	for _, g := range s.GPUs() {
		if g == MilliGPU {
			n++
		}
	}
	return n
}

// AffinityTag names a task's GPU shape for GpuClustering; "" for CPU tasks.
func AffinityTag(t *Task) string {
	switch {
	case t.GPUs == 0:
		return ""
	case t.IsShare():
		return "share"
	default:
		return fmt.Sprintf("%d-gpu", t.GPUs)
	}
}

// Assignment is where a task went: a node and, for GPU tasks, the devices.
type Assignment struct {
	Node    int
	GPUs    []int
	Task    *Task
	Ordinal int // position of the task in the run, for Release bookkeeping
}

// Fits reports whether the task's scalar requests fit the node (CPU,
// memory, RNIC, per-node cap) and whether the GPUs could host it; it is the
// default filter.
func (s *NodeState) Fits(t *Task) bool { return s.Unfit(t) == "" }

// Reasons Unfit gives, in the order it checks; they read after a node
// count, as kube-scheduler's do ("3 insufficient cpu").
const (
	ReasonCPU       = "insufficient cpu"
	ReasonMemory    = "insufficient memory"
	ReasonRNIC      = "insufficient RNIC share"
	ReasonPerNode   = "per-node instance cap of the task's group reached"
	ReasonNoGPU     = "no GPU on the node"
	ReasonGPUModel  = "GPU model not accepted by the task"
	ReasonGPUShare  = "no GPU with enough free share"
	ReasonWholeGPUs = "not enough fully free GPUs"
)

// Unfit is Fits with the first reason the node cannot host the task; ""
// when it can. The reasons are the Reason constants, so callers may count
// them without allocating.
func (s *NodeState) Unfit(t *Task) string {
	if t.CPUMilli > s.CPULeft {
		return ReasonCPU
	}
	if s.Node.MemMiB > 0 && t.MemMiB > s.MemLeft {
		return ReasonMemory
	}
	if t.RNICMilli > 0 && t.RNICMilli > s.RNICLeft {
		return ReasonRNIC
	}
	if t.MaxPerNode > 0 && s.Groups[t.Group] >= t.MaxPerNode {
		return ReasonPerNode
	}
	if t.GPUs == 0 {
		return ""
	}
	if s.Node.GPUs == 0 {
		return ReasonNoGPU
	}
	if !t.Accepts(s.Node.Model) {
		return ReasonGPUModel
	}
	if t.IsShare() {
		for _, g := range s.GPUs() {
			if g >= t.GPUMilli {
				return ""
			}
		}
		return ReasonGPUShare
	}
	if s.FullyFreeGPUs() < t.GPUs {
		return ReasonWholeGPUs
	}
	return ""
}

// FirstFreeGPUs picks n fully free GPUs in device order, as the reference
// simulator's exclusive allocation does.
func (s *NodeState) FirstFreeGPUs(n int) []int {
	out := make([]int, 0, n)
	for i, g := range s.GPUs() {
		if len(out) == n {
			break
		}
		if g == MilliGPU {
			out = append(out, i)
		}
	}
	if len(out) < n {
		return nil
	}
	return out
}

// BestFitGPU returns the GPU with the least free share that still holds
// milli, the first such in device order; -1 if none.
func (s *NodeState) BestFitGPU(milli int64) int {
	best := -1
	for i, g := range s.GPUs() {
		if g >= milli && (best < 0 || g < s.GPULeft[best]) {
			best = i
		}
	}
	return best
}

// Assign places t on the given GPUs. It checks everything and returns an
// error instead of corrupting the state.
func (s *NodeState) Assign(t *Task, gpus []int) error {
	if !s.Fits(t) {
		return fmt.Errorf("task %q does not fit node %q", t.Name, s.Node.Name)
	}
	if len(gpus) != t.GPUs {
		return fmt.Errorf("task %q: %d gpus chosen, %d requested", t.Name, len(gpus), t.GPUs)
	}
	for i, g := range gpus {
		if g < 0 || g >= s.Node.GPUs || s.GPULeft[g] < t.GPUMilli {
			return fmt.Errorf("task %q: gpu %d of node %q cannot hold %d milli", t.Name, g, s.Node.Name, t.GPUMilli)
		}
		// A device named twice would be charged twice, below zero.
		if slices.Contains(gpus[:i], g) {
			return fmt.Errorf("task %q: gpu %d of node %q chosen twice", t.Name, g, s.Node.Name)
		}
	}
	for _, g := range gpus {
		s.GPULeft[g] -= t.GPUMilli
	}
	s.CPULeft -= t.CPUMilli
	if s.Node.MemMiB > 0 {
		s.MemLeft -= t.MemMiB
	}
	s.RNICLeft -= t.RNICMilli
	if tag := AffinityTag(t); tag != "" {
		if s.Affinity == nil {
			s.Affinity = map[string]int{}
		}
		s.Affinity[tag]++
	}
	if t.Group != "" {
		if s.Groups == nil {
			s.Groups = map[string]int{}
		}
		s.Groups[t.Group]++
	}
	s.Tasks++
	s.version++
	return nil
}

// Release undoes Assign.
func (s *NodeState) Release(t *Task, gpus []int) {
	for _, g := range gpus {
		s.GPULeft[g] += t.GPUMilli
	}
	s.CPULeft += t.CPUMilli
	if s.Node.MemMiB > 0 {
		s.MemLeft += t.MemMiB
	}
	s.RNICLeft += t.RNICMilli
	if tag := AffinityTag(t); tag != "" {
		if s.Affinity[tag]--; s.Affinity[tag] == 0 {
			delete(s.Affinity, tag)
		}
	}
	if t.Group != "" {
		if s.Groups[t.Group]--; s.Groups[t.Group] == 0 {
			delete(s.Groups, t.Group)
		}
	}
	s.Tasks--
	s.version++
}

// Cluster is the mutable state of all nodes.
type Cluster struct {
	Nodes []*NodeState
	// GPUMilliTotal and GPUMilliUsed are kept up to date by Place/Remove.
	GPUMilliTotal int64
	GPUMilliUsed  int64
	CPUMilliTotal int64
	CPUMilliUsed  int64
}

// NewCluster returns an empty cluster of the given nodes.
func NewCluster(nodes []Node) *Cluster {
	c := &Cluster{}
	for i := range nodes {
		c.Nodes = append(c.Nodes, NewNodeState(&nodes[i], i))
		c.GPUMilliTotal += int64(nodes[i].GPUs) * MilliGPU
		c.CPUMilliTotal += nodes[i].CPUMilli
	}
	return c
}

// Place assigns t to node n on the given GPUs.
func (c *Cluster) Place(t *Task, n int, gpus []int) error {
	if err := c.Nodes[n].Assign(t, gpus); err != nil {
		return err
	}
	c.GPUMilliUsed += t.TotalGPUMilli()
	c.CPUMilliUsed += t.CPUMilli
	return nil
}

// GPUAllocRatio is the allocated share of the cluster's GPU capacity.
func (c *Cluster) GPUAllocRatio() float64 {
	if c.GPUMilliTotal == 0 {
		return 0
	}
	return float64(c.GPUMilliUsed) / float64(c.GPUMilliTotal)
}
