package placement

import (
	"strings"
	"testing"
)

// modelFilter refuses nodes of one GPU model, to have a second plugin.
type modelFilter struct{ model string }

func (modelFilter) Name() string { return "NoModel" }

func (f modelFilter) Filter(_ *CycleState, _ *Task, n *NodeState) Status {
	if n.Node.Model == f.model {
		return Refuse("model " + f.model + " excluded")
	}
	return Status{}
}

// brokenFilter fails as a plugin, not as a placement.
type brokenFilter struct{}

func (brokenFilter) Name() string { return "Broken" }

func (brokenFilter) Filter(*CycleState, *Task, *NodeState) Status {
	return Status{Code: Error, Reason: "state corrupt"}
}

var (
	_ FilterPlugin = modelFilter{}
	_ FilterPlugin = brokenFilter{}
)

// The Unschedulable status says which filters refused how many nodes and
// why, as kube-scheduler's FitError does.
func TestUnschedulableReason(t *testing.T) {
	var nodes []Node
	for i := range 12 {
		n := Node{Name: string(rune('a' + i)), CPUMilli: 32000, GPUs: 2, Model: "T4"}
		switch {
		case i < 4: // 4 without the CPU for the task
			n.CPUMilli = 1000
		case i < 6: // 2 of a model the second filter excludes
			n.Model = "P100"
		}
		nodes = append(nodes, n)
	}
	c := NewCluster(nodes)
	// 6 of the 8 T4 nodes with enough CPU have their GPUs taken.
	for i := 6; i < 12; i++ {
		if err := c.Place(&Task{Name: "fill", CPUMilli: 1000, GPUs: 2, GPUMilli: 1000}, i, []int{0, 1}); err != nil {
			t.Fatal(err)
		}
	}
	p := &Policy{Name: "test", Filters: []FilterPlugin{FitFilter{}, modelFilter{"P100"}}, Score: BestFitScore{}, GPUSel: SelectBest}
	sched := NewScheduler(p)
	cs := &CycleState{Rand: NewRand(1)}

	_, _, st := sched.Schedule(cs, c, &Task{Name: "w", CPUMilli: 4000, GPUs: 2, GPUMilli: 1000})
	want := `task "w": 0/12 nodes are available: 6 Fit (not enough fully free GPUs), 4 Fit (insufficient cpu), 2 NoModel (model P100 excluded)`
	if st.Code != Unschedulable || st.Reason != want {
		t.Fatalf("status %v %q\nwant %q", st.Code, st.Reason, want)
	}
	d := st.Diagnosis
	if d == nil || d.Nodes != 12 || len(d.Refusals) != 3 || d.Refusals[2] != (Refusal{Plugin: "NoModel", Reason: "model P100 excluded", Nodes: 2}) {
		t.Fatalf("diagnosis %+v", d)
	}

	// Another cycle starts its counts afresh; a node counts once, for the
	// first filter that refuses it.
	_, _, st = sched.Schedule(cs, c, &Task{Name: "v", CPUMilli: 1000, GPUs: 1, GPUMilli: 1000, Models: []string{"V100"}})
	want = `task "v": 0/12 nodes are available: 12 Fit (GPU model not accepted by the task)`
	if st.Reason != want {
		t.Fatalf("second cycle %q\nwant %q", st.Reason, want)
	}

	// A task that fits somewhere carries no diagnosis.
	node, _, st := sched.Schedule(cs, c, &Task{Name: "cpu", CPUMilli: 2000})
	if !st.OK() || st.Diagnosis != nil || node < 4 {
		t.Fatalf("cpu task: node %d status %+v", node, st)
	}

	// Without a diagnosis the status still counts the nodes.
	sched.NoDiagnosis = true
	_, _, st = sched.Schedule(cs, c, &Task{Name: "w", CPUMilli: 4000, GPUs: 2, GPUMilli: 1000})
	if want := `task "w": 0/12 nodes are available`; st.Code != Unschedulable || st.Reason != want || st.Diagnosis != nil {
		t.Fatalf("no diagnosis: %+v, want reason %q", st, want)
	}
	sched.NoDiagnosis = false

	// A broken filter is an Error naming the plugin, not Unschedulable.
	p.Filters = append(p.Filters, brokenFilter{})
	_, _, st = sched.Schedule(cs, c, &Task{Name: "cpu", CPUMilli: 2000})
	if st.Code != Error || !strings.Contains(st.Reason, "filter Broken on node") || !strings.Contains(st.Reason, "state corrupt") {
		t.Fatalf("broken filter: %+v", st)
	}
}

func TestUnfitReasons(t *testing.T) {
	n := NewNodeState(&Node{Name: "n", CPUMilli: 8000, MemMiB: 1024, GPUs: 2, Model: "T4", RNICs: 1}, 0)
	for _, c := range []struct {
		task Task
		want string
	}{
		{Task{CPUMilli: 9000}, ReasonCPU},
		{Task{MemMiB: 2048}, ReasonMemory},
		{Task{RNICMilli: 1500}, ReasonRNIC},
		{Task{GPUs: 1, GPUMilli: 1000, Models: []string{"V100"}}, ReasonGPUModel},
		{Task{GPUs: 3, GPUMilli: 1000}, ReasonWholeGPUs},
		{Task{GPUs: 1, GPUMilli: 500}, ""},
		{Task{CPUMilli: 8000, MemMiB: 1024, GPUs: 2, GPUMilli: 1000}, ""},
	} {
		if got := n.Unfit(&c.task); got != c.want || n.Fits(&c.task) != (c.want == "") {
			t.Errorf("%+v: Unfit %q, want %q", c.task, got, c.want)
		}
	}
	cpu := NewNodeState(&Node{Name: "c", CPUMilli: 8000}, 1)
	if got := cpu.Unfit(&Task{GPUs: 1, GPUMilli: 1000}); got != ReasonNoGPU {
		t.Errorf("GPU task on a CPU node: %q", got)
	}
	n.GPULeft[0], n.GPULeft[1] = 300, 200
	if got := n.Unfit(&Task{GPUs: 1, GPUMilli: 500}); got != ReasonGPUShare {
		t.Errorf("share task on full GPUs: %q", got)
	}
	grp := NewNodeState(&Node{Name: "g", CPUMilli: 8000}, 2)
	grp.Groups = map[string]int{"svc": 2}
	if got := grp.Unfit(&Task{Group: "svc", MaxPerNode: 2}); got != ReasonPerNode {
		t.Errorf("capped group: %q", got)
	}
}

// Simulate diagnoses the tasks that found no node when a Trace asks.
func TestSimulateTraceSeesDiagnosis(t *testing.T) {
	nodes := []Node{{Name: "a", CPUMilli: 8000, GPUs: 1, Model: "T4"}, {Name: "b", CPUMilli: 8000, GPUs: 1, Model: "T4"}}
	tasks := []Task{{Name: "g", CPUMilli: 1000, GPUs: 1, GPUMilli: 1000}}
	var reasons []string
	_, err := Simulate(nodes, tasks, "BestFit", NewRegistry(), SimOptions{Seed: 1, Inflation: 2, Trace: func(_ *Task, node int, _ []int, st Status) {
		if st.Code == Unschedulable {
			if st.Diagnosis == nil {
				t.Errorf("no diagnosis: %+v", st)
			}
			reasons = append(reasons, st.Reason)
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	want := `task "g": 0/2 nodes are available: 2 Fit (not enough fully free GPUs)`
	if len(reasons) != 2 || reasons[0] != want {
		t.Fatalf("reasons %q, want two of %q", reasons, want)
	}
}

// Assign checks the devices it is given, so that a broken GPU chooser is
// an error and not a corrupt state.
func TestAssignChecksDevices(t *testing.T) {
	two := Task{Name: "two", CPUMilli: 1000, GPUs: 2, GPUMilli: 1000}
	for _, c := range []struct {
		name string
		gpus []int
		want string
	}{
		{"ok", []int{0, 1}, ""},
		{"too few", []int{0}, "1 gpus chosen, 2 requested"},
		{"out of range", []int{0, 2}, "gpu 2 of node"},
		{"twice", []int{1, 1}, "gpu 1 of node \"n\" chosen twice"},
	} {
		n := NewNodeState(&Node{Name: "n", CPUMilli: 8000, GPUs: 2, Model: "T4"}, 0)
		err := n.Assign(&two, c.gpus)
		if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)) {
			t.Errorf("%s: %v, want %q", c.name, err, c.want)
		}
		for g, left := range n.GPUs() {
			if left < 0 {
				t.Errorf("%s: gpu %d has %d milli left", c.name, g, left)
			}
		}
		if err != nil && (n.Tasks != 0 || n.GPULeftTotal() != 2000) {
			t.Errorf("%s: refused, but the state changed: %+v", c.name, n)
		}
	}
}
