package cli

import (
	"fmt"
	"io"

	"github.com/prism-serve/prism/placement/cnhn"
)

// CNHN replays the Prism trace at tracePath disaggregated and monolithic
// and prints one row per deployment on stdout.
func CNHN(stdout, stderr io.Writer, tracePath string, o cnhn.Options) error {
	tr, err := cnhn.LoadTrace(tracePath)
	if err != nil {
		return err
	}
	if err := o.Validate(); err != nil {
		return err
	}
	fmt.Fprintf(stderr, "replaying %d instances twice...\n", len(tr))
	d, err := cnhn.Disaggregated(tr, o)
	if err != nil {
		return err
	}
	m, err := cnhn.Monolithic(tr, o)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%-14s %9s %9s %9s %9s %12s %12s %9s %12s\n", "deployment", "gpu_nodes", "cpu_nodes", "cpu_frag", "gpu_frag", "gpupool_cpu", "cpupool_cpu", "unplaced", "capped_vcpu")
	for _, r := range []*cnhn.Result{d, m} {
		fmt.Fprintf(stdout, "%-14s %9d %9d %8.1f%% %8.1f%% %11.1f%% %11.1f%% %9d %12.0f\n", r.Mode, r.PeakGPUNodes, r.PeakCPUNodes, r.CPUFragPct, r.GPUFragPct, r.GPUPoolCPUFragPct, r.CPUPoolCPUFragPct, r.Unplaced, r.CappedCores)
	}
	fmt.Fprintln(stdout, "peak nodes of each pool; cpu_frag, gpu_frag: unallocated share of the nodes in use, over time; gpupool_cpu, cpupool_cpu: cpu_frag of each pool alone")
	if d.Unplaced > 0 || m.Unplaced > 0 {
		fmt.Fprintf(stdout, "unplaced: instances larger than an empty node of their pool (%d of %d; larger --gpu-node-* / --cpu-node-* shapes place them)\n", max(d.Unplaced, m.Unplaced), d.Instances)
	}
	if m.CappedCores > 0 {
		fmt.Fprintln(stdout, "capped_vcpu: vCPUs cut off monolithic instances whose HN and CN together exceed a GPU node (placed capped, not dropped)")
	}
	if m.CappedMemGiB > 0 {
		fmt.Fprintf(stdout, "capped memory: %.0f GiB of memory cut off monolithic instances whose HN and CN together exceed a GPU node's (--gpu-node-mem; placed capped, not dropped)\n", m.CappedMemGiB)
	}
	return nil
}
