package serve

import (
	"context"
	"log/slog"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/internal/auth"
)

// Announce keeps a worker registered with the router at routerAddr until
// ctx ends, then leaves. info is called at each heartbeat for the
// worker's current load. It returns at once; the heartbeat runs in the
// background and survives the router being away (it retries). opts are
// added to the connection to the router (tests dial over bufconn).
func Announce(ctx context.Context, routerAddr string, info func() *prismv1.WorkerInfo, log *slog.Logger, opts ...grpc.DialOption) (done <-chan struct{}) {
	return AnnounceWith(ctx, routerAddr, info, nil, log, opts...)
}

// AnnounceWith is Announce that hands every answer of the router to
// answered (when set), in the heartbeat's goroutine: an embedding worker
// learns there the dense workers it may send to
// (AnnounceResponse.dense_addrs; always the whole list: a list the
// router left out as unchanged is filled in from the loop's last,
// heldList). AnnounceRouters runs one of these loops per router and
// merges their answers.
func AnnounceWith(ctx context.Context, routerAddr string, info func() *prismv1.WorkerInfo, answered func(*prismv1.AnnounceResponse), log *slog.Logger, opts ...grpc.DialOption) (done <-chan struct{}) {
	heard := func(_ string, resp *prismv1.AnnounceResponse, err error) {
		if err == nil && answered != nil {
			answered(resp)
		}
	}
	return announceLoop(ctx, routerAddr, info, heard, nil, nil, log, opts...)
}

// announceBackoff bounds how long a worker waits between attempts to
// reach a router it lost: gRPC's default grows to two minutes, so a host
// whose link came back would rejoin minutes late.
var announceBackoff = grpc.ConnectParams{
	Backoff:           backoff.Config{BaseDelay: 250 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 2 * time.Second},
	MinConnectTimeout: 2 * time.Second,
}

// staleAfter is how many heartbeats in a row must fail before the loop
// says its router may be gone (announceLoop's stale).
const staleAfter = 2

// announceLoop is the heartbeat to one router: heard gets every
// attempt's answer or error (not once ctx has ended), in the loop's
// goroutine. stale, when set, is called at every failed attempt once
// staleAfter have failed in a row: the router's address may have died
// (AnnounceRouters then resolves its name again); it must not block.
// prompt, when set, has the loop announce out of turn when asked
// (Prompt.Ask), no sooner than PromptGap after its last announcement
// began.
func announceLoop(ctx context.Context, routerAddr string, info func() *prismv1.WorkerInfo, heard func(id string, resp *prismv1.AnnounceResponse, err error), stale func(), prompt *Prompt, log *slog.Logger, opts ...grpc.DialOption) (done <-chan struct{}) {
	ch := make(chan struct{})
	var prompted *nudge
	if prompt != nil {
		prompted = newNudge()
		prompt.bind(prompted)
	}
	go func() {
		defer close(ch)
		defer prompt.unbind(prompted)
		dial := func() (*grpc.ClientConn, error) {
			return grpc.NewClient(routerAddr, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithConnectParams(announceBackoff)}, opts...)...)
		}
		conn, err := dial()
		if err != nil {
			log.Error("registry: bad router address", "router", routerAddr, "err", err)
			return
		}
		defer func() { conn.Close() }()
		reg := prismv1.NewRegistryClient(conn)
		interval := time.Second
		fails := 0 // attempts failed in a row
		// list is the dense workers' list this router told the worker
		// last, which its answers leave out while it is unchanged.
		var list heldList
		// leave tells the router this worker goes: the router then sends
		// it nothing new and lets its calls in flight finish. Tried
		// twice, 2 s each (an Announce's bound): a Leave lost (a
		// loaded router or host answering past the bound) left the
		// worker registered until it expired three heartbeats later,
		// and the router then abandoned its calls in flight (silent.go)
		// where a drain lets them finish.
		leave := func(w *prismv1.WorkerInfo) {
			for try := range 2 {
				lctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
				_, err := reg.Leave(lctx, &prismv1.LeaveRequest{Id: w.GetId()})
				cancel()
				if err == nil || status.Code(err) == codes.NotFound || try == 1 {
					switch status.Code(err) {
					case codes.OK, codes.NotFound:
					case codes.Unavailable:
						// No router to tell: it stopped first (prism up
						// stops the router before its workers) or is
						// out of reach; no warning at every shutdown.
						log.Debug("registry: leave failed: router unavailable", "router", routerAddr, "err", err)
					default:
						log.Warn("registry: leave failed; the router drops this worker when its heartbeats expire", "router", routerAddr, "err", err)
					}
					return
				}
			}
		}
		for {
			w := info()
			// This announcement answers the asks made so far.
			prompted.started()
			began := time.Now()
			// Not cancelled with ctx: an Announce cancelled at shutdown
			// may still be handled by the router after the Leave below,
			// registering the worker again once it has gone (a drained
			// worker then listed until its heartbeats expire). Its answer
			// comes first, within the 2 s, and the Leave after it.
			actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
			resp, err := reg.Announce(actx, &prismv1.AnnounceRequest{Worker: w, DenseHeld: list.held()})
			cancel()
			switch {
			case ctx.Err() != nil:
				// Shutting down: the answer is not heard; Leave below.
			case err != nil:
				// Said once staleAfter have failed in a row, not at the
				// first: one missed heartbeat is a router restarting or
				// stopping before its workers (prism up stops the router
				// first, and every worker's next heartbeat failed then).
				if fails++; fails == staleAfter {
					if hint := auth.MismatchHint(err.Error()); hint != "" {
						log.Warn("registry: announce failed; retrying"+hint, "router", routerAddr, "failed_in_a_row", fails, "err", err)
					} else {
						log.Warn("registry: announce failed; retrying", "router", routerAddr, "failed_in_a_row", fails, "err", err)
					}
				} else if fails < staleAfter {
					log.Debug("registry: announce failed; retrying", "router", routerAddr, "err", err)
				}
				heard(w.GetId(), nil, err)
				if fails >= staleAfter {
					// The connection may be one whose peer is cut off
					// without a reset (a link down on the way): TCP keeps
					// it open, retransmitting with a backoff that grows
					// to minutes, so heartbeats sent on it would reach
					// the router that long after the link is back. Dial
					// anew: a new connection is tried within
					// announceBackoff's bounds.
					if c, err := dial(); err == nil {
						conn.Close()
						conn, reg = c, prismv1.NewRegistryClient(c)
					}
					if stale != nil {
						stale()
					}
				}
			case err == nil:
				if fails >= staleAfter {
					log.Info("registry: announced again", "router", routerAddr)
				}
				fails = 0
				if held := list.held(); !list.take(resp) {
					log.Warn("registry: the router left out a dense workers' list this worker does not hold; keeping the last, asking for the whole list at the next heartbeat", "router", routerAddr, "held", held.String(), "answer", resp.GetDenseVersion().String())
				}
				heard(w.GetId(), resp, nil)
				if resp.GetHeartbeatMs() > 0 {
					interval = time.Duration(resp.GetHeartbeatMs()) * time.Millisecond
				}
			}
			timer := time.NewTimer(interval)
			select {
			case <-ctx.Done():
				timer.Stop()
				leave(w)
				return
			case <-timer.C:
			case <-prompted.asked():
				// Out of turn, but not sooner than PromptGap after the
				// last one began; asks made meanwhile are this one
				// (started takes them).
				timer.Stop()
				if wait := time.Until(began.Add(PromptGap)); wait > 0 {
					timer.Reset(wait)
					select {
					case <-ctx.Done():
						timer.Stop()
						leave(w)
						return
					case <-timer.C:
					}
				}
			}
		}
	}()
	return ch
}
