package gpuserve

import (
	"log/slog"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"

	"github.com/prism-serve/prism/gpuserve/devices"
)

// TestCUDAVisibleDevicesHidesAll: NVML lists the GPUs whatever
// CUDA_VISIBLE_DEVICES says, but set empty (or to -1) it leaves CUDA
// none, so the worker serves on the CPU and says why, before it asks
// ONNX Runtime for a CUDA provider it could not use (with a CUDA build it
// took the first GPU, and its CUDA sessions then found no device).
func TestCUDAVisibleDevicesHidesAll(t *testing.T) {
	dir := tinyPlan(t)
	for _, v := range []string{"", "-1", " -1,0"} {
		t.Run(v, func(t *testing.T) {
			t.Setenv("CUDA_VISIBLE_DEVICES", v)
			var logs strings.Builder
			s, err := New(Options{Plans: []string{dir}, NVML: dgxa100.New(), Logger: slog.New(slog.NewTextHandler(&logs, nil))})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			if s.Device() != "cpu" || s.cuda || !strings.Contains(logs.String(), "hides every NVIDIA device from CUDA: serving on the CPU execution provider") {
				t.Errorf("device %q cuda %v, logs:\n%s", s.Device(), s.cuda, logs.String())
			}
			if s.opts.Batch.MaxBatch != DefaultMaxBatch(false) {
				t.Errorf("max batch %d, want the CPU's %d", s.opts.Batch.MaxBatch, DefaultMaxBatch(false))
			}
		})
	}
}

// TestPinnedDevice: the device a worker reports is the one the first
// entry of its CUDA_VISIBLE_DEVICES names by UUID (GPU or MIG slice),
// the first device when none is set, and none of NVML's when it names a
// device by index (CUDA's order need not be NVML's): before, any value
// that matched no UUID as a whole (an index, a list) reported GPU 0.
func TestPinnedDevice(t *testing.T) {
	d := devices.Discovery{Devices: []devices.Device{
		{Kind: devices.KindGPU, UUID: "GPU-a"},
		{Kind: devices.KindMIG, UUID: "MIG-b"},
		{Kind: devices.KindGPU, UUID: "GPU-c"},
	}}
	for _, tc := range []struct {
		pinned string
		want   string // "" for none
	}{
		{"", "GPU-a"},
		{"GPU-c", "GPU-c"},
		{"MIG-b", "MIG-b"},
		{"GPU-c,GPU-a", "GPU-c"},
		{" MIG-b ", "MIG-b"},
		{"2", ""},
		{"GPU-zzz", ""},
	} {
		dev, ok := pinnedDevice(d, tc.pinned)
		if got := map[bool]string{true: dev.UUID}[ok]; got != tc.want {
			t.Errorf("CUDA_VISIBLE_DEVICES=%q: device %q, want %q", tc.pinned, got, tc.want)
		}
	}
	for v, want := range map[string]bool{"": true, " ": true, "-1": true, "-1,0": true, "0": false, "GPU-a": false, "0,-1": false, "MIG-b": false} {
		if got := cudaHidesAll(v); got != want {
			t.Errorf("cudaHidesAll(%q) = %v, want %v", v, got, want)
		}
	}
}
