package serve

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/internal/grpctest"
)

// blackHole is a link that can be cut without a reset, as a link down
// between two hosts is: while cut, bytes written are lost and new
// connections fail; a connection that lost bytes stays silent for good
// (TCP would retransmit them only after a backoff that grows to minutes).
type blackHole struct {
	bn  *grpctest.Net
	cut atomic.Bool
}

func (b *blackHole) dial(ctx context.Context, addr string) (net.Conn, error) {
	if b.cut.Load() {
		return nil, errors.New("connect: no answer (link down)")
	}
	c, err := b.bn.DialContext(ctx, addr)
	if err != nil {
		return nil, err
	}
	return &holeConn{Conn: c, link: b}, nil
}

type holeConn struct {
	net.Conn
	link *blackHole
	mu   sync.Mutex
	dead bool
}

func (c *holeConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.link.cut.Load() {
		c.dead = true
	}
	if c.dead {
		return len(p), nil
	}
	return c.Conn.Write(p)
}

// TestAnnounceAfterLinkDown: a worker whose link to the router was cut
// without a reset announces again soon after the link is back, on a new
// connection, not on the one whose bytes were lost.
func TestAnnounceAfterLinkDown(t *testing.T) {
	var bn grpctest.Net
	r := &fakeRouter{}
	serveRegistry(t, &bn, "10.0.0.9:7000", r)
	link := &blackHole{bn: &bn}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := Announce(ctx, "10.0.0.9:7000", func() *prismv1.WorkerInfo { return workerInfo("w:1") }, quiet(), grpc.WithContextDialer(link.dial))
	eventually(t, "announced", func() bool { n, _, _ := r.counts(); return n > 0 })

	link.cut.Store(true)
	// Past staleAfter failed heartbeats (2 s each).
	time.Sleep(time.Duration(staleAfter)*2*time.Second + time.Second)
	before, _, _ := r.counts()
	link.cut.Store(false)
	eventually(t, "announced again after the link came back", func() bool { n, _, _ := r.counts(); return n > before })
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Announce did not end after its context")
	}
}
