// Package cnhn compares Prism's disaggregated deployment (CN instances on
// CPU nodes, HN instances on GPU nodes) with a monolithic one (each
// service's CPU and GPU work in one instance on GPU nodes) over the
// lifetime events of the Prism trace (NSDI'25, alibaba/clusterdata
// cluster-trace-gpu-v2025).
package cnhn

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
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

// ReadTrace parses disaggregated_DLRM_trace.csv.
func ReadTrace(name string, r io.Reader) ([]Instance, error) {
	cr := csv.NewReader(r)
	cr.FieldsPerRecord = -1
	head, err := cr.Read()
	if err != nil {
		return nil, fmt.Errorf("%s: read header: %w", name, err)
	}
	col := map[string]int{}
	for i, h := range head {
		col[strings.TrimSpace(h)] = i
	}
	for _, c := range []string{"instance_sn", "role", "app_name", "cpu_request", "gpu_request", "rdma_request", "memory_request", "max_instance_per_node", "creation_time", "deletion_time"} {
		if _, ok := col[c]; !ok {
			return nil, fmt.Errorf("%s:1: missing column %q", name, c)
		}
	}
	var out []Instance
	for {
		rec, err := cr.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			var pe *csv.ParseError
			if errors.As(err, &pe) {
				return nil, fmt.Errorf("%s:%d: %w", name, pe.Line, pe.Err)
			}
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		line, _ := cr.FieldPos(0)
		get := func(c string) string {
			if i := col[c]; i < len(rec) {
				return strings.TrimSpace(rec[i])
			}
			return ""
		}
		num := func(c string, missing float64) (float64, error) {
			s := get(c)
			if s == "" || strings.EqualFold(s, "nan") {
				if math.IsNaN(missing) {
					return 0, fmt.Errorf("%s:%d: column %q is empty", name, line, c)
				}
				return missing, nil
			}
			v, err := strconv.ParseFloat(s, 64)
			if err != nil {
				return 0, fmt.Errorf("%s:%d: column %q: %q is not a number", name, line, c, s)
			}
			return v, nil
		}
		in := Instance{Name: get("instance_sn"), Role: get("role"), App: get("app_name")}
		if in.Role != "CN" && in.Role != "HN" {
			return nil, fmt.Errorf("%s:%d: role %q, want CN or HN", name, line, in.Role)
		}
		var g, mpn float64
		if in.CPU, err = num("cpu_request", math.NaN()); err != nil {
			return nil, err
		}
		if g, err = num("gpu_request", 0); err != nil {
			return nil, err
		}
		in.GPU = int(g)
		if in.RDMA, err = num("rdma_request", 0); err != nil {
			return nil, err
		}
		if in.MemGiB, err = num("memory_request", 0); err != nil {
			return nil, err
		}
		if mpn, err = num("max_instance_per_node", -1); err != nil {
			return nil, err
		}
		if mpn > 0 {
			in.MaxPerNode = int(mpn)
		}
		if in.Start, err = num("creation_time", 0); err != nil {
			return nil, err
		}
		if in.End, err = num("deletion_time", math.Inf(1)); err != nil {
			return nil, err
		}
		if in.CPU < 0 || in.GPU < 0 || in.RDMA < 0 || in.MemGiB < 0 || in.End < in.Start {
			return nil, fmt.Errorf("%s:%d: negative request or deletion before creation", name, line)
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
