// Package threadcpu reads the CPU time of the calling OS thread, for
// benchmarks on a shared machine: wall time per operation there grows
// with every other process's load, a thread's CPU time much less.
//
// A benchmark locks its goroutine to its thread (runtime.LockOSThread)
// and reports Since(start)/b.N as a metric of its own.
package threadcpu

import "time"

// Now is the calling thread's CPU time so far (0 where the platform
// does not tell: Supported is false).
func Now() time.Duration { return now() }

// Supported says whether Now reads a thread's CPU time here.
func Supported() bool { return supported }
