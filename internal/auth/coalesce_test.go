package auth

import (
	"bytes"
	"context"
	"crypto/tls"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// countingConn counts the writes to the socket under a TLS connection.
type countingConn struct {
	net.Conn
	writes atomic.Int64
}

func (c *countingConn) Write(b []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(b)
}

// readingServer serves ServerTLS(f) (with gRPC's ALPN) on loopback and
// sends every connection's bytes, once it is closed, to got.
func readingServer(t *testing.T, f Files) (addr string, got chan []byte) {
	conf, err := ServerTLS(f, ServerTLSOptions{})
	if err != nil {
		t.Fatal(err)
	}
	conf = ServerConfigFor(conf, func(c *tls.Config) { c.NextProtos = []string{"h2"} })
	lis, err := tls.Listen("tcp", "127.0.0.1:0", conf)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lis.Close() })
	got = make(chan []byte, 4)
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				c.SetDeadline(time.Now().Add(20 * time.Second))
				b, _ := io.ReadAll(c)
				got <- b
			}()
		}
	}()
	return lis.Addr().String(), got
}

// TestClientCoalescesRecords: a Write through ClientCredentials'
// connection reaches the socket in one write, however many TLS records
// it makes (crypto/tls alone writes each 16 KiB record by itself), and
// the server reads the bytes as written, with Writes from many
// goroutines at once each whole.
func TestClientCoalescesRecords(t *testing.T) {
	dir := t.TempDir()
	if err := InitCerts(dir, CertOptions{}); err != nil {
		t.Fatal(err)
	}
	addr, got := readingServer(t, FilesFor(dir, Dense))
	creds, err := ClientCredentials(FilesFor(dir, Embedding), Dense)
	if err != nil {
		t.Fatal(err)
	}
	dial := func() (net.Conn, *countingConn) {
		raw, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		counted := &countingConn{Conn: raw}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		conn, _, err := creds.ClientHandshake(ctx, addr, counted)
		if err != nil {
			t.Fatal(err)
		}
		return conn, counted
	}

	rng := rand.New(rand.NewPCG(1, 2))
	msg := make([]byte, 100_000) // 7 records
	for i := range msg {
		msg[i] = byte(rng.Uint32())
	}
	conn, counted := dial()
	before := counted.writes.Load()
	if n, err := conn.Write(msg); n != len(msg) || err != nil {
		t.Fatalf("Write: %d, %v", n, err)
	}
	if w := counted.writes.Load() - before; w != 1 {
		t.Errorf("one Write of %d bytes made %d writes to the socket, want 1", len(msg), w)
	}
	conn.Close()
	if b := <-got; !bytes.Equal(b, msg) {
		t.Fatalf("server read %d bytes, not the %d written", len(b), len(msg))
	}

	// Writes of many goroutines: each arrives whole, none lost.
	const writers, each, size = 8, 10, 40_000
	conn, _ = dial()
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := range each {
				m := bytes.Repeat([]byte{byte(w*each + k)}, size)
				if _, err := conn.Write(m); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	conn.Close()
	b := <-got
	if len(b) != writers*each*size {
		t.Fatalf("server read %d bytes, want %d", len(b), writers*each*size)
	}
	seen := map[byte]bool{}
	for off := 0; off < len(b); off += size {
		m := b[off : off+size]
		if !bytes.Equal(m, bytes.Repeat(m[:1], size)) {
			t.Fatalf("write at %d arrived mixed with another", off)
		}
		seen[m[0]] = true
	}
	if len(seen) != writers*each {
		t.Fatalf("%d distinct writes arrived, want %d", len(seen), writers*each)
	}

	// Over a TCP socket the connection still offers the socket's
	// syscall.Conn, as gRPC's TLS credentials' does (channelz).
	raw, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sc, _, err := creds.ClientHandshake(ctx, addr, raw)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := sc.(syscall.Conn); !ok {
		t.Errorf("%T over a TCP socket is no syscall.Conn", sc)
	}
	sc.Close()
	<-got
}

// stalledServer serves ServerTLS(f) on loopback, completes each
// connection's handshake and then never reads, so that a client's
// writes fill the socket's buffers and block.
func stalledServer(t *testing.T, f Files) string {
	conf, err := ServerTLS(f, ServerTLSOptions{})
	if err != nil {
		t.Fatal(err)
	}
	conf = ServerConfigFor(conf, func(c *tls.Config) { c.NextProtos = []string{"h2"} })
	lis, err := tls.Listen("tcp", "127.0.0.1:0", conf)
	if err != nil {
		t.Fatal(err)
	}
	var conns []net.Conn
	var mu sync.Mutex
	t.Cleanup(func() {
		lis.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			go c.(*tls.Conn).Handshake()
		}
	}()
	return lis.Addr().String()
}

func coalescedDial(t *testing.T, dir, addr string) net.Conn {
	creds, err := ClientCredentials(FilesFor(dir, Embedding), Dense)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, _, err := creds.ClientHandshake(ctx, addr, raw)
	if err != nil {
		t.Fatal(err)
	}
	return conn
}

// TestCoalescedCloseBreaksBlockedWrite: Close while a Write is blocked
// on a peer that reads nothing closes the socket at once and the Write
// returns, as crypto/tls's Close does (gRPC closes a blackholed
// transport so); it does not first wait out the 5 s write deadline
// crypto/tls sets to send its close_notify alert behind the Write.
func TestCoalescedCloseBreaksBlockedWrite(t *testing.T) {
	dir := t.TempDir()
	if err := InitCerts(dir, CertOptions{}); err != nil {
		t.Fatal(err)
	}
	addr := stalledServer(t, FilesFor(dir, Dense))
	conn := coalescedDial(t, dir, addr)
	done := make(chan error, 1)
	go func() {
		_, err := conn.Write(make([]byte, 64<<20)) // more than the socket buffers hold
		done <- err
	}()
	time.Sleep(500 * time.Millisecond) // the Write is blocked on the socket
	select {
	case err := <-done:
		t.Fatalf("a 64 MiB Write to a peer that reads nothing returned: %v", err)
	default:
	}
	t0 := time.Now()
	conn.Close()
	closed := time.Since(t0)
	select {
	case err := <-done:
		if err == nil {
			t.Errorf("the blocked Write returned no error after Close")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the blocked Write did not return after Close")
	}
	if closed > time.Second {
		t.Errorf("Close with a Write blocked took %v, want it at once", closed.Round(time.Millisecond))
	}
}

// TestCoalescedWriteErrorIsPermanent: once a Write's records failed to
// reach the socket, later Writes fail too, as on crypto/tls's own
// connection: the records' sequence numbers went on, so records written
// after the lost ones would not decrypt at the peer.
func TestCoalescedWriteErrorIsPermanent(t *testing.T) {
	dir := t.TempDir()
	if err := InitCerts(dir, CertOptions{}); err != nil {
		t.Fatal(err)
	}
	addr := stalledServer(t, FilesFor(dir, Dense))
	conn := coalescedDial(t, dir, addr)
	defer conn.Close()
	conn.SetWriteDeadline(time.Now().Add(-time.Second))
	if _, err := conn.Write([]byte("lost")); err == nil {
		t.Fatal("Write past its deadline succeeded")
	}
	conn.SetWriteDeadline(time.Time{})
	if n, err := conn.Write([]byte("after")); err == nil {
		t.Errorf("Write after a failed one: %d bytes, no error; want the first error again", n)
	}
}
