// Package cnhn compares Prism's disaggregated deployment (CN instances on
// CPU nodes, HN instances on GPU nodes) with a monolithic one (each
// service's CPU and GPU work in one instance on GPU nodes) over the
// lifetime events of the Prism trace (NSDI'25, alibaba/clusterdata
// cluster-trace-gpu-v2025).
package cnhn

import (
	"fmt"
	"io"
	"math"
	"os"

	"github.com/prism-serve/prism/internal/csvtab"
)

// Instance is one row of the trace.
type Instance struct {
	Name       string
	Role       string // "CN" or "HN"
	App        string
	CPU        float64 // vCPUs
	GPU        int
	RDMA       float64 // percent of one RNIC
	MemGiB     float64
	MaxPerNode int // 0: no cap
	// Start and End are seconds from the trace start; an instance created
	// before the window starts at 0, one alive at its end ends at +Inf.
	Start, End float64
}

// ReadTrace parses disaggregated_DLRM_trace.csv. Empty and NaN fields
// take defaults: no GPU, RDMA or memory, no per-node cap, created before
// the window (0), alive past its end (+Inf); cpu_request must be given.
func ReadTrace(name string, r io.Reader) ([]Instance, error) {
	t, err := csvtab.NewReader(name, r)
	if err != nil {
		return nil, err
	}
	if err := t.Require("instance_sn", "role", "app_name", "cpu_request", "gpu_request", "rdma_request", "memory_request", "max_instance_per_node", "creation_time", "deletion_time"); err != nil {
		return nil, err
	}
	var out []Instance
	for {
		row, err := t.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
		in := Instance{Name: row.Str("instance_sn"), Role: row.Str("role"), App: row.Str("app_name")}
		if in.Role != "CN" && in.Role != "HN" {
			return nil, row.Errorf("role %q, want CN or HN", in.Role)
		}
		var g, mpn float64
		if in.CPU, err = row.Float("cpu_request"); err != nil {
			return nil, err
		}
		if g, err = row.FloatOr("gpu_request", 0); err != nil {
			return nil, err
		}
		if g != math.Trunc(g) {
			// Instances take whole GPUs; truncating would drop the GPU
			// of a 0.5 request without a word.
			return nil, row.Errorf("column %q: %v is not a whole number of GPUs", "gpu_request", g)
		}
		in.GPU = int(g)
		if in.RDMA, err = row.FloatOr("rdma_request", 0); err != nil {
			return nil, err
		}
		if in.MemGiB, err = row.FloatOr("memory_request", 0); err != nil {
			return nil, err
		}
		if mpn, err = row.FloatOr("max_instance_per_node", -1); err != nil {
			return nil, err
		}
		if mpn > 0 {
			if mpn != math.Trunc(mpn) {
				return nil, row.Errorf("column %q: %v is not a whole number of instances", "max_instance_per_node", mpn)
			}
			in.MaxPerNode = int(mpn)
		}
		if in.Start, err = row.FloatOr("creation_time", 0); err != nil {
			return nil, err
		}
		if in.End, err = row.FloatOr("deletion_time", math.Inf(1)); err != nil {
			return nil, err
		}
		if in.CPU < 0 || in.GPU < 0 || in.RDMA < 0 || in.MemGiB < 0 || in.End < in.Start {
			return nil, row.Errorf("negative request or deletion before creation")
		}
		out = append(out, in)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no instances", name)
	}
	return out, nil
}

// LoadTrace reads a trace file.
func LoadTrace(path string) ([]Instance, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open trace %q: %w", path, err)
	}
	defer f.Close()
	return ReadTrace(path, f)
}
