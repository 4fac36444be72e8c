// Package gpuserve is Prism's dense tier: it runs dense.onnx through ONNX
// Runtime with dynamic batching, one worker per GPU or MIG slice that NVML
// reports (package devices finds them), or on the CPU execution provider
// when there is no NVIDIA driver.
package gpuserve
