// Package grpctest runs gRPC servers and their clients in one test
// process over grpc-go's bufconn, as grpc-go's own tests do: no ports, no
// loopback, nothing another test binary on the machine can take or slow
// down. Tests that are about the network itself (a listen address, a
// real /metrics port, a child process) keep real TCP.
//
// A Net is a set of named in-memory listeners. A listener's address is a
// gRPC target ("passthrough:///name"), so it can go wherever a real
// address would (a worker's announced address, LookupRequest.dense_addr)
// and any client given the Net's DialOption reaches it.
package grpctest

import (
	"context"
	"fmt"
	"net"
	"sync"
	"syscall"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"
)

// bufSize is each connection's in-memory buffer; a larger message (a
// 463 KB cut-tensor frame) just waits for the reader, as on a socket.
const bufSize = 1 << 20

// Net is an in-memory network. The zero value is ready to use.
type Net struct {
	mu  sync.Mutex
	lis map[string]*listener
}

// Target is the gRPC target of the listener called name.
func Target(name string) string { return "passthrough:///" + name }

// Listen makes the listener called name; its Addr is Target(name). The
// server that serves it closes it (grpc.Server.Stop does). Listening
// twice on one live name fails, as on a real port.
func (n *Net) Listen(name string) (net.Listener, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.lis == nil {
		n.lis = map[string]*listener{}
	}
	if l, ok := n.lis[name]; ok && !l.isClosed() {
		return nil, fmt.Errorf("listen %q: address in use", name)
	}
	l := &listener{Listener: bufconn.Listen(bufSize), addr: addr(Target(name)), closed: make(chan struct{})}
	n.lis[name] = l
	return l, nil
}

// MustListen is Listen for a test: it fails the test on an error.
func (n *Net) MustListen(tb testing.TB, name string) net.Listener {
	tb.Helper()
	l, err := n.Listen(name)
	if err != nil {
		tb.Fatal(err)
	}
	return l
}

// DialContext connects to the listener an address names: the endpoint
// gRPC's passthrough resolver hands a dialer ("name"). An unknown name,
// or a closed listener, is refused (ECONNREFUSED, as from a real port
// nobody listens on), so clients see Unavailable.
func (n *Net) DialContext(ctx context.Context, address string) (net.Conn, error) {
	n.mu.Lock()
	l := n.lis[address]
	n.mu.Unlock()
	if l == nil || l.isClosed() {
		return nil, &net.OpError{Op: "dial", Net: "bufconn", Addr: addr(address), Err: syscall.ECONNREFUSED}
	}
	return l.DialContext(ctx)
}

// DialOption routes a client's connections through n: give it to every
// client that should reach n's listeners, including a server's own
// outgoing connections (cpuserve's Options.DialOptions).
func (n *Net) DialOption() grpc.DialOption { return grpc.WithContextDialer(n.DialContext) }

// Dial is a client connection to target (a listener's Addr), closed when
// the test ends.
func (n *Net) Dial(tb testing.TB, target string, opts ...grpc.DialOption) *grpc.ClientConn {
	tb.Helper()
	opts = append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()), n.DialOption()}, opts...)
	cc, err := grpc.NewClient(target, opts...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { cc.Close() })
	return cc
}

type listener struct {
	*bufconn.Listener
	addr   addr
	once   sync.Once
	closed chan struct{}
}

func (l *listener) Addr() net.Addr { return l.addr }

func (l *listener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return l.Listener.Close()
}

func (l *listener) isClosed() bool {
	select {
	case <-l.closed:
		return true
	default:
		return false
	}
}

var _ net.Listener = (*listener)(nil)

type addr string

func (addr) Network() string  { return "bufconn" }
func (a addr) String() string { return string(a) }

var _ net.Addr = addr("")
