package gpuserve

import (
	"github.com/NVIDIA/go-nvml/pkg/nvml"
	onnxruntime "github.com/yalue/onnxruntime_go"

	"github.com/prism-serve/prism/gpuserve/devices"
	"github.com/prism-serve/prism/internal/ort"
)

// CUDAUsable says whether the dense tier would serve on CUDA on this
// host: NVML finds a GPU or MIG slice and the ONNX Runtime ORT_LIB (or
// the cache) names has the CUDA execution provider. It returns what NVML
// found (its GPUs and MIG slices) when so, else reason says why not.
func CUDAUsable(lib nvml.Interface) (d devices.Discovery, reason string) {
	d, err := devices.Discover(lib)
	switch {
	case err != nil:
		return devices.Discovery{}, err.Error()
	case d.NoDriver != "":
		return devices.Discovery{}, d.WhyCPU()
	}
	if r := CUDAUnavailable(); r != "" {
		return devices.Discovery{}, r
	}
	return d, ""
}

// CUDAUnavailable loads ONNX Runtime (ort.Init) and says why it cannot
// run sessions on the CUDA execution provider, "" when it can.
func CUDAUnavailable() string {
	if err := ort.Init(); err != nil {
		return err.Error()
	}
	return cudaUnavailable()
}

// cudaUnavailable asks the loaded ONNX Runtime for its CUDA execution
// provider and returns why it cannot have one ("" when it can). The CPU
// builds `make setup` installs refuse at one of these two steps. Call
// after ort.Init.
func cudaUnavailable() string {
	po, err := onnxruntime.NewCUDAProviderOptions()
	if err != nil {
		return "CPU-only ONNX Runtime build: " + err.Error()
	}
	defer po.Destroy()
	so, err := onnxruntime.NewSessionOptions()
	if err != nil {
		return err.Error()
	}
	defer so.Destroy()
	if err := so.AppendExecutionProviderCUDA(po); err != nil {
		return "CPU-only ONNX Runtime build: " + err.Error()
	}
	return ""
}
