// Package mig plans MIG layouts: which legal partition each GPU gets and
// which service each slice serves, so every service's throughput demand is
// met with the fewest GPUs (the MIG-serving problem).
package mig

import (
	"fmt"
	"slices"
	"strings"
)

// Profile is a GPU instance profile and where it may start.
type Profile struct {
	Name    string
	Compute int // compute slices (the "g")
	// Size is the memory slices the instance occupies from its start.
	Size   int
	Starts []int
	// NVMLID is the nvml GPU_INSTANCE_PROFILE_* id of the profile.
	NVMLID int
	// MemGB is the instance's memory as the profile's name gives it, in
	// GB (the 10 of 1g.10gb): NVIDIA's rounding, so what a process can
	// allocate in it is a little less.
	MemGB float64
}

// Model is a MIG-capable GPU and its placement rules.
type Model struct {
	Name          string
	MemSlices     int
	ComputeSlices int
	Profiles      []Profile
}

// nvml GPU_INSTANCE_PROFILE_* ids (go-nvml's constants), kept here so this
// package does not link NVML.
const (
	nvml1Slice     = 0
	nvml2Slice     = 1
	nvml3Slice     = 2
	nvml4Slice     = 3
	nvml7Slice     = 4
	nvml1SliceRev2 = 9
)

// profiles are the six GPU instance profiles every A100, H100 and H200
// has, named by the memory of 1, 2, 4 and 8 memory slices in GB as
// NVIDIA names them: rounded, so not always multiples of the 1-slice size
// (1g.12gb, 1g.24gb, 3g.47gb, 7g.94gb on an H100-94GB).
func profiles(gb1, gb2, gb4, gb8 int) []Profile {
	gb := func(g, m int) string { return fmt.Sprintf("%dg.%dgb", g, m) }
	return []Profile{
		{Name: gb(1, gb1), Compute: 1, Size: 1, Starts: []int{0, 1, 2, 3, 4, 5, 6}, NVMLID: nvml1Slice, MemGB: float64(gb1)},
		{Name: gb(1, gb2), Compute: 1, Size: 2, Starts: []int{0, 2, 4, 6}, NVMLID: nvml1SliceRev2, MemGB: float64(gb2)},
		{Name: gb(2, gb2), Compute: 2, Size: 2, Starts: []int{0, 2, 4}, NVMLID: nvml2Slice, MemGB: float64(gb2)},
		{Name: gb(3, gb4), Compute: 3, Size: 4, Starts: []int{0, 4}, NVMLID: nvml3Slice, MemGB: float64(gb4)},
		{Name: gb(4, gb4), Compute: 4, Size: 4, Starts: []int{0}, NVMLID: nvml4Slice, MemGB: float64(gb4)},
		{Name: gb(7, gb8), Compute: 7, Size: 8, Starts: []int{0}, NVMLID: nvml7Slice, MemGB: float64(gb8)},
	}
}

// The placement rules of NVIDIA's MIG user guide: 8 memory slices and 7
// compute slices on every model; only the memory sizes (and so the
// profile names) differ.
var (
	A100_40GB  = Model{Name: "A100-40GB", MemSlices: 8, ComputeSlices: 7, Profiles: profiles(5, 10, 20, 40)}
	A100_80GB  = Model{Name: "A100-80GB", MemSlices: 8, ComputeSlices: 7, Profiles: profiles(10, 20, 40, 80)}
	H100_80GB  = Model{Name: "H100-80GB", MemSlices: 8, ComputeSlices: 7, Profiles: profiles(10, 20, 40, 80)}
	H100_94GB  = Model{Name: "H100-94GB", MemSlices: 8, ComputeSlices: 7, Profiles: profiles(12, 24, 47, 94)}
	H200_141GB = Model{Name: "H200-141GB", MemSlices: 8, ComputeSlices: 7, Profiles: profiles(18, 35, 71, 141)}
)

// Models are the GPU models ModelByName knows.
var Models = []Model{A100_40GB, A100_80GB, H100_80GB, H100_94GB, H200_141GB}

// ModelByName finds a model ("A100-40GB", "a100-80gb", "H200-141GB").
func ModelByName(name string) (Model, error) {
	var names []string
	for _, m := range Models {
		if strings.EqualFold(m.Name, name) {
			return m, nil
		}
		names = append(names, m.Name)
	}
	return Model{}, fmt.Errorf("unknown GPU model %q (known: %s)", name, strings.Join(names, ", "))
}

// Instance is one GPU instance of a layout.
type Instance struct {
	Profile int // index into Model.Profiles
	Start   int
}

// Layout is the partition of one GPU.
type Layout []Instance

// Legal reports why a layout breaks the model's placement rules, or nil.
func (m Model) Legal(l Layout) error {
	var used [16]bool
	compute := 0
	for _, in := range l {
		if in.Profile < 0 || in.Profile >= len(m.Profiles) {
			return fmt.Errorf("profile index %d out of range", in.Profile)
		}
		p := m.Profiles[in.Profile]
		if !slices.Contains(p.Starts, in.Start) {
			return fmt.Errorf("%s cannot start at memory slice %d (allowed %v)", p.Name, in.Start, p.Starts)
		}
		for s := in.Start; s < in.Start+p.Size; s++ {
			if s >= m.MemSlices || used[s] {
				return fmt.Errorf("%s at %d overlaps memory slice %d", p.Name, in.Start, s)
			}
			used[s] = true
		}
		compute += p.Compute
	}
	if compute > m.ComputeSlices {
		return fmt.Errorf("layout uses %d compute slices, %s has %d", compute, m.Name, m.ComputeSlices)
	}
	return nil
}

// String names a layout like "3g.20gb@0+2g.10gb@4+1g.5gb@6".
func (m Model) String(l Layout) string {
	var parts []string
	for _, in := range l {
		parts = append(parts, fmt.Sprintf("%s@%d", m.Profiles[in.Profile].Name, in.Start))
	}
	return strings.Join(parts, "+")
}

// MaximalLayouts lists every legal layout to which no instance can be
// added, deduplicated by the multiset of profiles (where an instance sits
// does not change what it serves). A plan never needs any other layout:
// an unused slice costs nothing.
func (m Model) MaximalLayouts() []Layout {
	seen := map[string]bool{}
	var out []Layout
	var cur Layout
	var rec func(minProfile, minStart int)
	rec = func(minProfile, minStart int) {
		extended := false
		for pi := range m.Profiles {
			for _, st := range m.Profiles[pi].Starts {
				cand := append(slices.Clone(cur), Instance{pi, st})
				if m.Legal(cand) != nil {
					continue
				}
				extended = true
				// Canonical order: instances by start, so each set is built once.
				if st < minStart {
					continue
				}
				cur = cand
				rec(pi, st)
				cur = cur[:len(cur)-1]
			}
		}
		if !extended {
			key := m.countsKey(cur)
			if !seen[key] {
				seen[key] = true
				out = append(out, slices.Clone(cur))
			}
		}
	}
	rec(0, 0)
	return out
}

func (m Model) countsKey(l Layout) string {
	c := make([]int, len(m.Profiles))
	for _, in := range l {
		c[in.Profile]++
	}
	return fmt.Sprint(c)
}
