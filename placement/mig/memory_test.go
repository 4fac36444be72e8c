package mig

import (
	"math"
	"testing"
)

// A service's instances only land on slices with at least the memory it
// needs, in the heuristic and the exact plan alike; a service that no
// slice holds is an error naming it, its need and the largest slice.
func TestMemoryPerSlice(t *testing.T) {
	svc := func(m Model, name string, demand, mem float64) Service {
		return Service{Name: name, Demand: demand, Throughput: DefaultThroughput(m, 1), MemGB: mem}
	}
	for _, tc := range []struct {
		name    string
		m       Model
		svcs    []Service
		gpus    int    // GPUs both planners use, when no error
		wantErr string // the error both planners return
	}{
		// 0.4 GPUs fit three 1g.10gb slices (0.408); 15 GB does not.
		{name: "15GB off 10GB slices", m: H100_80GB, svcs: []Service{svc(H100_80GB, "dlrm", 0.4, 15)}, gpus: 1},
		{name: "15GB beside one that fits all", m: A100_80GB, svcs: []Service{svc(A100_80GB, "small", 0.4, 0), svc(A100_80GB, "dlrm", 0.4, 15)}, gpus: 1},
		{name: "15GB on 1g.18gb", m: H200_141GB, svcs: []Service{svc(H200_141GB, "dlrm", 0.4, 15)}, gpus: 1},
		{name: "20GB off 1g.18gb", m: H200_141GB, svcs: []Service{svc(H200_141GB, "dlrm", 0.4, 20)}, gpus: 1},
		{name: "exactly a 1g.10gb", m: A100_80GB, svcs: []Service{svc(A100_80GB, "a", 0.4, 10), svc(A100_80GB, "b", 0.4, 10)}, gpus: 1},
		// Only 7g slices hold 50 GB: 1.3 GPUs take two whole ones.
		{name: "50GB on whole GPUs", m: A100_80GB, svcs: []Service{svc(A100_80GB, "big", 1.3, 50), svc(A100_80GB, "small", 0.4, 0)}, gpus: 3},
		{name: "fits nothing", m: A100_80GB, svcs: []Service{svc(A100_80GB, "small", 0.4, 0), svc(A100_80GB, "huge", 0.5, 100)},
			wantErr: `service "huge" needs 100 GB per instance; the largest A100-80GB slice that serves it, 7g.80gb, has 80 GB`},
		{name: "fits nothing on A100-40GB", m: A100_40GB, svcs: []Service{svc(A100_40GB, "dlrm", 0.2, 45)},
			wantErr: `service "dlrm" needs 45 GB per instance; the largest A100-40GB slice that serves it, 7g.40gb, has 40 GB`},
		{name: "no demand, no check", m: A100_40GB, svcs: []Service{svc(A100_40GB, "idle", 0, 45), svc(A100_40GB, "a", 0.3, 0)}, gpus: 1},
		{name: "negative memory", m: A100_80GB, svcs: []Service{svc(A100_80GB, "a", 0.4, -1)}, wantErr: `service "a": bad memory -1 GB`},
		{name: "NaN memory", m: A100_80GB, svcs: []Service{svc(A100_80GB, "a", 0.4, math.NaN())}, wantErr: `service "a": bad memory NaN GB`},
	} {
		for _, planner := range []struct {
			name string
			run  func(Model, []Service) (*Plan, error)
		}{
			{"greedy", Greedy},
			{"exact", func(m Model, s []Service) (*Plan, error) { return Exact(m, s, 6) }},
		} {
			p, err := planner.run(tc.m, tc.svcs)
			if tc.wantErr != "" {
				if err == nil || err.Error() != tc.wantErr {
					t.Errorf("%s %s: error %v, want %q", tc.name, planner.name, err, tc.wantErr)
				}
				continue
			}
			if err != nil {
				t.Errorf("%s %s: %v", tc.name, planner.name, err)
				continue
			}
			for g, gpu := range p.GPUs {
				for j, s := range gpu.Assign {
					if s < 0 {
						continue
					}
					if pr := tc.m.Profiles[gpu.Layout[j].Profile]; pr.MemGB < tc.svcs[s].MemGB {
						t.Errorf("%s %s: gpu %d puts %s (%g GB) on %s", tc.name, planner.name, g, tc.svcs[s].Name, tc.svcs[s].MemGB, pr.Name)
					}
				}
			}
			if err := p.Validate(tc.m, tc.svcs); err != nil {
				t.Errorf("%s %s: %v", tc.name, planner.name, err)
			}
			if len(p.GPUs) != tc.gpus {
				t.Errorf("%s %s: %d GPUs, want %d", tc.name, planner.name, len(p.GPUs), tc.gpus)
			}
		}
	}
}

// Validate refuses a plan that puts a service on a slice smaller than it
// needs: the plan made without the memory figure puts 0.4 GPUs on three
// 1g.10gb slices.
func TestValidateChecksMemory(t *testing.T) {
	m := H100_80GB
	svcs := []Service{{Name: "dlrm", Demand: 0.4, Throughput: DefaultThroughput(m, 1)}}
	p, err := Greedy(m, svcs)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Validate(m, svcs); err != nil {
		t.Fatal(err)
	}
	svcs[0].MemGB = 15
	want := `gpu 0: service "dlrm" needs 15 GB, 1g.10gb has 10`
	if err := p.Validate(m, svcs); err == nil || err.Error() != want {
		t.Fatalf("validate: %v, want %q", err, want)
	}
}
