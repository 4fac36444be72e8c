package cli

import (
	"bytes"
	"strings"
	"testing"

	"github.com/prism-serve/prism/placement/mig"
)

// When the exact solver needs fewer GPUs than the heuristic, the plan to
// create is its: its layouts are printed after its count (before, only
// the count, so an operator could not see the layout it proved).
func TestMIGPrintsExactLayout(t *testing.T) {
	m, err := mig.ModelByName("A100-80GB")
	if err != nil {
		t.Fatal(err)
	}
	svcs, err := ParseDemands("a=0.1,b=0.3,c=1.4", m, 0)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := MIG(&out, m, svcs, 6); err != nil {
		t.Fatal(err)
	}
	s := out.String()
	if !strings.Contains(s, "heuristic: 3 GPUs") || !strings.Contains(s, "exact: 2 GPUs\n") {
		t.Fatalf("want the heuristic's 3 GPUs and the exact 2:\n%s", s)
	}
	_, after, _ := strings.Cut(s, "exact: 2 GPUs\n")
	lines := strings.Split(strings.TrimSpace(after), "\n")
	if len(lines) != 2 || !strings.HasPrefix(lines[0], "exact gpu 0: ") || !strings.HasPrefix(lines[1], "exact gpu 1: ") {
		t.Fatalf("want the exact plan's two layouts after its count:\n%s", s)
	}
	for _, svc := range []string{":a", ":b", ":c"} {
		if !strings.Contains(after, svc) {
			t.Errorf("the exact layouts place no instance of %s:\n%s", svc[1:], after)
		}
	}
}
