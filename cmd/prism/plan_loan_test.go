package main

import (
	"fmt"
	"os"
	"path/filepath"
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
		{[]string{"plan", "loan", "--qps", "q.csv", "--capacity-per-worker", "100", "--scale", "-1"}, `prism: --scale -1: want a positive value`},
		{[]string{"plan", "loan", "--qps", "q.csv", "--capacity-per-worker", "100", "--tick", "0"}, `prism: --tick 0s: want a positive value`},
		{[]string{"plan", "loan", "--qps", "q.csv", "--capacity-per-worker", "100", "--lender-idle", "-1"}, `prism: --lender-idle -1: want 0 or more`},
		{[]string{"plan", "loan", "--qps", "q.csv", "--capacity-per-worker", "100", "--startup", "-1s"}, `prism: --startup -1s: want 0 or more`},
	} {
		out, err := run(t, nil, c.args...)
		if err == nil || !strings.HasPrefix(out, c.want) {
			t.Errorf("%v: %v\n%s\nwant prefix %q", c.args, err, out, c.want)
		}
	}
}

// A zero typed is a zero (README: "a value typed as 0 means 0"):
// --min-lease 0 and --cool-down 0 return borrowed workers as soon as the
// demand allows, as 1ns does, not after the controller's defaults (10m,
// 5m) that the zeros silently became; --high 0 is refused, not 0.85.
func TestPlanLoanZeroTyped(t *testing.T) {
	dir := t.TempDir()
	var b strings.Builder
	b.WriteString("timestamp_anon,value\n")
	for i := range 120 { // two hours a minute apart: a 4-minute peak, shorter than the default lease
		v := 300
		if i >= 30 && i < 34 {
			v = 1200
		}
		fmt.Fprintf(&b, "%d,%d\n", 60*i, v)
	}
	qps := filepath.Join(dir, "qps.csv")
	if err := os.WriteFile(qps, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	loan := func(extra ...string) string {
		t.Helper()
		out, err := run(t, nil, append([]string{"plan", "loan", "--qps", qps, "--capacity-per-worker", "100", "--policy", "reactive", "--owned", "5"}, extra...)...)
		if err != nil {
			t.Fatalf("%v: %v\n%s", extra, err, out)
		}
		return out
	}
	zero, tiny, def := loan("--min-lease", "0", "--cool-down", "0"), loan("--min-lease", "1ns", "--cool-down", "1ns"), loan()
	if zero != tiny {
		t.Errorf("--min-lease 0 --cool-down 0:\n%s\nwant as 1ns:\n%s", zero, tiny)
	}
	if zero == def {
		t.Errorf("--min-lease 0 --cool-down 0 ran as the defaults (10m, 5m):\n%s", zero)
	}
	out, err := run(t, nil, "plan", "loan", "--qps", qps, "--capacity-per-worker", "100", "--high", "0")
	if err == nil || !strings.Contains(out, "high 0") {
		t.Errorf("--high 0: %v\n%s\nwant it refused", err, out)
	}
}
