package router

import (
	"context"
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
)

// TestRecommendStreamDrain: a router told to stop (Drain) answers the
// requests a stream has taken, takes none of those sent after, and ends
// the stream Unavailable at once, whether the client keeps sending or
// sends nothing: the stream kept taking requests until the server's
// grace period cut it (dropping its window's answers) or held the
// shutdown that long when idle.
func TestRecommendStreamDrain(t *testing.T) {
	for _, tc := range []struct {
		name string
		// sent is how many requests the client sends before the drain,
		// and keeps sending after it.
		sent int
	}{
		{name: "idle", sent: 0},
		{name: "busy", sent: 6},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cn := &fakeCN{delay: 50 * time.Millisecond}
			r := newRouter(t, Options{StreamWindow: 4}, cn)
			// Bounded: a stream the drain does not end fails the test
			// (DeadlineExceeded) instead of hanging it.
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			conn := dialTest(t, serveInproc(t, func(s *grpc.Server) { prismv1.RegisterRecommenderServer(s, r) }))
			st, err := prismv1.NewRecommenderClient(conn).RecommendStream(ctx)
			if err != nil {
				t.Fatal(err)
			}
			stopSending := make(chan struct{})
			defer close(stopSending)
			if tc.sent > 0 {
				go func() {
					for i := 0; ; i++ {
						select {
						case <-stopSending:
							return
						default:
						}
						req := request(3)
						req.RequestId = fmt.Sprint("r", i)
						if st.Send(req) != nil {
							return
						}
						time.Sleep(5 * time.Millisecond)
					}
				}()
				for cn.running.Load() < 2 {
					time.Sleep(time.Millisecond)
				}
			}
			took := cn.calls.Load()
			drained := time.Now()
			r.Drain()
			answered := 0
			for {
				resp, err := st.Recv()
				if err != nil {
					if status.Code(err) != codes.Unavailable {
						t.Fatalf("after %d answers the stream ended with %v, want Unavailable", answered, err)
					}
					break
				}
				if resp.GetError() != nil || resp.GetRequestId() != fmt.Sprint("r", answered) {
					t.Fatalf("answer %d: %v", answered, resp)
				}
				answered++
			}
			if took := time.Since(drained); took > time.Second {
				t.Errorf("the stream ended %v after the drain", took)
			}
			// Every request taken (its lookup started) was answered, and
			// at most the window's were started after the drain.
			calls := cn.calls.Load()
			if int64(answered) < took || int64(answered) != calls {
				t.Errorf("%d answered; %d lookups before the drain, %d in all", answered, took, calls)
			}
			if calls > took+4 {
				t.Errorf("%d lookups started after the drain, want at most the window (4)", calls-took)
			}
			if n := r.streams.Load(); n != 0 {
				t.Errorf("%d streams still counted open", n)
			}
		})
	}
}
