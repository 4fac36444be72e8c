package store

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/prism-serve/prism/internal/diskfull/diskfulltest"
)

// TestDiskMetrics: the store's /metrics carries its disk's free bytes
// and size, so an operator sees the disk filling before updates are
// refused for it (ErrDiskFull); the embedding worker's metrics said
// nothing of its disk.
func TestDiskMetrics(t *testing.T) {
	disk := diskfulltest.New()
	s, err := Open("db", &Options{FS: disk.FS(), HotBytes: -1, MemTableBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	reg := prometheus.NewRegistry()
	reg.MustRegister(NewCollector(s))
	for _, tc := range []struct {
		full        bool
		avail, size float64
	}{{false, 1 << 40, 1 << 40}, {true, 0, 1 << 40}} {
		disk.SetFull(tc.full)
		got := gauges(t, reg, "prism_store_disk_available_bytes", "prism_store_disk_size_bytes")
		if got["prism_store_disk_available_bytes"] != tc.avail || got["prism_store_disk_size_bytes"] != tc.size {
			t.Errorf("disk full %v: %v, want available %v, size %v", tc.full, got, tc.avail, tc.size)
		}
	}
}

// gauges reads the gauges named from reg (absent ones are missing from
// the map).
func gauges(t *testing.T, reg prometheus.Gatherer, names ...string) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, n := range names {
			if mf.GetName() == n && len(mf.GetMetric()) == 1 {
				out[n] = mf.GetMetric()[0].GetGauge().GetValue()
			}
		}
	}
	return out
}
