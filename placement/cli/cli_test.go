package cli

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/prism-serve/prism/placement"
	"github.com/prism-serve/prism/placement/cnhn"
	"github.com/prism-serve/prism/placement/mig"
)

func TestParseSeeds(t *testing.T) {
	for in, want := range map[string][]uint64{
		"42":         {42},
		"42-44":      {42, 43, 44},
		" 1, 5 ,9 ":  {1, 5, 9},
		"7,10-11,,3": {7, 10, 11, 3},
	} {
		got, err := ParseSeeds(in)
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("ParseSeeds(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for in, want := range map[string]string{
		"5-1":      `bad range "5-1", want like 42-51`,
		"a-3":      `bad range "a-3"`,
		"x":        `"x" is not a seed`,
		"0-200000": `range "0-200000" too long`,
		" , ":      `no seeds in " , "`,
	} {
		if _, err := ParseSeeds(in); err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "--") {
			t.Errorf("ParseSeeds(%q): %v, want %q and no flag name", in, err, want)
		}
	}
}

func TestParsePolicies(t *testing.T) {
	reg := placement.NewRegistry()
	got, err := ParsePolicies(reg, "all, fgdpack")
	if err != nil || len(got) != len(placement.PaperPolicies)+1 || got[len(got)-1] != "fgdpack" {
		t.Fatalf("policies %v, %v", got, err)
	}
	if _, err := ParsePolicies(reg, "nope"); err == nil || !strings.Contains(err.Error(), `unknown policy "nope"`) {
		t.Fatalf("unknown: %v", err)
	}
	if _, err := ParsePolicies(reg, ","); err == nil || err.Error() != "no policy given" {
		t.Fatalf("empty: %v", err)
	}
	if _, err := ParsePolicies(reg, "FGD,BestFit,FGD"); err == nil || !strings.Contains(err.Error(), "FGD given twice") {
		t.Fatalf("twice: %v", err)
	}
}

// A policy or seed given twice runs twice and counts as two seeds in the
// summary, whatever the spelling: policy names match case-insensitively.
func TestParseGivenTwice(t *testing.T) {
	reg := placement.NewRegistry()
	cases := []struct{ policies, seeds, want string }{
		{"FGD,fgd", "42", "policy fgd given twice"},
		{"all,bestfit", "42", "policy bestfit given twice"},
		{"FGDPack,fgdpack", "42", "policy fgdpack given twice"},
		{"FGD", "42-51,50", "seed 50 given twice"},
		{"FGD", "7,7", "seed 7 given twice"},
	}
	for _, c := range cases {
		_, perr := ParsePolicies(reg, c.policies)
		_, serr := ParseSeeds(c.seeds)
		err := errors.Join(perr, serr)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("--policy %q --seeds %q: %v, want %q", c.policies, c.seeds, err, c.want)
		}
	}
}

func TestDataPath(t *testing.T) {
	if p, err := DataPath("/given.csv", OpenbNodes); err != nil || p != "/given.csv" {
		t.Fatalf("given path: %q %v", p, err)
	}
	_, err := DataPath("", "openb/no-such-file.csv")
	if !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("missing file: %v", err)
	}
	for _, want := range []string{"openb/no-such-file.csv", `"openb"`, "FGD", "https://github.com/alibaba/clusterdata"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q lacks %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "--") {
		t.Errorf("%q names a flag", err)
	}
}

func TestSimulateSmall(t *testing.T) {
	dir := t.TempDir()
	nodes := filepath.Join(dir, "nodes.csv")
	tasks := filepath.Join(dir, "tasks.csv")
	os.WriteFile(nodes, []byte("sn,cpu_milli,memory_mib,gpu,model\nn0,32000,65536,2,T4\nn1,32000,65536,2,T4\n"), 0o644)
	os.WriteFile(tasks, []byte("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec\na,1000,1024,1,500,\nb,2000,1024,1,1000,\nc,1000,0,0,0,\n"), 0o644)
	var out, errw bytes.Buffer
	c := SimulateConfig{Nodes: nodes, Tasks: tasks, Policies: []string{"BestFit", "FGD"}, Seeds: []uint64{1, 2}, Inflation: 1.3, Coverage: 0.95, TieBreak: "first", At: 100, Bound: true, Out: filepath.Join(dir, "out")}
	if err := Simulate(&out, &errw, c); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 4 || !strings.HasPrefix(lines[0], "policy") || !strings.HasPrefix(lines[1], "BestFit ") || !strings.HasPrefix(lines[2], "FGD ") || !strings.HasPrefix(lines[3], "bound ") {
		t.Fatalf("summary:\n%s", out.String())
	}
	if !strings.Contains(errw.String(), "[4/4] FGD seed 2:") || !strings.Contains(errw.String(), "wrote "+c.Out) {
		t.Errorf("progress:\n%s", errw.String())
	}
	// Not a terminal: a line per run, no carriage returns.
	if strings.Contains(errw.String(), "\r") || strings.Count(errw.String(), "\n[") < 3 {
		t.Errorf("progress to a file is not a line per run:\n%q", errw.String())
	}
	for _, f := range []string{"curves.csv", "summary.csv", "alloc.png", "frag.png"} {
		if st, err := os.Stat(filepath.Join(c.Out, f)); err != nil || st.Size() == 0 {
			t.Errorf("%s: %v", f, err)
		}
	}
	// The trace as is arrives at 1.5 of 4 GPUs (37%): the summary says
	// so and reports there, not at --at 100 from its last point.
	out.Reset()
	errw.Reset()
	c.Inflation, c.Bound, c.Out = -1, false, ""
	if err := Simulate(&out, &errw, c); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(errw.String(), "short of --at 100: the summary reports at 37%") || !strings.Contains(out.String(), "alloc@37%") {
		t.Errorf("a run short of --at:\n%s\n%s", errw.String(), out.String())
	}
	// An --out that cannot be made fails before the runs.
	errw.Reset()
	c.Out = filepath.Join(nodes, "out") // under a file
	if err := Simulate(&out, &errw, c); err == nil || !strings.Contains(err.Error(), "--out") || strings.Contains(errw.String(), "seed") {
		t.Fatalf("an --out under a file: %v; progress %q", err, errw.String())
	}
	c.Out = ""
	c.Tasks = filepath.Join(dir, "none.csv")
	if err := Simulate(&out, &errw, c); err == nil || !strings.Contains(err.Error(), `open tasks "`) {
		t.Fatalf("missing tasks: %v", err)
	}
}

func TestCNHNSmall(t *testing.T) {
	path := filepath.Join(t.TempDir(), "p.csv")
	os.WriteFile(path, []byte("instance_sn,role,app_name,cpu_request,gpu_request,rdma_request,memory_request,max_instance_per_node,creation_time,deletion_time\n"+
		"h0,HN,a,8,1,25,40,-1,,\nc0,CN,a,64,0,1,320,-1,,\n"), 0o644)
	var out, errw bytes.Buffer
	o := cnhn.Options{GPUNode: cnhn.Shape{Cores: 128, GPUs: 8, RNICs: 4, MemGiB: 2048}, CPUNode: cnhn.Shape{Cores: 128, RNICs: 1, MemGiB: 1024}}
	if err := CNHN(&out, &errw, path, o); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "disaggregated ") || !strings.Contains(out.String(), "monolithic ") || !strings.Contains(errw.String(), "replaying 2 instances") {
		t.Fatalf("out:\n%s\nerr:\n%s", out.String(), errw.String())
	}
}

// TestCNHNReportsCappedMemory: a monolithic instance whose HN and CN
// memory together exceed a GPU node is capped to the node's memory; the
// cut is reported as the cut vCPUs are. Silent, the monolith looked as if
// its memory fit (at the default shapes, 3.2 million GiB of the Prism
// trace's monolithic instances did not).
func TestCNHNReportsCappedMemory(t *testing.T) {
	path := filepath.Join(t.TempDir(), "p.csv")
	os.WriteFile(path, []byte("instance_sn,role,app_name,cpu_request,gpu_request,rdma_request,memory_request,max_instance_per_node,creation_time,deletion_time\n"+
		"h0,HN,a,8,1,25,40,-1,,\nc0,CN,a,64,0,1,320,-1,,\nc1,CN,a,32,0,1,160,-1,,\n"), 0o644)
	var out, errw bytes.Buffer
	// 40 + 320 + 160 = 520 GiB on a GPU node of 256: 264 GiB cut.
	o := cnhn.Options{GPUNode: cnhn.Shape{Cores: 128, GPUs: 8, RNICs: 4, MemGiB: 256}, CPUNode: cnhn.Shape{Cores: 128, RNICs: 1, MemGiB: 1024}}
	if err := CNHN(&out, &errw, path, o); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "264 GiB of memory") {
		t.Fatalf("the memory cut off the monolithic instance is not reported:\n%s", out.String())
	}
	tr, err := cnhn.LoadTrace(path)
	if err != nil {
		t.Fatal(err)
	}
	if m, err := cnhn.Monolithic(tr, o); err != nil || m.CappedMemGiB != 264 || m.CappedCores != 0 {
		t.Fatalf("monolithic %+v, %v: want 264 GiB and no vCPUs capped", m, err)
	}
}

func TestMIG(t *testing.T) {
	m, err := mig.ModelByName("A100-80GB")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ParseDemands("a=1,b", m, 0); err == nil || err.Error() != `"b", want name=demand` {
		t.Fatalf("bad demands: %v", err)
	}
	if _, err := ParseDemands("a=1", m, -1); err == nil {
		t.Fatal("a negative full-GPU throughput was taken")
	}
	// The same demands in full GPUs, and in requests/s of which a full
	// GPU serves 1000, plan alike.
	var outs [2]bytes.Buffer
	for i, c := range []struct {
		demands string
		full    float64
	}{{"resnet=0.4,bert=0.4,dlrm=1.3", 0}, {"resnet=400,bert=400,dlrm=1300", 1000}} {
		svcs, err := ParseDemands(c.demands, m, c.full)
		if err != nil {
			t.Fatal(err)
		}
		if err := MIG(&outs[i], m, svcs, 6); err != nil {
			t.Fatal(err)
		}
	}
	out := outs[0]
	if outs[1].String() != out.String() {
		t.Errorf("requests/s at 1000 a GPU planned\n%s\nfull GPUs\n%s", outs[1].String(), out.String())
	}
	// The default demands of `prism plan mig`, as the command printed them
	// before its logic moved here.
	want := `gpu 0: 1g.10gb@0:resnet 1g.10gb@1:resnet 1g.10gb@2:bert 1g.10gb@3:bert 1g.10gb@4:resnet 1g.10gb@5:bert 1g.10gb@6:dlrm
gpu 1: 7g.80gb@0:dlrm
gpu 2: 1g.10gb@0:dlrm 1g.10gb@1:dlrm 1g.10gb@2:idle 1g.10gb@3:idle 1g.10gb@4:idle 1g.10gb@5:idle 1g.10gb@6:idle
heuristic: 3 GPUs; whole-GPU allocation: 4 GPUs (saves 25%)
exact: 3 GPUs
`
	if out.String() != want {
		t.Fatalf("got\n%s\nwant\n%s", out.String(), want)
	}
}

// --mem-gb: a service needing 15 GB never gets a 1g.10gb slice of an
// H100-80GB (the default demands otherwise give dlrm one, see TestMIG);
// one that no slice holds is an error naming it, its need and the largest
// slice; bad values name the entry.
func TestMIGMemory(t *testing.T) {
	for _, tc := range []struct {
		model, demands, mem string
		want, wantErr       string
	}{
		{model: "H100-80GB", demands: "resnet=0.4,bert=0.4,dlrm=1.3", mem: "dlrm=15", want: `gpu 0: 1g.10gb@0:resnet 1g.10gb@1:resnet 1g.10gb@2:bert 1g.10gb@3:bert 1g.10gb@4:resnet 1g.10gb@5:bert 1g.20gb@6:dlrm
gpu 1: 7g.80gb@0:dlrm
gpu 2: 1g.10gb@0:idle 1g.10gb@1:idle 1g.10gb@2:idle 1g.10gb@3:idle 1g.20gb@4:dlrm 1g.20gb@6:dlrm
heuristic: 3 GPUs; whole-GPU allocation: 4 GPUs (saves 25%)
exact: 3 GPUs
`},
		{model: "H100-80GB", demands: "dlrm=0.4", mem: "dlrm=15gb", want: `gpu 0: 2g.20gb@4:dlrm 1g.10gb@0:idle 1g.10gb@1:idle 1g.10gb@2:idle 1g.10gb@3:idle 1g.20gb@6:dlrm
heuristic: 1 GPUs; whole-GPU allocation: 1 GPUs (saves 0%)
exact: 1 GPUs
`},
		{model: "H200-141GB", demands: "dlrm=0.4", mem: "dlrm=15", want: `gpu 0: 1g.18gb@0:dlrm 1g.18gb@1:dlrm 1g.18gb@2:dlrm 1g.18gb@3:idle 1g.18gb@4:idle 1g.18gb@5:idle 1g.18gb@6:idle
heuristic: 1 GPUs; whole-GPU allocation: 1 GPUs (saves 0%)
exact: 1 GPUs
`},
		{model: "A100-40GB", demands: "a=0.3,dlrm=1", mem: "dlrm=45", wantErr: `service "dlrm" needs 45 GB per instance; the largest A100-40GB slice that serves it, 7g.40gb, has 40 GB`},
		{model: "A100-80GB", demands: "a=1", mem: "b=5", wantErr: `"b=5": no service b in the demands`},
		{model: "A100-80GB", demands: "a=1", mem: "a=5,a=6", wantErr: `"a=6": service a given twice`},
		{model: "A100-80GB", demands: "a=1", mem: "a=-5", wantErr: `"a=-5": memory is 0 or more GB`},
		{model: "A100-80GB", demands: "a=1", mem: "a", wantErr: `"a", want name=GB`},
	} {
		m, err := mig.ModelByName(tc.model)
		if err != nil {
			t.Fatal(err)
		}
		svcs, err := ParseDemands(tc.demands, m, 0)
		if err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		err = ParseMemory(tc.mem, svcs)
		if err == nil {
			err = MIG(&out, m, svcs, 6)
		}
		if tc.wantErr != "" {
			if err == nil || err.Error() != tc.wantErr {
				t.Errorf("%s %s: error %v, want %q", tc.demands, tc.mem, err, tc.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s %s: %v", tc.demands, tc.mem, err)
		} else if out.String() != tc.want {
			t.Errorf("%s %s: got\n%s\nwant\n%s", tc.demands, tc.mem, out.String(), tc.want)
		}
	}
}

// Ten services outgrow the exact solver's step limit: the plan says the
// heuristic's count is unproven instead of searching on (it searched for
// minutes, silently) or failing.
func TestMIGExactStepLimit(t *testing.T) {
	m, err := mig.ModelByName("A100-80GB")
	if err != nil {
		t.Fatal(err)
	}
	svcs, err := ParseDemands("a=0.3,b=0.5,c=0.2,d=0.7,e=0.15,f=0.45,g=0.35,h=0.6,i=0.25,j=0.55", m, 0)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := MIG(&out, m, svcs, 6); err != nil {
		t.Fatal(err)
	}
	want := "heuristic: 6 GPUs; whole-GPU allocation: 10 GPUs (saves 40%)\nexact: stopped after 20000000 search steps; the heuristic's 6 GPUs are not proven fewest\n"
	if !strings.HasSuffix(out.String(), want) {
		t.Fatalf("got\n%s\nwant it to end\n%s", out.String(), want)
	}
}
