package auth

import (
	"net"
	"sync"
	"sync/atomic"
	"syscall"

	"google.golang.org/grpc/credentials"
)

// crypto/tls seals a Write in records of at most 16 KiB and writes each
// record to the socket with a write of its own; gRPC hands a connection
// 32 KiB at a time, so a TLS connection made twice the write syscalls of
// a plaintext one for the same bytes (the embedding worker's cut-tensor
// frame: 29 of them for 463 KB against 15). Client connections collect
// the records of one Write and send them with one write: on the
// embedding-to-dense hop (internal/serve's BenchmarkScoreFrameTLSWrites,
// both ends in one process, the connections taking turns) the CPU per
// frame was a median 0.91x that of crypto/tls's own connection (0.78 to
// 1.13, below 1 in 9 runs of 10), on a shared 2-core machine.

// recordWriter is the socket under a coalescing TLS connection: while
// on, what the TLS connection writes is kept, to be written at flush.
type recordWriter struct {
	net.Conn
	mu  sync.Mutex
	on  bool
	buf []byte
}

func (r *recordWriter) Write(b []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.on {
		r.buf = append(r.buf, b...)
		return len(b), nil
	}
	return r.Conn.Write(b)
}

// maxKeptBuffer is the most a connection keeps between writes: gRPC's
// writes (its 32 KiB write buffer, sealed) fit; a larger one is let go.
const maxKeptBuffer = 256 << 10

func (r *recordWriter) start() {
	r.mu.Lock()
	r.on = true
	r.mu.Unlock()
}

// flush writes what was kept since start, and writes through again.
// The lock is held over the write, so that nothing the TLS connection
// writes later (an alert) overtakes it.
func (r *recordWriter) flush() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.on = false
	if len(r.buf) == 0 {
		return nil
	}
	_, err := r.Conn.Write(r.buf)
	if cap(r.buf) > maxKeptBuffer {
		r.buf = nil
	} else {
		r.buf = r.buf[:0]
	}
	return err
}

// coalescedConn is a TLS connection over a recordWriter: each Write's
// records reach the socket in one write. Reads and everything else are
// the TLS connection's.
type coalescedConn struct {
	net.Conn // the TLS connection
	raw      *recordWriter
	mu       sync.Mutex // one Write at a time: the buffer holds one Write's records
	err      error      // under mu: a flush that failed, which later Writes return
	// active interlocks Write and Close as crypto/tls's activeCall does:
	// 2 for each Write under way, bit 0 once closed. The TLS connection
	// cannot see a Write blocked in flush, and its Close would send its
	// close_notify behind it, waiting out a 5 s write deadline.
	active atomic.Int32
}

func (c *coalescedConn) Write(b []byte) (int, error) {
	for {
		x := c.active.Load()
		if x&1 != 0 {
			return 0, net.ErrClosed
		}
		if c.active.CompareAndSwap(x, x+2) {
			break
		}
	}
	defer c.active.Add(-2)
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.err != nil {
		return 0, c.err
	}
	c.raw.start()
	n, err := c.Conn.Write(b)
	if ferr := c.raw.flush(); ferr != nil && err == nil {
		// Not sent: the connection is broken (gRPC closes it), and the
		// TLS connection, which saw its records taken, does not know;
		// as crypto/tls does, later Writes fail (records after the lost
		// ones would not decrypt).
		n, err = 0, ferr
		c.err = ferr
	}
	return n, err
}

// Close closes the TLS connection (sending close_notify), or, when a
// Write is under way, the socket, which breaks the Write, as crypto/tls
// does.
func (c *coalescedConn) Close() error {
	for {
		x := c.active.Load()
		if x&1 != 0 {
			return net.ErrClosed
		}
		if c.active.CompareAndSwap(x, x|1) {
			if x != 0 {
				return c.raw.Conn.Close()
			}
			return c.Conn.Close()
		}
	}
}

// coalescing runs handshake (a TLS client handshake) over raw wrapped
// in a recordWriter, and wraps the connection it returns: each Write's
// records then reach raw in one write. The result implements
// syscall.Conn when raw does, as gRPC's TLS credentials keep it (for
// channelz).
func coalescing(raw net.Conn, handshake func(net.Conn) (net.Conn, credentials.AuthInfo, error)) (net.Conn, credentials.AuthInfo, error) {
	rw := &recordWriter{Conn: raw}
	conn, info, err := handshake(rw)
	if err != nil {
		return nil, nil, err
	}
	c := &coalescedConn{Conn: conn, raw: rw}
	if sc, ok := raw.(syscall.Conn); ok {
		return &coalescedSyscallConn{coalescedConn: c, Conn: sc}, info, nil
	}
	return c, info, nil
}

type coalescedSyscallConn struct {
	*coalescedConn
	syscall.Conn
}
