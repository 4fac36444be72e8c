// Package devices finds the NVIDIA GPUs and MIG slices of a machine
// through NVML and plans one dense worker per device (pinned with
// CUDA_VISIBLE_DEVICES). It is apart from the dense tier's server so that
// prism up can plan workers without linking a tier; tests run it against
// go-nvml's simulated DGX A100.
package devices

import (
	"fmt"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// DeviceKind says what a worker runs on.
type DeviceKind string

const (
	KindGPU DeviceKind = "gpu"
	KindMIG DeviceKind = "mig"
	KindCPU DeviceKind = "cpu"
)

// Device is one place a dense worker can run.
type Device struct {
	Kind DeviceKind `json:"kind"`
	// Index is the GPU's NVML index (the parent's for a MIG slice).
	Index int    `json:"index"`
	UUID  string `json:"uuid"`
	Name  string `json:"name"`
	// MemoryBytes is the device's (or slice's) memory.
	MemoryBytes uint64 `json:"memory_bytes"`
	// For MIG slices: the parent GPU and the instance ids.
	ParentUUID        string `json:"parent_uuid,omitempty"`
	GpuInstanceID     int    `json:"gpu_instance_id,omitempty"`
	ComputeInstanceID int    `json:"compute_instance_id,omitempty"`
}

// VisibleDevices is the CUDA_VISIBLE_DEVICES value that pins a worker
// process to this device: the GPU's UUID, or MIG-<uuid> for a slice
// (NVML already reports MIG UUIDs with the prefix).
func (d Device) VisibleDevices() string {
	switch d.Kind {
	case KindCPU:
		return ""
	case KindMIG:
		if !strings.HasPrefix(d.UUID, "MIG-") {
			return "MIG-" + d.UUID
		}
	}
	return d.UUID
}

// Discovery is what Discover found.
type Discovery struct {
	Devices []Device
	// NoDriver is set, with the reason, when NVML could not start: the
	// dense tier then serves on the CPU execution provider.
	NoDriver      string
	DriverVersion string
	// Skipped says, per GPU, why it has no device here: MIG enabled with
	// no MIG devices created, where CUDA sees nothing of that GPU.
	Skipped []string
	// started: NVML started, so the driver is there (NoDriver, if set,
	// then says why none of its GPUs is usable).
	started bool
}

// WhyCPU says why d leaves the dense tier on the CPU, from NoDriver: "no
// NVIDIA driver (...)" when NVML could not start, "no usable NVIDIA
// device (...)" when it did, the driver there, and listed no GPU or only
// GPUs in MIG mode without MIG devices; "" when d has a device.
func (d Discovery) WhyCPU() string {
	switch {
	case d.NoDriver == "":
		return ""
	case d.started:
		return fmt.Sprintf("no usable NVIDIA device (%s)", d.NoDriver)
	}
	return fmt.Sprintf("no NVIDIA driver (%s)", d.NoDriver)
}

// Discover lists the GPUs NVML reports and, on GPUs with MIG enabled, the
// MIG slices instead of the whole GPU (a MIG-enabled GPU cannot run work
// outside its slices). With no driver it returns one CPU device and the
// reason. lib is nvml.New() in production and a simulated server in tests.
func Discover(lib nvml.Interface) (Discovery, error) {
	// After a failed Init any further NVML call may kill the process, so
	// nothing else is called unless Init succeeds.
	if ret := lib.Init(); ret != nvml.SUCCESS {
		return Discovery{Devices: []Device{{Kind: KindCPU, Name: "cpu"}}, NoDriver: fmt.Sprintf("NVML init: %s", nvml.ErrorString(ret))}, nil
	}
	defer lib.Shutdown()
	d := Discovery{started: true}
	if v, ret := lib.SystemGetDriverVersion(); ret == nvml.SUCCESS {
		d.DriverVersion = v
	}
	n, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return d, fmt.Errorf("nvml device count: %s", nvml.ErrorString(ret))
	}
	for i := range n {
		dev, ret := lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			return d, fmt.Errorf("nvml device %d: %s", i, nvml.ErrorString(ret))
		}
		gpu := Device{Kind: KindGPU, Index: i}
		if gpu.UUID, ret = dev.GetUUID(); ret != nvml.SUCCESS {
			return d, fmt.Errorf("nvml device %d uuid: %s", i, nvml.ErrorString(ret))
		}
		gpu.Name, _ = dev.GetName()
		if mem, ret := dev.GetMemoryInfo(); ret == nvml.SUCCESS {
			gpu.MemoryBytes = mem.Total
		}
		current, _, ret := dev.GetMigMode()
		if ret != nvml.SUCCESS || current != nvml.DEVICE_MIG_ENABLE {
			// NOT_SUPPORTED on GPUs without MIG: a whole GPU.
			d.Devices = append(d.Devices, gpu)
			continue
		}
		slices, err := migSlices(dev, gpu)
		if err != nil {
			return d, err
		}
		if len(slices) == 0 {
			d.Skipped = append(d.Skipped, fmt.Sprintf("GPU %d (%s) has MIG enabled and no MIG devices: create GPU and compute instances (nvidia-smi mig -i %d -cgi <profiles> -C) or disable MIG", i, gpu.UUID, i))
		}
		d.Devices = append(d.Devices, slices...)
	}
	if len(d.Devices) == 0 {
		d.Devices = []Device{{Kind: KindCPU, Name: "cpu"}}
		d.NoDriver = "NVML reports no GPUs"
		if len(d.Skipped) > 0 {
			d.NoDriver = strings.Join(d.Skipped, "; ")
		}
	}
	return d, nil
}

func migSlices(dev nvml.Device, gpu Device) ([]Device, error) {
	max, ret := dev.GetMaxMigDeviceCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("nvml device %d: max MIG devices: %s", gpu.Index, nvml.ErrorString(ret))
	}
	var out []Device
	for j := range max {
		mig, ret := dev.GetMigDeviceHandleByIndex(j)
		if ret == nvml.ERROR_NOT_FOUND || ret == nvml.ERROR_INVALID_ARGUMENT {
			continue // an empty slot
		}
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("nvml device %d MIG %d: %s", gpu.Index, j, nvml.ErrorString(ret))
		}
		s := Device{Kind: KindMIG, Index: gpu.Index, ParentUUID: gpu.UUID}
		if s.UUID, ret = mig.GetUUID(); ret != nvml.SUCCESS {
			return nil, fmt.Errorf("nvml device %d MIG %d uuid: %s", gpu.Index, j, nvml.ErrorString(ret))
		}
		s.Name, _ = mig.GetName()
		if mem, ret := mig.GetMemoryInfo(); ret == nvml.SUCCESS {
			s.MemoryBytes = mem.Total
		}
		s.GpuInstanceID, _ = mig.GetGpuInstanceId()
		s.ComputeInstanceID, _ = mig.GetComputeInstanceId()
		out = append(out, s)
	}
	return out, nil
}

// Worker is one dense worker to start: a device and the environment that
// pins the worker's process to it.
type Worker struct {
	Device Device
	Env    []string
}

// Plan gives one worker per device.
func Plan(d Discovery) []Worker {
	var out []Worker
	for _, dev := range d.Devices {
		w := Worker{Device: dev}
		if v := dev.VisibleDevices(); v != "" {
			w.Env = []string{"CUDA_VISIBLE_DEVICES=" + v}
		} else {
			w.Env = []string{"CUDA_VISIBLE_DEVICES="}
		}
		out = append(out, w)
	}
	return out
}
