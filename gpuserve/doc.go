// Package gpuserve is Prism's dense tier: it runs dense.onnx through ONNX
// Runtime with dynamic batching, one worker per GPU or MIG slice that NVML
// reports (package devices finds them), or on the CPU execution provider
// when there is no NVIDIA driver.
//
// Requests of a model are batched by earliest deadline first (their gRPC
// deadline, which the router sets and the embedding tier passes on), and
// a request that has expired or is predicted, from the measured run times,
// to miss its deadline is answered DeadlineExceeded instead of run: the
// rule is in schedule.go.
package gpuserve
