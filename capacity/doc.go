// Package capacity decides when the dense tier borrows workers from a
// lender (idle training GPUs, spare device slots) and when it gives them
// back: capacity loaning for traffic peaks.
//
// The controller is a deterministic core in the style of etcd's raft: it
// starts no goroutine and reads no clock. Each Tick takes the logical time
// and what the caller observed (per model: offered samples/s, p99, queue
// depth and shed rate from the router, the measured capacity of one dense
// worker, the owned and borrowed workers and their states, what the lender
// has idle, reclaims, an optional forecast) and returns decisions: borrow
// N, drain worker W, return worker W, and shed advice when demand is
// uncovered and nothing can be borrowed. The caller carries them out
// through a Provider and the router, and feeds what happened back in the
// next observation. The same controller runs in the what-if simulator
// (capacity/sim) on a simulated clock.
package capacity
