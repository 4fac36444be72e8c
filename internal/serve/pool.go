package serve

import (
	"math/bits"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/experimental"
	"google.golang.org/grpc/mem"

	"github.com/prism-serve/prism/internal/tracing"
)

// Pool is the buffer pool of Prism's gRPC servers and internal clients:
// power-of-two tiers from 512 B to 4 MiB, like gRPC's default pool, but
// buffers are not zeroed when handed out. gRPC's default pool clears the
// whole capacity of every buffer it hands out (defence in depth against a
// read that fills less than it claims); gRPC fills exactly the length it
// asks for before anything reads it, and clearing the 1 MiB buffer under
// each 463 KB cut-tensor frame cost the embedding worker 8% of its CPU
// (profiled under `make bench-serve`).
var Pool mem.BufferPool = newDirtyPool()

// ServerOptions install Pool and Codec on a server, and tracing's
// handler when tracing is on (tracing.Setup first).
func ServerOptions() []grpc.ServerOption {
	return append([]grpc.ServerOption{experimental.BufferPool(Pool), grpc.ForceServerCodecV2(Codec),
		grpc.InitialWindowSize(streamWindow), grpc.InitialConnWindowSize(connWindow)}, tracing.ServerOptions()...)
}

// Flow-control windows of a server's connections: large enough that a
// 463 KB cut-tensor frame arrives without stalling on WINDOW_UPDATEs
// (gRPC's 64 KiB start, which its BDP estimate hardly grows on a fast
// link, made the sender wait and the receiver send an update every
// 16 KiB, each its own TLS record and syscall under mTLS). A peer can
// still have at most connWindow unread bytes per connection in flight.
const (
	streamWindow = 1 << 20
	connWindow   = 4 << 20
)

func experimentalPool() grpc.DialOption { return experimental.WithBufferPool(Pool) }

const (
	minShift = 9  // 512 B
	maxShift = 22 // 4 MiB
)

type dirtyPool struct {
	tiers [maxShift - minShift + 1]sync.Pool
}

func newDirtyPool() *dirtyPool { return &dirtyPool{} }

// tier is the index of the smallest tier holding size bytes, or -1 when
// size is over the largest.
func tier(size int) int {
	if size <= 1<<minShift {
		return 0
	}
	s := bits.Len(uint(size - 1)) // 2^s >= size
	if s > maxShift {
		return -1
	}
	return s - minShift
}

func (p *dirtyPool) Get(length int) *[]byte {
	t := tier(length)
	if t < 0 {
		b := make([]byte, length)
		return &b
	}
	if v, ok := p.tiers[t].Get().(*[]byte); ok {
		*v = (*v)[:length]
		return v
	}
	b := make([]byte, length, 1<<(t+minShift))
	return &b
}

func (p *dirtyPool) Put(b *[]byte) {
	c := cap(*b)
	t := tier(c)
	if t < 0 || c != 1<<(t+minShift) {
		return // not one of ours (or over the largest tier): the GC takes it
	}
	p.tiers[t].Put(b)
}
