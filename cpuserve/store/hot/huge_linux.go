//go:build linux

package hot

import (
	"syscall"
	"unsafe"
)

// adviseHuge asks the kernel for transparent huge pages under a large
// slice (where THP is "madvise", as here): the hot tier's arena and slot
// maps are read at random, and with 4 KiB pages nearly every row costs a
// TLB miss on top of its cache miss. Advice only: a kernel that refuses
// leaves the memory as it was. Call before the memory is first written.
//
// The advice outlives the slice: when a tier is rebuilt (a version switch)
// and its arena collected, the range stays huge-page-eligible in the Go
// heap, and memory Go hands back to the OS may be collapsed into huge
// pages again. Bounded by the arena's size; an arena mapped outside the
// Go heap (mmap/munmap per tier) would remove it.
func adviseHuge(p unsafe.Pointer, n uintptr) {
	const huge = 2 << 20
	if n < 2*huge {
		return
	}
	b := unsafe.Slice((*byte)(p), n)
	off := (huge - uintptr(p)%huge) % huge
	end := off + (n-off)&^(huge-1)
	syscall.Madvise(b[off:end], syscall.MADV_HUGEPAGE)
}
