package serve

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"runtime/metrics"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestLightHeapGCBoundsALargeLiveHeap: the router's live heap is not
// always small: its update log keeps up to --update-log-bytes (256 MiB)
// of a model's recent embedding updates, and at GOGC=400 the heap grew
// to five times that before a collection (a router under a steady
// update stream: 267 MB live, 1.6 GB resident). With a large live heap
// the collector's headroom stays what 400% of a small heap gives, no
// more than the live heap again: after a collection finds 256 MiB live,
// the GC percent LightHeapGC sets is 100 and the runtime's heap goal
// twice the live heap. (The goal, not a peak measured while garbage is
// allocated: on a CI run's busy cores the sweep lags, and the heap's
// objects, unswept garbage included, read 3.4-3.6x with the goal at 2x.)
// Run in a child process: the collector's settings are the process's.
func TestLightHeapGCBoundsALargeLiveHeap(t *testing.T) {
	if os.Getenv("PRISM_LIGHTGC_CHILD") == "1" {
		lightGCChild()
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestLightHeapGCBoundsALargeLiveHeap$", "-test.count=1")
	cmd.Env = append(os.Environ(), "PRISM_LIGHTGC_CHILD=1", "GOGC=", "GOMEMLIMIT=")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	var live, goal, percent int64
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) == 4 && f[0] == "lightgc" {
			live, _ = strconv.ParseInt(f[1], 10, 64)
			goal, _ = strconv.ParseInt(f[2], 10, 64)
			percent, _ = strconv.ParseInt(f[3], 10, 64)
		}
	}
	if live == 0 {
		t.Fatalf("child said nothing of its heap:\n%s", out)
	}
	t.Logf("live %d MiB, GC percent %d, heap goal %d MiB (%.2fx)", live>>20, percent, goal>>20, float64(goal)/float64(live))
	if percent != 100 || float64(goal) > 2.1*float64(live) {
		t.Errorf("with %d MiB live: GC percent %d and heap goal %d MiB (%.2fx the live heap); want 100 and at most 2.1x", live>>20, percent, goal>>20, float64(goal)/float64(live))
	}
}

// lightGCChild holds 256 MiB live, as a full update log does, and prints
// the GC percent LightHeapGC set after a collection found it live, and
// the heap goal of the collection after.
func lightGCChild() {
	LightHeapGC()
	const live = 256 << 20
	keep := make([]byte, live)
	// A collection sees it live; the target set after it (on the
	// finalizer goroutine) is waited for.
	runtime.GC()
	gogc := []metrics.Sample{{Name: "/gc/gogc:percent"}, {Name: "/gc/heap/goal:bytes"}}
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		metrics.Read(gogc)
		if gogc[0].Value.Uint64() == uint64(lightGCPercent(live)) || time.Now().After(deadline) {
			break
		}
	}
	runtime.GC() // its goal is the new percent's
	metrics.Read(gogc)
	runtime.KeepAlive(keep)
	fmt.Printf("lightgc %d %d %d\n", live, gogc[1].Value.Uint64(), gogc[0].Value.Uint64())
}
