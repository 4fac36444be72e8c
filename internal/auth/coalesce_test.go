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
