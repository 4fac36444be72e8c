package placement

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
)

// SimOptions configures one simulation run.
type SimOptions struct {
	Seed uint64
	// Inflation is the GPU demand the task list is grown to, as a multiple
	// of the cluster's GPU capacity (1.3 in the paper); <= 0 keeps the
	// trace as is.
	Inflation float64
	// NoShuffle keeps trace order (the paper's runs shuffle).
	NoShuffle bool
	// Coverage is the share of tasks the target workload's shapes must
	// cover. The default 0.95 is what the reference's run scripts pass
	// (generate_config_and_run.py --pod-popularity-threshold 95); the
	// simulator's own Go default, and the paper's prose, say 0.6.
	Coverage float64
	// TieBreak is how ties between best nodes are broken: "first" (the
	// first node in a seeded random node order, the default) or "random"
	// (uniform, as kube-scheduler's selectHost documents). The reference
	// renames its nodes with a seeded random permutation prefix, and only
	// "first" reproduces its figures: with uniform ties the packing
	// policies lose about 3 points and FGD about 5, because ties between
	// equally scored empty and partly used nodes stop favouring the same
	// nodes again and again.
	TieBreak string
	// Progress, if set, is called every ProgressEvery tasks.
	Progress      func(done, total int)
	ProgressEvery int
	// Trace, if set, sees every decision (node -1 when the task failed).
	Trace func(t *Task, node int, gpus []int, st Status)
}

// EnsureDefaults fills unset options with the paper's settings.
func (o *SimOptions) EnsureDefaults() {
	if o.Inflation == 0 {
		o.Inflation = 1.3
	}
	if o.Coverage == 0 {
		o.Coverage = 0.95
	}
	if o.TieBreak == "" {
		o.TieBreak = "first"
	}
	if o.ProgressEvery == 0 {
		o.ProgressEvery = 1000
	}
}

// Validate rejects options no run can use.
func (o *SimOptions) Validate() error {
	if !(o.Coverage > 0 && o.Coverage <= 1) { // NaN too
		return fmt.Errorf("coverage %v outside (0,1]", o.Coverage)
	}
	if math.IsNaN(o.Inflation) {
		// Every comparison with NaN is false: the run would silently
		// keep the trace as is, as for inflation <= 0.
		return fmt.Errorf("inflation %v is not a number", o.Inflation)
	}
	if o.TieBreak != "first" && o.TieBreak != "random" {
		return fmt.Errorf("tie break %q, want first or random", o.TieBreak)
	}
	if o.Inflation > 10 {
		return fmt.Errorf("inflation %v above 10x capacity", o.Inflation)
	}
	return nil
}

// Point is the cluster at one arrived-load step.
type Point struct {
	ArrivedPct int     // arrived GPU demand, percent of capacity
	AllocPct   float64 // allocated GPU, percent of capacity
	FragPct    float64 // FGD fragmentation, percent of capacity
	// FragRatioPct is fragmentation over idle GPU capacity.
	FragRatioPct float64
	// Tasks and Failed count the tasks arrived so far and those of them
	// that found no node.
	Tasks, Failed int
}

// SimResult is the outcome of one run.
type SimResult struct {
	Policy string
	Seed   uint64
	Tasks  int // after inflation
	Placed int
	Failed int
	// FailedGPUMilli is the GPU demand of tasks that found no node.
	FailedGPUMilli int64
	// Curve has one point per whole percent of arrived load, from 0 up.
	Curve []Point
}

// AllocAt returns the allocation at the given arrived percent, or the last
// point if the run stopped short.
func (r *SimResult) AllocAt(pct int) float64 {
	if len(r.Curve) == 0 {
		return 0
	}
	if pct < len(r.Curve) {
		return r.Curve[pct].AllocPct
	}
	return r.Curve[len(r.Curve)-1].AllocPct
}

// FragAt is AllocAt for fragmentation.
func (r *SimResult) FragAt(pct int) float64 {
	if len(r.Curve) == 0 {
		return 0
	}
	if pct < len(r.Curve) {
		return r.Curve[pct].FragPct
	}
	return r.Curve[len(r.Curve)-1].FragPct
}

// FailedAt is AllocAt for the tasks that found no node, in percent of the
// tasks arrived by then.
func (r *SimResult) FailedAt(pct int) float64 {
	if len(r.Curve) == 0 {
		return 0
	}
	p := r.Curve[len(r.Curve)-1]
	if pct < len(r.Curve) {
		p = r.Curve[pct]
	}
	if p.Tasks == 0 {
		return 0
	}
	return 100 * float64(p.Failed) / float64(p.Tasks)
}

// NewRand returns the run's random source for a seed.
func NewRand(seed uint64) *rand.Rand {
	return rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15^seed))
}

// Workload builds the task list of a run: the trace, plus tasks drawn
// with replacement from it until the next draw would push GPU demand past
// inflation x capacity, all shuffled with the same random source. A trace
// with no GPU demand cannot grow GPU demand and is kept as is.
func Workload(rng *rand.Rand, tasks []Task, capacityMilli int64, inflation float64, shuffle bool) []*Task {
	out := make([]*Task, 0, len(tasks)*2)
	var demand int64
	for i := range tasks {
		out = append(out, &tasks[i])
		demand += tasks[i].TotalGPUMilli()
	}
	if inflation > 0 && demand > 0 {
		target := int64(inflation * float64(capacityMilli))
		for demand < target {
			t := &tasks[rng.IntN(len(tasks))]
			if demand+t.TotalGPUMilli() > target {
				break
			}
			out = append(out, t)
			demand += t.TotalGPUMilli()
		}
	}
	if shuffle {
		rng.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	}
	return out
}

// Simulate places the workload of one seed with one policy, task by task,
// none leaving, and records allocation and fragmentation against arrived
// load. It is deterministic in (nodes, tasks, policy, options).
func Simulate(nodes []Node, tasks []Task, policy string, reg *Registry, opts SimOptions) (*SimResult, error) {
	opts.EnsureDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if len(nodes) == 0 || len(tasks) == 0 {
		return nil, fmt.Errorf("simulate: %d nodes, %d tasks", len(nodes), len(tasks))
	}
	w := NewTargetWorkload(tasks, opts.Coverage)
	p, err := reg.New(policy, PolicyOptions{Workload: w})
	if err != nil {
		return nil, err
	}
	rng, order, list := runSetup(nodes, tasks, &opts)
	c := NewCluster(order)
	if c.GPUMilliTotal == 0 {
		return nil, fmt.Errorf("simulate: cluster has no GPUs")
	}
	res := &SimResult{Policy: p.Name, Seed: opts.Seed, Tasks: len(list)}

	// Per-node fragmentation, updated only where a task lands.
	nodeFrag := make([]float64, len(c.Nodes))
	var frag float64
	for i, n := range c.Nodes {
		nodeFrag[i] = NodeFrag(n, w)
		frag += nodeFrag[i]
	}
	record := func(pct int) {
		idle := float64(c.GPUMilliTotal - c.GPUMilliUsed)
		pt := Point{
			ArrivedPct: pct,
			AllocPct:   100 * c.GPUAllocRatio(),
			FragPct:    100 * frag / float64(c.GPUMilliTotal),
			Tasks:      res.Placed + res.Failed,
			Failed:     res.Failed,
		}
		if idle > 0 {
			pt.FragRatioPct = 100 * frag / idle
		}
		res.Curve = append(res.Curve, pt)
	}
	record(0)
	sched := NewScheduler(p)
	sched.FirstTie = opts.TieBreak == "first"
	// Only a Trace reads why a task found no node.
	sched.NoDiagnosis = opts.Trace == nil
	cs := &CycleState{Rand: rng}
	var arrived int64
	for i, t := range list {
		node, gpus, st := sched.Schedule(cs, c, t)
		switch st.Code {
		case Success:
			if err := c.Place(t, node, gpus); err != nil {
				return nil, fmt.Errorf("simulate %s seed %d task %d: %w", p.Name, opts.Seed, i, err)
			}
			res.Placed++
			nf := NodeFrag(c.Nodes[node], w)
			frag += nf - nodeFrag[node]
			nodeFrag[node] = nf
		case Unschedulable:
			res.Failed++
			res.FailedGPUMilli += t.TotalGPUMilli()
		default:
			return nil, fmt.Errorf("simulate %s seed %d task %d: %s", p.Name, opts.Seed, i, st.Reason)
		}
		if opts.Trace != nil {
			opts.Trace(t, node, gpus, st)
		}
		arrived += t.TotalGPUMilli()
		for pct := int(arrived * 100 / c.GPUMilliTotal); len(res.Curve) <= pct; {
			record(len(res.Curve))
		}
		if opts.Progress != nil && (i+1)%opts.ProgressEvery == 0 {
			opts.Progress(i+1, len(list))
		}
	}
	return res, nil
}

// runSetup draws a run's node order and task list from its seed; the
// returned source goes on to break ties. AllocBound replays it to see the
// same list as Simulate.
func runSetup(nodes []Node, tasks []Task, opts *SimOptions) (*rand.Rand, []Node, []*Task) {
	rng := NewRand(opts.Seed)
	order := slices.Clone(nodes)
	if opts.TieBreak == "first" {
		rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
	}
	var capacity int64
	for i := range order {
		capacity += int64(order[i].GPUs) * MilliGPU
	}
	return rng, order, Workload(rng, tasks, capacity, opts.Inflation, !opts.NoShuffle)
}
