package main

import (
	"os/exec"
	"strings"
	"testing"
)

// runIn runs the binary in dir, where the shared data lookup starts.
func runIn(t *testing.T, dir string, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(prismBin, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// Outside a repository there is no ../shared/data to default to: the
// error names the data set, where it is published and the flag to pass.
func TestPlanWithoutSharedData(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"plan", "simulate"}, []string{"--nodes not given", "openb/openb_node_list_gpu_node.csv", `"openb"`, "FGD paper", "https://github.com/alibaba/clusterdata/tree/master/cluster-trace-gpu-v2023", "pass --nodes FILE"}},
		{[]string{"plan", "simulate", "--nodes", "n.csv"}, []string{"--tasks not given", "openb/openb_pod_list_default.csv", "pass --tasks FILE"}},
		{[]string{"plan", "cnhn"}, []string{"--trace not given", "prism/disaggregated_DLRM_trace.csv", "Prism DLRM", "cluster-trace-gpu-v2025", "pass --trace FILE"}},
	} {
		out, err := runIn(t, dir, c.args...)
		if err == nil {
			t.Fatalf("%v: no error:\n%s", c.args, out)
		}
		if strings.Count(strings.TrimSpace(out), "\n") != 0 {
			t.Errorf("%v: error is not one line:\n%s", c.args, out)
		}
		for _, w := range c.want {
			if !strings.Contains(out, w) {
				t.Errorf("%v: %q lacks %q", c.args, out, w)
			}
		}
	}
}

// Flag errors name the flag; the rest of the message comes from the
// package that parsed the value. Values are checked before any file is
// read, so the data paths need not exist.
func TestPlanFlagErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"plan", "simulate", "--nodes", "n.csv", "--tasks", "t.csv", "--seeds", "5-1"}, `prism: --seeds: bad range "5-1", want like 42-51`},
		{[]string{"plan", "simulate", "--nodes", "n.csv", "--tasks", "t.csv", "--policy", "nope"}, `prism: --policy: unknown policy "nope"`},
		{[]string{"plan", "mig", "--demands", "a"}, `prism: --demands: "a", want name=demand`},
		{[]string{"plan", "mig", "--demands", "a=1,a=2"}, `prism: --demands: "a=2": service a given twice`},
		{[]string{"plan", "mig", "--demands", "a=-1"}, `prism: --demands: "a=-1": a demand is 0 or more full GPUs`},
		{[]string{"plan", "mig", "--demands", "a=1", "--mem-gb", "b=5"}, `prism: --mem-gb: "b=5": no service b in the demands`},
		{[]string{"plan", "mig", "--demands", "a=1", "--mem-gb", "a=-5"}, `prism: --mem-gb: "a=-5": memory is 0 or more GB`},
		{[]string{"plan", "mig", "--demands", "a=1", "--mem-gb", "a=100"}, `prism: service "a" needs 100 GB per instance; the largest A100-80GB slice that serves it, 7g.80gb, has 80 GB`},
		{[]string{"plan", "mig", "--bench", "1", "--mem-gb", "a=1"}, `prism: --mem-gb names services of --demands; --bench draws its own`},
		{[]string{"plan", "simulate", "--nodes", "n.csv", "--tasks", "t.csv", "--at", "200"}, `prism: --at 200: want a percent of GPU capacity the runs arrive at, 1 to 130 (--inflation 1.3)`},
		{[]string{"plan", "cnhn", "--trace", "p.csv", "--gpu-node-gpus", "0"}, `prism: --gpu-node-gpus 0: want a positive value`},
	} {
		out, err := run(t, nil, c.args...)
		if err == nil || !strings.HasPrefix(out, c.want) {
			t.Errorf("%v: %v\n%s\nwant prefix %q", c.args, err, out, c.want)
		}
	}
}
