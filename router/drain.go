package router

import (
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// errDraining ends a RecommendStream whose router was told to stop: the
// requests it answered are done, the ones sent after them were not
// taken (the client sends them again, to another router).
var errDraining = status.Error(codes.Unavailable, "router shutting down: the requests sent after the last one answered on this stream were not taken; send them again on a new stream (another router)")

// Drain tells the router it is stopping (SIGTERM): RecommendStream
// streams take no more requests, answer the ones they took and end
// Unavailable, so a stream does not hold the server's graceful stop to
// its grace period while it keeps sending (and its window's requests
// are then cut off unanswered), and the client resends the rest
// elsewhere at once. Unary calls are the server's to drain. Safe to
// call more than once.
func (r *Router) Drain() {
	r.drainOnce.Do(func() { close(r.draining) })
}
