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
