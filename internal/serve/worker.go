package serve

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"

	"github.com/prism-serve/prism/api/prismv1"
)

// WorkerOptions say how a tier worker joins the system around Serve.
type WorkerOptions struct {
	// Router, when set, is the routers whose registries the worker
	// announces itself to while it serves: addresses HOST:PORT separated
	// by commas, a name standing for every router it resolves to
	// (AnnounceRouters). It leaves them as soon as ctx ends, while Serve
	// still finishes the RPCs in flight: the routers stop sending it
	// work first.
	Router string
	// AdvertiseAddr is the address announced, "" to choose one
	// (Advertise: the listen host when it is specific, else the address
	// of the interface that routes to the router).
	AdvertiseAddr string
	// ResolveEvery is how often router names are resolved again
	// (default DefaultResolveEvery).
	ResolveEvery time.Duration
	// Linger is how long a stopping worker keeps taking new calls after
	// it has left every router's registry (default DefaultLinger): calls
	// a router (or an embedding worker) sent on its way just before the
	// leave still arrive, and are served instead of refused.
	Linger time.Duration
	// ID is the worker's registry id (WorkerID of the server's name when
	// ""). A router that refuses it as bound to another certificate
	// (IDTaken) has the worker announce under a new one, to every router.
	ID string
	// Info is the worker's registry entry at each heartbeat, given its
	// id and the address it advertises.
	Info func(id, addr string) *prismv1.WorkerInfo
	// Ready is called once the worker is listening (and announcing),
	// with the address it advertises: the tier prints its ready line
	// there (internal/readyline).
	Ready func(addr string)
	// Announced, when set, hears the routers' answers to the worker's
	// announcements, merged into one (dense_addrs: the union of the
	// routers' lists; see answers): the embedding tier learns the dense
	// workers there.
	Announced func(*prismv1.AnnounceResponse)
	// Prompt, when set, has the worker announce to its routers out of
	// turn on Prompt.Ask (RouterOptions.Prompt): the embedding tier asks
	// when a lookup names a dense worker it has not been told of.
	Prompt *Prompt
	// Drained, when set, runs after Serve returns (in-flight RPCs are
	// done or cut off): the dense tier drains its batchers there.
	Drained func()
	// DialOptions are added to the connection to the router: its TLS
	// credentials (the worker's certificate) when the cluster runs TLS.
	DialOptions []grpc.DialOption
}

// ServeWorker runs a tier worker: it announces it to the routers, calls
// Ready, serves until ctx ends or serving fails, then leaves the
// registries. It returns once the worker has left, promptly even when
// serving failed while ctx was still live.
func (s *Server) ServeWorker(ctx context.Context, o WorkerOptions) error {
	routers, err := ParseRouters(o.Router)
	if err == nil {
		var addr string
		addr, err = Advertise{Flag: o.AdvertiseAddr, Listen: s.opts.Addr, Bound: s.Addr(), Routers: routers}.Addr()
		if err == nil {
			return s.serveWorker(ctx, o, routers, addr)
		}
	}
	// Nothing served: close the listeners bound by New.
	s.lis.Close()
	if s.mlis != nil {
		s.mlis.Close()
	}
	return fmt.Errorf("%s: %w", s.name, err)
}

func (s *Server) serveWorker(ctx context.Context, o WorkerOptions, routers []string, addr string) error {
	actx, cancel := context.WithCancel(ctx)
	defer cancel()
	var announced <-chan struct{}
	if len(routers) > 0 {
		s.Log.Info("announcing", "routers", routers, "advertise", addr)
		var id atomic.Pointer[string]
		first := cmp.Or(o.ID, WorkerID(s.name))
		id.Store(&first)
		taken := func(refused string, err error) {
			old := id.Load()
			if refused != *old {
				// An earlier id's refusal, from another router. (Not told
				// by the message: it names the id cut to 64 characters,
				// the same for ids of a long host name.)
				return
			}
			next := WorkerID(s.name)
			if next == *old {
				next += "/1"
			}
			if id.CompareAndSwap(old, &next) {
				s.Log.Warn("registry: a router has this worker's id bound to another certificate (it restarted, and another worker of the role took the id first); announcing under a new id", "old_id", *old, "id", next, "err", err)
			}
		}
		announced = AnnounceRouters(actx, RouterOptions{
			Routers: routers, Info: func() *prismv1.WorkerInfo { return o.Info(*id.Load(), addr) }, Answered: o.Announced,
			ResolveEvery: o.ResolveEvery, DialOptions: o.DialOptions, Prompt: o.Prompt, Taken: taken, Log: s.Log,
		})
	} else {
		s.Log.Warn("no --router: this worker registers with no router, so only a caller given its address uses it", "addr", addr)
	}
	if o.Ready != nil {
		o.Ready(addr)
	}
	// Serving stops only after the worker has left the routers'
	// registries (the announce loops send Leave when ctx ends) and
	// lingered: stopping at once refused calls already on their way.
	sctx, stopServing := context.WithCancel(context.Background())
	defer stopServing()
	served := make(chan struct{})
	defer close(served)
	go func() {
		select {
		case <-ctx.Done():
		case <-served:
			return
		}
		if announced != nil {
			<-announced
			linger := o.Linger
			if linger <= 0 {
				linger = DefaultLinger
			}
			select {
			case <-time.After(linger):
			case <-served:
			}
		}
		stopServing()
	}()
	err := s.Serve(sctx)
	if o.Drained != nil {
		o.Drained()
	}
	// Ends the heartbeat when Serve failed with ctx still live: waiting
	// for ctx alone would hang start-up errors forever.
	cancel()
	if announced != nil {
		<-announced
	}
	return err
}

// DefaultLinger is WorkerOptions.Linger's default.
const DefaultLinger = 500 * time.Millisecond

// WorkerID names one worker process in the registry: its tier, host,
// process id and start time, so a restarted worker is a new entry.
func WorkerID(tier string) string {
	host, _ := os.Hostname()
	return fmt.Sprintf("%s/%s/%d/%d", tier, host, os.Getpid(), time.Now().UnixNano())
}
