package threadcpu

import (
	"runtime"
	"testing"
)

// TestNowAdvances: spinning on a locked thread advances its CPU time.
func TestNowAdvances(t *testing.T) {
	if !Supported() {
		t.Skip("no thread CPU clock on this platform")
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	start := Now()
	x := 0
	for Now()-start < 2e6 { // 2 ms of CPU
		x++
	}
	if x == 0 || Now() <= start {
		t.Fatalf("thread CPU time did not advance")
	}
}
