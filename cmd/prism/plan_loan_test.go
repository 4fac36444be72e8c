package main

import (
	"strings"
	"testing"
)

// Without ../shared/data the error names the QPS data set and --qps; bad
// flag values name the flag.
func TestPlanLoanErrors(t *testing.T) {
	out, err := runIn(t, t.TempDir(), "plan", "loan", "--capacity-per-worker", "100")
	if err == nil || !strings.Contains(out, "--qps not given") || !strings.Contains(out, "qps/genai_gateway_qps.csv") || !strings.Contains(out, "pass --qps FILE") {
		t.Errorf("no shared data: %v\n%s", err, out)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"plan", "loan", "--qps", "q.csv", "--capacity-per-worker", "100", "--policy", "eager"}, `prism: --policy: unknown capacity policy "eager"`},
		{[]string{"plan", "loan", "--qps", "q.csv", "--capacity-per-worker", "100", "--promotion", "5h,1h"}, `prism: --promotion: promotion "5h,1h": want START,DURATION,FACTOR`},
		{[]string{"plan", "loan", "--qps", "q.csv"}, `prism: --capacity-per-worker must be positive`},
	} {
		out, err := run(t, nil, c.args...)
		if err == nil || !strings.HasPrefix(out, c.want) {
			t.Errorf("%v: %v\n%s\nwant prefix %q", c.args, err, out, c.want)
		}
	}
}
