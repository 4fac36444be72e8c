package gpuserve

import (
	onnxruntime "github.com/yalue/onnxruntime_go"
)

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
