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
// Subpackages: cnhn compares Prism's disaggregated CN/HN deployment with a
// monolithic one on the Prism trace; mig plans MIG layouts.
package placement
