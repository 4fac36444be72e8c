package main

import (
	"runtime"
	"testing"

	"github.com/prism-serve/prism/cpuserve/store"
)

// raiseProcs leaves GOMAXPROCS alone without a budget and when it was set
// by hand; with a budget and a hot tier that misses, it gives two Ps per
// miss reader.
func TestRaiseProcs(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	st, err := store.Open(t.TempDir(), &store.Options{HotBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	mb := &memBudget{}
	var none *memBudget
	if from, to := none.raiseProcs(st, 4); from != 1 || to != 1 {
		t.Fatalf("no budget: %d -> %d", from, to)
	}
	t.Setenv("GOMAXPROCS", "1")
	if from, to := mb.raiseProcs(st, 4); to != from {
		t.Fatalf("GOMAXPROCS set by hand: %d -> %d", from, to)
	}
	t.Setenv("GOMAXPROCS", "")
	complete := st.Preloaded().Complete
	from, to := mb.raiseProcs(st, 3)
	switch {
	case complete && to != from:
		t.Fatalf("a complete hot tier reads no misses: %d -> %d", from, to)
	case !complete && (from != 1 || to != 6 || runtime.GOMAXPROCS(0) != 6):
		t.Fatalf("misses from the device, 3 readers: %d -> %d (now %d), want 1 -> 6", from, to, runtime.GOMAXPROCS(0))
	}
	if from, to := mb.raiseProcs(st, 1); to != from {
		t.Fatalf("already above 2 per reader: %d -> %d", from, to)
	}
}
