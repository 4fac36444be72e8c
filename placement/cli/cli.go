// Package cli is what `prism plan` runs once its flags are parsed: it
// resolves the default data files, loops over policies and seeds, prints
// the reports and writes the output files. cmd/prism/plan.go keeps only
// the flags; errors here describe the problem and leave flag names to
// the command.
package cli

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/prism-serve/prism/internal/shareddata"
	"github.com/prism-serve/prism/placement"
)

// Files under ../shared/data the plan commands default to.
const (
	OpenbNodes = "openb/openb_node_list_gpu_node.csv"
	OpenbTasks = "openb/openb_pod_list_default.csv"
	PrismTrace = "prism/disaggregated_DLRM_trace.csv"
)

// DefaultData returns the path of the shared data file rel when it is
// there, for a flag's default; "" when it is not.
func DefaultData(rel string) string { return shareddata.Default(rel) }

// DataPath returns path if given, else the shared data file rel. A
// missing file is a *shareddata.MissingError, which names the public data
// set and where it is published.
func DataPath(path, rel string) (string, error) {
	if path != "" {
		return path, nil
	}
	return shareddata.Path(rel)
}

// ParseSeeds reads a seed list: "42-51" (a range), "1,5,9" or "7", and
// mixes of them.
func ParseSeeds(s string) ([]uint64, error) {
	var out []uint64
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		if lo, hi, ok := strings.Cut(part, "-"); ok {
			a, err1 := strconv.ParseUint(strings.TrimSpace(lo), 10, 64)
			b, err2 := strconv.ParseUint(strings.TrimSpace(hi), 10, 64)
			if err1 != nil || err2 != nil || b < a {
				return nil, fmt.Errorf("bad range %q, want like 42-51", part)
			}
			if b-a > 100000 {
				return nil, fmt.Errorf("range %q too long", part)
			}
			for v := a; v <= b; v++ {
				out = append(out, v)
			}
			continue
		}
		v, err := strconv.ParseUint(part, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("%q is not a seed", part)
		}
		out = append(out, v)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no seeds in %q", s)
	}
	// A seed given twice would run twice and count as two seeds in the
	// summary's mean and spread.
	seen := make(map[uint64]bool, len(out))
	for _, v := range out {
		if seen[v] {
			return nil, fmt.Errorf("seed %d given twice", v)
		}
		seen[v] = true
	}
	return out, nil
}

// ParsePolicies reads a comma-separated policy list of reg's names; "all"
// stands for the FGD paper's six.
func ParsePolicies(reg *placement.Registry, s string) ([]string, error) {
	var names []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p == "" {
			continue
		}
		if p == "all" {
			names = append(names, placement.PaperPolicies...)
			continue
		}
		if _, err := reg.New(p, placement.PolicyOptions{Workload: placement.TargetWorkload{{GPUMilli: 1000, GPUs: 1, Freq: 1}}}); err != nil {
			return nil, err
		}
		names = append(names, p)
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("no policy given")
	}
	// Names match case-insensitively (Registry.New), so "FGD,fgd" and
	// "all,bestfit" name one policy twice.
	seen := map[string]bool{}
	for _, n := range names {
		k := strings.ToLower(n)
		if seen[k] {
			return nil, fmt.Errorf("policy %s given twice (its runs would be counted as more seeds)", n)
		}
		seen[k] = true
	}
	return names, nil
}

// writeFile creates path and fills it.
func writeFile(path string, fill func(*os.File) error) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("create %q: %w", path, err)
	}
	if err := fill(f); err != nil {
		f.Close()
		return fmt.Errorf("write %q: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close %q: %w", path, err)
	}
	return nil
}
