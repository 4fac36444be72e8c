package devices

import (
	"fmt"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
)

// enableMIG turns MIG on for GPU i of the simulated DGX A100 and creates
// the given GPU-instance profiles, each with one compute instance
// spanning it, then adds the MIG device-handle calls the simulator lacks.
func enableMIG(t *testing.T, s *dgxa100.Server, i int, profiles ...int) {
	t.Helper()
	dev := s.Devices[i].(*dgxa100.Device)
	if ret, _ := dev.SetMigMode(nvml.DEVICE_MIG_ENABLE); ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	type slice struct {
		gi, ci int
		uuid   string
		mem    uint64
		name   string
	}
	var created []slice
	for _, p := range profiles {
		info, ret := dev.GetGpuInstanceProfileInfo(p)
		if ret != nvml.SUCCESS {
			t.Fatalf("profile %d: %v", p, ret)
		}
		gi, ret := dev.CreateGpuInstance(&info)
		if ret != nvml.SUCCESS {
			t.Fatal(ret)
		}
		ciInfo, ret := gi.GetComputeInstanceProfileInfo(ciProfileFor(p), nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		if ret != nvml.SUCCESS {
			t.Fatalf("ci profile for %d: %v", p, ret)
		}
		ci, ret := gi.CreateComputeInstance(&ciInfo)
		if ret != nvml.SUCCESS {
			t.Fatal(ret)
		}
		giI, _ := gi.GetInfo()
		ciI, _ := ci.GetInfo()
		created = append(created, slice{gi: int(giI.Id), ci: int(ciI.Id), uuid: fmt.Sprintf("MIG-%d-%d-%d", i, giI.Id, ciI.Id), mem: info.MemorySizeMB << 20, name: fmt.Sprintf("A100-SXM4-40GB MIG %dg", info.SliceCount)})
	}
	dev.GetMaxMigDeviceCountFunc = func() (int, nvml.Return) { return 7, nvml.SUCCESS }
	dev.GetMigDeviceHandleByIndexFunc = func(n int) (nvml.Device, nvml.Return) {
		if n >= len(created) {
			return nil, nvml.ERROR_NOT_FOUND
		}
		c := created[n]
		return &mock.Device{
			GetUUIDFunc:              func() (string, nvml.Return) { return c.uuid, nvml.SUCCESS },
			GetNameFunc:              func() (string, nvml.Return) { return c.name, nvml.SUCCESS },
			GetMemoryInfoFunc:        func() (nvml.Memory, nvml.Return) { return nvml.Memory{Total: c.mem}, nvml.SUCCESS },
			GetGpuInstanceIdFunc:     func() (int, nvml.Return) { return c.gi, nvml.SUCCESS },
			GetComputeInstanceIdFunc: func() (int, nvml.Return) { return c.ci, nvml.SUCCESS },
		}, nvml.SUCCESS
	}
}

// ciProfileFor maps a GPU-instance profile to the compute-instance
// profile that spans it.
func ciProfileFor(gi int) int {
	switch gi {
	case nvml.GPU_INSTANCE_PROFILE_1_SLICE:
		return nvml.COMPUTE_INSTANCE_PROFILE_1_SLICE
	case nvml.GPU_INSTANCE_PROFILE_2_SLICE:
		return nvml.COMPUTE_INSTANCE_PROFILE_2_SLICE
	case nvml.GPU_INSTANCE_PROFILE_3_SLICE:
		return nvml.COMPUTE_INSTANCE_PROFILE_3_SLICE
	case nvml.GPU_INSTANCE_PROFILE_4_SLICE:
		return nvml.COMPUTE_INSTANCE_PROFILE_4_SLICE
	}
	return nvml.COMPUTE_INSTANCE_PROFILE_7_SLICE
}

func TestDiscoverWholeGPUs(t *testing.T) {
	s := dgxa100.New()
	for _, d := range s.Devices {
		d.(*dgxa100.Device).GetMigModeFunc = func() (int, int, nvml.Return) { return 0, 0, nvml.SUCCESS }
	}
	got, err := Discover(s)
	if err != nil {
		t.Fatal(err)
	}
	if got.NoDriver != "" || len(got.Devices) != 8 || got.DriverVersion != "550.54.15" {
		t.Fatalf("%+v", got)
	}
	for i, d := range got.Devices {
		if d.Kind != KindGPU || d.Index != i || !strings.HasPrefix(d.UUID, "GPU-") || d.MemoryBytes != 42949672960 {
			t.Errorf("device %d: %+v", i, d)
		}
	}
	w := Plan(got)
	if len(w) != 8 || w[3].Env[0] != "CUDA_VISIBLE_DEVICES="+got.Devices[3].UUID {
		t.Errorf("plan %+v", w)
	}
}

// TestDiscoverMIG: GPU 0 split 3g+2g+1g+1g, GPU 1 into 7 x 1g; the rest whole.
func TestDiscoverMIG(t *testing.T) {
	s := dgxa100.New()
	enableMIG(t, s, 0, nvml.GPU_INSTANCE_PROFILE_3_SLICE, nvml.GPU_INSTANCE_PROFILE_2_SLICE, nvml.GPU_INSTANCE_PROFILE_1_SLICE, nvml.GPU_INSTANCE_PROFILE_1_SLICE)
	enableMIG(t, s, 1, nvml.GPU_INSTANCE_PROFILE_1_SLICE, nvml.GPU_INSTANCE_PROFILE_1_SLICE, nvml.GPU_INSTANCE_PROFILE_1_SLICE, nvml.GPU_INSTANCE_PROFILE_1_SLICE, nvml.GPU_INSTANCE_PROFILE_1_SLICE, nvml.GPU_INSTANCE_PROFILE_1_SLICE, nvml.GPU_INSTANCE_PROFILE_1_SLICE)
	got, err := Discover(s)
	if err != nil {
		t.Fatal(err)
	}
	count := map[DeviceKind]int{}
	for _, d := range got.Devices {
		count[d.Kind]++
	}
	if count[KindMIG] != 11 || count[KindGPU] != 6 {
		t.Fatalf("kinds %v, want 11 MIG slices and 6 whole GPUs", count)
	}
	first := got.Devices[0]
	if first.Kind != KindMIG || first.ParentUUID != s.Devices[0].(*dgxa100.Device).UUID || first.MemoryBytes != 19968<<20 {
		t.Errorf("first slice %+v", first)
	}
	for _, w := range Plan(got) {
		if w.Device.Kind == KindMIG && !strings.HasPrefix(w.Env[0], "CUDA_VISIBLE_DEVICES=MIG-") {
			t.Errorf("MIG worker env %v", w.Env)
		}
	}
}

// TestNoDriver: a failed Init means CPU, and no other NVML call is made.
func TestNoDriver(t *testing.T) {
	calls := 0
	lib := &mock.Interface{
		InitFunc: func() nvml.Return { return nvml.ERROR_LIBRARY_NOT_FOUND },
		DeviceGetCountFunc: func() (int, nvml.Return) {
			calls++
			return 0, nvml.SUCCESS
		},
	}
	got, err := Discover(lib)
	if err != nil {
		t.Fatal(err)
	}
	if got.NoDriver == "" || len(got.Devices) != 1 || got.Devices[0].Kind != KindCPU || calls != 0 {
		t.Fatalf("%+v, calls after failed Init: %d", got, calls)
	}
	if w := Plan(got); len(w) != 1 || w[0].Env[0] != "CUDA_VISIBLE_DEVICES=" {
		t.Errorf("plan %+v", w)
	}
	if why := got.WhyCPU(); why != "no NVIDIA driver (NVML init: ERROR_LIBRARY_NOT_FOUND)" {
		t.Errorf("WhyCPU %q", why)
	}
}

// TestDriverWithoutGPUs: NVML starts and lists no GPU. The CPU device,
// and a reason that does not blame a missing driver: it was said as
// "no NVIDIA driver (NVML reports no GPUs)".
func TestDriverWithoutGPUs(t *testing.T) {
	got, err := Discover(driverWithoutGPUs())
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Devices) != 1 || got.Devices[0].Kind != KindCPU || got.DriverVersion != "580.65.06" {
		t.Fatalf("%+v", got)
	}
	if why := got.WhyCPU(); why != "no usable NVIDIA device (NVML reports no GPUs)" {
		t.Errorf("WhyCPU %q", why)
	}
}

func driverWithoutGPUs() nvml.Interface {
	return &mock.Interface{
		InitFunc:                   func() nvml.Return { return nvml.SUCCESS },
		ShutdownFunc:               func() nvml.Return { return nvml.SUCCESS },
		SystemGetDriverVersionFunc: func() (string, nvml.Return) { return "580.65.06", nvml.SUCCESS },
		DeviceGetCountFunc:         func() (int, nvml.Return) { return 0, nvml.SUCCESS },
	}
}

// TestDiscoverRealLibrary runs discovery against the machine's own NVML:
// GPUs where there is a driver, one CPU device (and the reason) where not.
// It must never crash the process either way.
func TestDiscoverRealLibrary(t *testing.T) {
	got, err := Discover(nvml.New())
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Devices) == 0 {
		t.Fatal("no devices, not even the CPU")
	}
	t.Logf("driver %q no-driver %q devices %+v", got.DriverVersion, got.NoDriver, got.Devices)
}

// TestDiscoverMIGWithoutInstances: a GPU with MIG enabled and no MIG
// devices offers CUDA nothing; discovery says which GPU and why instead
// of dropping it silently or blaming a missing GPU.
func TestDiscoverMIGWithoutInstances(t *testing.T) {
	for _, tc := range []struct {
		name     string
		empty    []int // GPUs with MIG enabled and no instances
		wantMIG  int
		wantGPU  int
		noDriver string // substring of NoDriver, "" for none
	}{
		{name: "one of eight", empty: []int{0}, wantGPU: 7},
		{name: "all eight", empty: []int{0, 1, 2, 3, 4, 5, 6, 7}, noDriver: "GPU 7 (GPU-"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := dgxa100.New()
			for _, i := range tc.empty {
				enableMIG(t, s, i)
			}
			got, err := Discover(s)
			if err != nil {
				t.Fatal(err)
			}
			count := map[DeviceKind]int{}
			for _, d := range got.Devices {
				count[d.Kind]++
			}
			if count[KindMIG] != tc.wantMIG || count[KindGPU] != tc.wantGPU {
				t.Errorf("kinds %v, want %d MIG and %d GPU", count, tc.wantMIG, tc.wantGPU)
			}
			if len(got.Skipped) != len(tc.empty) {
				t.Fatalf("skipped %q, want one line per GPU %v", got.Skipped, tc.empty)
			}
			for k, i := range tc.empty {
				uuid := s.Devices[i].(*dgxa100.Device).UUID
				if !strings.Contains(got.Skipped[k], uuid) || !strings.Contains(got.Skipped[k], "MIG enabled and no MIG devices") {
					t.Errorf("skipped[%d] = %q, want GPU %d's UUID %s and the reason", k, got.Skipped[k], i, uuid)
				}
			}
			if (got.NoDriver != "") != (tc.noDriver != "") || !strings.Contains(got.NoDriver, tc.noDriver) {
				t.Errorf("NoDriver %q, want %q", got.NoDriver, tc.noDriver)
			}
			// The driver is there: what the tiers print says so.
			if why := got.WhyCPU(); (why != "") != (tc.noDriver != "") || tc.noDriver != "" && !strings.HasPrefix(why, "no usable NVIDIA device (GPU 0 (GPU-") {
				t.Errorf("WhyCPU %q", why)
			}
		})
	}
}
