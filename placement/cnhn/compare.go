package cnhn

import (
	"fmt"
	"math"
	"slices"

	"github.com/prism-serve/prism/placement"
)

// Shape is a node type of an elastic pool.
type Shape struct {
	Cores  int
	GPUs   int
	RNICs  int
	MemGiB int
}

// Options are the node shapes. Prism's evaluation uses GPU nodes of 128
// cores, 8 GPUs and 4 RNICs, and CPU nodes of 128 cores and 1 RNIC; the
// trace gives no memory sizes, so memory is an assumption (flags).
type Options struct {
	GPUNode Shape
	CPUNode Shape
}

// EnsureDefaults fills Prism's evaluation shapes.
func (o *Options) EnsureDefaults() {
	if o.GPUNode == (Shape{}) {
		o.GPUNode = Shape{Cores: 128, GPUs: 8, RNICs: 4, MemGiB: 2048}
	}
	if o.CPUNode == (Shape{}) {
		o.CPUNode = Shape{Cores: 128, RNICs: 1, MemGiB: 1024}
	}
}

// Validate rejects shapes no instance fits.
func (o *Options) Validate() error {
	if o.GPUNode.Cores <= 0 || o.GPUNode.GPUs <= 0 || o.GPUNode.GPUs > placement.MaxGPUsPerNode {
		return fmt.Errorf("gpu node shape %+v: want cores > 0 and 1..%d gpus", o.GPUNode, placement.MaxGPUsPerNode)
	}
	if o.CPUNode.Cores <= 0 || o.CPUNode.GPUs != 0 {
		return fmt.Errorf("cpu node shape %+v: want cores > 0 and no gpus", o.CPUNode)
	}
	return nil
}

// Result is one deployment over the trace's lifetime.
type Result struct {
	Mode string
	// Peak nodes in use at once, per pool.
	PeakGPUNodes, PeakCPUNodes int
	// Time-averaged fragmentation: unallocated cores (GPUs) on nodes in
	// use over the cores (GPUs) of nodes in use, in percent. CPUFragPct
	// covers both pools.
	CPUFragPct, GPUFragPct float64
	// CPU fragmentation of each pool alone, in percent.
	GPUPoolCPUFragPct, CPUPoolCPUFragPct float64
	// Instances that fit no empty node of their pool, and the vCPUs and
	// the memory (GiB) capped off oversized monolithic instances.
	Unplaced     int
	CappedCores  float64
	CappedMemGiB float64
	Instances    int
}

// item is a placement unit of either deployment.
type item struct {
	task       placement.Task
	gpuPool    bool
	start, end float64
}

// Disaggregated deploys CN instances on CPU nodes and HN instances on GPU
// nodes, as the trace ran them.
func Disaggregated(trace []Instance, o Options) (*Result, error) {
	o.EnsureDefaults()
	if err := o.Validate(); err != nil {
		return nil, err
	}
	var items []item
	for _, in := range trace {
		items = append(items, item{task: toTask(in, in.CPU, in.MemGiB), gpuPool: in.Role == "HN", start: in.Start, end: in.End})
	}
	return replay("disaggregated", items, o, 0)
}

// Monolithic deploys every HN instance together with its service's CPU
// work: one GPU plus the HN's own CPU plus the service's CN vCPUs and
// memory per HN instance, averaged over the trace's lifetime. CN instances
// disappear into those. An instance larger than an empty GPU node is
// capped to the node (the capped cores and memory are reported) rather
// than dropped.
func Monolithic(trace []Instance, o Options) (*Result, error) {
	o.EnsureDefaults()
	if err := o.Validate(); err != nil {
		return nil, err
	}
	end := 0.0
	for _, in := range trace {
		if !math.IsInf(in.End, 1) {
			end = max(end, in.End)
		}
		end = max(end, in.Start)
	}
	// Lifetime weights; a trace with no time span weighs instances equally.
	life := func(in Instance) float64 {
		if end == 0 {
			return 1
		}
		return max(min(in.End, end)-in.Start, 0)
	}
	cnCPU, cnMem, hnLife := map[string]float64{}, map[string]float64{}, map[string]float64{}
	for _, in := range trace {
		if in.Role == "CN" {
			cnCPU[in.App] += in.CPU * life(in)
			cnMem[in.App] += in.MemGiB * life(in)
		} else {
			hnLife[in.App] += life(in)
		}
	}
	var items []item
	var capped, cappedMem float64
	for _, in := range trace {
		// A CPU-only service, or one whose HN instances have no lifetime
		// in the window (created and deleted at once, or at its end),
		// keeps its CN instances on CPU nodes; its HN instances carry no
		// CN work (dividing by their zero lifetime would give +Inf or NaN).
		if in.Role == "CN" {
			if hnLife[in.App] == 0 {
				items = append(items, item{task: toTask(in, in.CPU, in.MemGiB), start: in.Start, end: in.End})
			}
			continue
		}
		cpu, mem := in.CPU, in.MemGiB
		if l := hnLife[in.App]; l > 0 {
			cpu += cnCPU[in.App] / l
			mem += cnMem[in.App] / l
		}
		if c := float64(o.GPUNode.Cores); cpu > c {
			capped += cpu - c
			cpu = c
		}
		if m := float64(o.GPUNode.MemGiB); o.GPUNode.MemGiB > 0 && mem > m {
			// Cut without a word, the monolith looked as if its memory
			// fit (3.2 million GiB of the Prism trace's did not).
			cappedMem += mem - m
			mem = m
		}
		items = append(items, item{task: toTask(in, cpu, mem), gpuPool: true, start: in.Start, end: in.End})
	}
	r, err := replay("monolithic", items, o, capped)
	if err != nil {
		return nil, err
	}
	r.CappedMemGiB = cappedMem
	return r, nil
}

func toTask(in Instance, cpu, memGiB float64) placement.Task {
	t := placement.Task{
		Name:       in.Name,
		CPUMilli:   int64(math.Ceil(cpu * 1000)),
		MemMiB:     int64(math.Ceil(memGiB * 1024)),
		RNICMilli:  int64(math.Ceil(in.RDMA * 10)),
		Group:      in.App + "/" + in.Role,
		MaxPerNode: in.MaxPerNode,
	}
	if in.GPU > 0 {
		t.GPUs, t.GPUMilli = in.GPU, placement.MilliGPU
	}
	return t
}

// pool is an elastic set of identical nodes: a node opens when nothing
// open fits and closes when it empties.
type pool struct {
	shape placement.Node
	open  []*placement.NodeState
	free  []*placement.NodeState
	n     int
	peak  int
}

func (p *pool) place(t *placement.Task) (*placement.NodeState, []int, bool) {
	// Best fit over open nodes: least CPU left after placement, then
	// fewest GPUs left; the earliest opened wins ties.
	var best *placement.NodeState
	var bestKey [2]int64
	for _, s := range p.open {
		if !s.Fits(t) {
			continue
		}
		key := [2]int64{s.CPULeft - t.CPUMilli, s.GPULeftTotal() - t.TotalGPUMilli()}
		if best == nil || key[0] < bestKey[0] || (key[0] == bestKey[0] && key[1] < bestKey[1]) {
			best, bestKey = s, key
		}
	}
	if best == nil {
		var s *placement.NodeState
		if k := len(p.free); k > 0 {
			s, p.free = p.free[k-1], p.free[:k-1]
		} else {
			shape := p.shape
			shape.Name = fmt.Sprintf("%s-%d", p.shape.Name, p.n)
			s = placement.NewNodeState(&shape, p.n)
			p.n++
		}
		if !s.Fits(t) {
			p.free = append(p.free, s)
			return nil, nil, false
		}
		p.open = append(p.open, s)
		p.peak = max(p.peak, len(p.open))
		best = s
	}
	gpus := best.FirstFreeGPUs(t.GPUs)
	if err := best.Assign(t, gpus); err != nil {
		return nil, nil, false
	}
	return best, gpus, true
}

func (p *pool) release(s *placement.NodeState, t *placement.Task, gpus []int) {
	s.Release(t, gpus)
	if s.Tasks == 0 {
		i := slices.Index(p.open, s)
		p.open = slices.Delete(p.open, i, i+1)
		p.free = append(p.free, s)
	}
}

// usage sums capacity and allocation over open nodes.
func (p *pool) usage() (cores, usedCores, gpus, usedGPUs int64) {
	for _, s := range p.open {
		cores += s.Node.CPUMilli
		usedCores += s.Node.CPUMilli - s.CPULeft
		g := int64(s.Node.GPUs) * placement.MilliGPU
		gpus += g
		usedGPUs += g - s.GPULeftTotal()
	}
	return
}

func replay(mode string, items []item, o Options, capped float64) (*Result, error) {
	mk := func(name string, s Shape) *pool {
		return &pool{shape: placement.Node{Name: name, CPUMilli: int64(s.Cores) * 1000, MemMiB: int64(s.MemGiB) * 1024, GPUs: s.GPUs, Model: name, RNICs: s.RNICs}}
	}
	gp, cp := mk("gpu", o.GPUNode), mk("cpu", o.CPUNode)
	type event struct {
		t     float64
		leave bool
		i     int
	}
	var evs []event
	for i, it := range items {
		evs = append(evs, event{t: it.start, i: i})
		// An instance deleted as it is created (the trace has some) gets
		// no leave event: departures sort first at equal times, so its
		// leave would come before its arrival and it would never leave.
		// It is placed and released at once below.
		if !math.IsInf(it.end, 1) && it.end > it.start {
			evs = append(evs, event{t: it.end, leave: true, i: i})
		}
	}
	// Departures first at equal times, then trace order: deterministic.
	slices.SortStableFunc(evs, func(a, b event) int {
		if a.t != b.t {
			if a.t < b.t {
				return -1
			}
			return 1
		}
		if a.leave != b.leave {
			if a.leave {
				return -1
			}
			return 1
		}
		return a.i - b.i
	})
	type where struct {
		p    *pool
		s    *placement.NodeState
		gpus []int
	}
	placed := make([]*where, len(items))
	res := &Result{Mode: mode, CappedCores: capped, Instances: len(items)}
	var lastT, span, cpuFrag, gpuFrag, gpuPoolCPUFrag, cpuPoolCPUFrag float64
	for k, e := range evs {
		if k > 0 && e.t > lastT {
			dt := e.t - lastT
			gc, guc, gg, gug := gp.usage()
			cc, cuc, _, _ := cp.usage()
			if gc+cc > 0 {
				cpuFrag += dt * float64(gc+cc-guc-cuc) / float64(gc+cc)
			}
			if gc > 0 {
				gpuPoolCPUFrag += dt * float64(gc-guc) / float64(gc)
			}
			if cc > 0 {
				cpuPoolCPUFrag += dt * float64(cc-cuc) / float64(cc)
			}
			if gg > 0 {
				gpuFrag += dt * float64(gg-gug) / float64(gg)
			}
			span += dt
		}
		lastT = e.t
		it := &items[e.i]
		p := cp
		if it.gpuPool {
			p = gp
		}
		if e.leave {
			if w := placed[e.i]; w != nil {
				w.p.release(w.s, &it.task, w.gpus)
				placed[e.i] = nil
			}
			continue
		}
		s, gpus, ok := p.place(&it.task)
		if !ok {
			res.Unplaced++
			continue
		}
		if it.end <= it.start {
			p.release(s, &it.task, gpus)
			continue
		}
		placed[e.i] = &where{p: p, s: s, gpus: gpus}
	}
	if span > 0 {
		res.CPUFragPct = 100 * cpuFrag / span
		res.GPUFragPct = 100 * gpuFrag / span
		res.GPUPoolCPUFragPct = 100 * gpuPoolCPUFrag / span
		res.CPUPoolCPUFragPct = 100 * cpuPoolCPUFrag / span
	} else { // everything arrived at once and never left: the final state
		gc, guc, gg, gug := gp.usage()
		cc, cuc, _, _ := cp.usage()
		if gc+cc > 0 {
			res.CPUFragPct = 100 * float64(gc+cc-guc-cuc) / float64(gc+cc)
		}
		if gc > 0 {
			res.GPUPoolCPUFragPct = 100 * float64(gc-guc) / float64(gc)
		}
		if cc > 0 {
			res.CPUPoolCPUFragPct = 100 * float64(cc-cuc) / float64(cc)
		}
		if gg > 0 {
			res.GPUFragPct = 100 * float64(gg-gug) / float64(gg)
		}
	}
	res.PeakGPUNodes, res.PeakCPUNodes = gp.peak, cp.peak
	return res, nil
}
