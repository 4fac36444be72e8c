package serve

import (
	"context"
	"fmt"
	"os"
	"time"

	"google.golang.org/grpc"

	"github.com/prism-serve/prism/api/prismv1"
)

// WorkerOptions say how a tier worker joins the system around Serve.
type WorkerOptions struct {
	// Router, when set, is the registry the worker announces itself to
	// while it serves. It leaves as soon as ctx ends, while Serve still
	// finishes the RPCs in flight: the router stops sending it work
	// first.
	Router string
	// Info is the worker's registry entry at each heartbeat, given the
	// server's address.
	Info func(addr string) *prismv1.WorkerInfo
	// Ready is called once the worker is listening (and announcing):
	// the tier prints its ready line there (internal/readyline).
	Ready func(addr string)
	// Announced, when set, hears every answer of the router to the
	// worker's announcements (the embedding tier learns the dense
	// workers there).
	Announced func(*prismv1.AnnounceResponse)
	// Drained, when set, runs after Serve returns (in-flight RPCs are
	// done or cut off): the dense tier drains its batchers there.
	Drained func()
	// DialOptions are added to the connection to the router: its TLS
	// credentials (the worker's certificate) when the cluster runs TLS.
	DialOptions []grpc.DialOption
}

// ServeWorker runs a tier worker: it announces it to the router, calls
// Ready, serves until ctx ends or serving fails, then leaves the
// registry. It returns once the worker has left, promptly even when
// serving failed while ctx was still live.
func (s *Server) ServeWorker(ctx context.Context, o WorkerOptions) error {
	actx, cancel := context.WithCancel(ctx)
	defer cancel()
	var announced <-chan struct{}
	if o.Router != "" {
		addr := s.Addr()
		announced = AnnounceWith(actx, o.Router, func() *prismv1.WorkerInfo { return o.Info(addr) }, o.Announced, s.Log, o.DialOptions...)
	}
	if o.Ready != nil {
		o.Ready(s.Addr())
	}
	err := s.Serve(ctx)
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

// WorkerID names one worker process in the registry: its tier, host,
// process id and start time, so a restarted worker is a new entry.
func WorkerID(tier string) string {
	host, _ := os.Hostname()
	return fmt.Sprintf("%s/%s/%d/%d", tier, host, os.Getpid(), time.Now().UnixNano())
}
