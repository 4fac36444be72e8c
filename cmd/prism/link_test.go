package main

import (
	"net"
	"sync"
	"testing"
)

// tcpLink forwards TCP connections to a target, as a link between two
// hosts on the way. cut takes it down for good: it forwards nothing
// more, in either direction, and holds every connection open, new ones
// unanswered (a link down with no reset). pause holds what is sent, in
// either direction, and resume delivers it, in order (a peer too
// starved, or a path too slow, to get its bytes through for a while,
// losing nothing).
type tcpLink struct {
	addr string
	down chan struct{} // closed when cut
	mu   sync.Mutex
	open chan struct{} // closed while the link forwards
}

func newTCPLink(t *testing.T, target string) *tcpLink {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := &tcpLink{addr: lis.Addr().String(), down: make(chan struct{}), open: make(chan struct{})}
	close(l.open)
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		lis.Close()
		l.resume()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	pipe := func(dst, src net.Conn) {
		buf := make([]byte, 32<<10)
		for {
			n, err := src.Read(buf)
			if err != nil {
				select {
				case <-l.down:
					// Cut: the other side hears nothing of it.
				default:
					dst.Close()
				}
				return
			}
			l.mu.Lock()
			open := l.open
			l.mu.Unlock()
			select {
			case <-open:
			case <-l.down:
			}
			select {
			case <-l.down:
				continue // dropped
			default:
			}
			if _, err := dst.Write(buf[:n]); err != nil {
				return
			}
		}
	}
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			select {
			case <-l.down:
				continue // held, never answered
			default:
			}
			up, err := net.Dial("tcp", target)
			if err != nil {
				c.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, up)
			mu.Unlock()
			go pipe(up, c)
			go pipe(c, up)
		}
	}()
	return l
}

func (l *tcpLink) cut() { close(l.down) }

func (l *tcpLink) pause() {
	l.mu.Lock()
	defer l.mu.Unlock()
	select {
	case <-l.open:
		l.open = make(chan struct{})
	default:
	}
}

func (l *tcpLink) resume() {
	l.mu.Lock()
	defer l.mu.Unlock()
	select {
	case <-l.open:
	default:
		close(l.open)
	}
}
