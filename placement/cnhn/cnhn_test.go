package cnhn

import (
	"strings"
	"testing"

	"github.com/prism-serve/prism/internal/shareddata/sharedtest"
)

func sharedTrace(tb testing.TB) []Instance {
	tb.Helper()
	tr, err := LoadTrace(sharedtest.Path(tb, "prism/disaggregated_DLRM_trace.csv"))
	if err != nil {
		tb.Fatalf("prism trace: %v", err)
	}
	return tr
}

func TestReadTraceErrors(t *testing.T) {
	head := "instance_sn,role,app_name,cpu_request,gpu_request,rdma_request,memory_request,max_instance_per_node,creation_time,deletion_time\n"
	cases := []struct{ in, want string }{
		{"instance_sn,role\n", `p.csv:1: missing column "app_name"`},
		{head + "i0,XN,a,8,1,25,40,2,,\n", `p.csv:2: role "XN"`},
		{head + "i0,HN,a,8,1,25,40,2,,\ni1,HN,a,eight,1,25,40,2,,\n", `p.csv:3: column "cpu_request": "eight" is not a number`},
		{head + "i0,HN,a,8,1,25,40,2,100,50\n", "p.csv:2: negative request or deletion before creation"},
		{head + "i0,HN,a,8,0.5,25,40,2,,\n", `p.csv:2: column "gpu_request": 0.5 is not a whole number of GPUs`},
		{head + "i0,HN,a,8,1,25,40,2.5,,\n", `p.csv:2: column "max_instance_per_node": 2.5 is not a whole number of instances`},
	}
	for _, c := range cases {
		_, err := ReadTrace("p.csv", strings.NewReader(c.in))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: error %v, want %q", c.in, err, c.want)
		}
	}
}

// Two services, hand-checked: disaggregated needs 1 GPU node and 1 CPU
// node; monolithic puts 1 GPU + 8 + 64 cores per instance on GPU nodes.
func TestSmallDeployments(t *testing.T) {
	in := "instance_sn,role,app_name,cpu_request,gpu_request,rdma_request,memory_request,max_instance_per_node,creation_time,deletion_time\n" +
		"h0,HN,a,8,1,25,40,-1,,\nh1,HN,a,8,1,25,40,-1,,\nc0,CN,a,64,0,1,320,-1,,\nc1,CN,a,64,0,1,320,-1,,\n"
	tr, err := ReadTrace("p.csv", strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	o := Options{GPUNode: Shape{Cores: 128, GPUs: 8, RNICs: 4, MemGiB: 2048}, CPUNode: Shape{Cores: 128, RNICs: 1, MemGiB: 1024}}
	d, err := Disaggregated(tr, o)
	if err != nil {
		t.Fatal(err)
	}
	if d.PeakGPUNodes != 1 || d.PeakCPUNodes != 1 || d.Unplaced != 0 {
		t.Fatalf("disaggregated %+v", d)
	}
	// GPU node: 16 of 128 cores used, 6 of 8 GPUs idle.
	if d.GPUFragPct != 75 || d.CPUFragPct != 100*(256-16-128)/256.0 {
		t.Fatalf("disaggregated frag %+v", d)
	}
	m, err := Monolithic(tr, o)
	if err != nil {
		t.Fatal(err)
	}
	// Each monolithic instance: 8 + 64 = 72 cores; two need two GPU nodes.
	if m.PeakGPUNodes != 2 || m.PeakCPUNodes != 0 || m.GPUFragPct != 100*14/16.0 {
		t.Fatalf("monolithic %+v", m)
	}
}

func TestPrismTraceRuns(t *testing.T) {
	if testing.Short() {
		t.Skip("trace run")
	}
	tr := sharedTrace(t)
	d, err := Disaggregated(tr, Options{})
	if err != nil {
		t.Fatal(err)
	}
	m, err := Monolithic(tr, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("disaggregated %+v", d)
	t.Logf("monolithic    %+v", m)
	if d.GPUFragPct >= m.GPUFragPct {
		t.Fatalf("disaggregation should strand fewer GPUs: %.1f%% vs %.1f%%", d.GPUFragPct, m.GPUFragPct)
	}
}

// Instances with no lifetime: the Prism trace has 15 HN instances
// deleted in the second they are created. Such an instance must leave
// (its leave event used to sort before its arrival, so it stayed to the
// end), and a service whose HN instances have no lifetime must not fold
// its CN work into them by dividing by zero.
func TestZeroLifetimeInstances(t *testing.T) {
	head := "instance_sn,role,app_name,cpu_request,gpu_request,rdma_request,memory_request,max_instance_per_node,creation_time,deletion_time\n"
	o := Options{GPUNode: Shape{Cores: 128, GPUs: 8, RNICs: 4, MemGiB: 2048}, CPUNode: Shape{Cores: 128, RNICs: 1, MemGiB: 1024}}
	cases := []struct {
		name  string
		trace string
		mode  func([]Instance, Options) (*Result, error)
		check func(r *Result) bool
	}{
		// h0 holds 1 of 8 GPUs over [0,200]; h1 comes and goes at 100.
		{"created and deleted at once leaves", head + "h0,HN,a,8,1,25,40,-1,0,200\nh1,HN,b,8,1,25,40,-1,100,100\n", Disaggregated,
			func(r *Result) bool { return r.GPUFragPct == 87.5 && r.PeakGPUNodes == 1 }},
		{"monolithic, created and deleted at once leaves", head + "h0,HN,a,8,1,25,40,-1,0,200\nh1,HN,b,8,1,25,40,-1,100,100\n", Monolithic,
			func(r *Result) bool { return r.GPUFragPct == 87.5 && r.PeakGPUNodes == 1 }},
		// h0 is created at the window's end: its service's HN lifetime
		// is 0, so c0 stays on a CPU node and h0 carries its own 8 cores.
		{"HN without lifetime keeps its CN apart", head + "h0,HN,a,8,1,25,40,-1,200,\nc0,CN,a,64,0,1,320,-1,0,200\n", Monolithic,
			func(r *Result) bool { return r.CappedCores == 0 && r.PeakCPUNodes == 1 && r.CPUFragPct == 50 }},
		{"zero-length HN without CN", head + "h0,HN,b,8,1,25,40,-1,100,100\nc0,CN,a,64,0,1,320,-1,0,200\n", Monolithic,
			func(r *Result) bool { return r.CappedCores == 0 && r.CPUFragPct == 50 && r.GPUPoolCPUFragPct == 0 }},
	}
	for _, c := range cases {
		tr, err := ReadTrace("p.csv", strings.NewReader(c.trace))
		if err != nil {
			t.Fatal(err)
		}
		r, err := c.mode(tr, o)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if !c.check(r) {
			t.Errorf("%s: %+v", c.name, r)
		}
	}
}
