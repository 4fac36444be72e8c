// Package placement is Prism's cluster-level planner: where CPU-side and
// GPU-side instances go.
//
// The core is a deterministic, single-goroutine cluster model (cluster.go)
// driven by policies built from small Filter and Score plugins kept in a
// registry (framework.go, registry.go), in the style of the Kubernetes
// scheduler framework. The simulator (simulate.go) reproduces the method of
// the FGD paper ("Beware of Fragmentation", USENIX ATC'23) and of its public
// simulator: the trace is inflated to 130% of the cluster's GPU capacity
// with seeded random draws, shuffled with the same seed, and placed task by
// task. There is no wall clock and no goroutine in the core: a run is a pure
// function of its inputs and its seed.
//
// A filter answers with a Status: Success, Unschedulable with a reason, or
// Error. When no node passes, the scheduling status counts the refusals
// per filter and reason, as kube-scheduler's FitError does ("0/12 nodes
// are available: 8 Fit (not enough fully free GPUs), 4 Fit (insufficient
// cpu)").
//
// Subpackages: cnhn compares Prism's disaggregated CN/HN deployment with a
// monolithic one on the Prism trace; mig plans MIG layouts; plot draws
// the simulator's curves, so the planner does not link gonum/plot; cli is
// what `prism plan` runs once its flags are parsed.
package placement
