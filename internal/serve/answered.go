package serve

import (
	"context"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
)

// A call's failure is the transport's, not its server's answer, when
// the call went out (an attempt began) and no status came back from
// the server: the connection was refused, reset or lost under it. The
// code alone does not tell: a server answers Unavailable too (a worker
// that knows no dense worker yet, a store closing), and an embedding
// worker passes its dense worker's transport failure through as its
// own answer. AnswerStats, a client stats handler, watches for the
// server's trailers on the calls whose context WatchAnswer marked.

// AnswerStats is the client stats handler (grpc.WithStatsHandler) that
// TransportFailed reads: dial the connections whose calls are judged
// with it.
func AnswerStats() grpc.DialOption { return grpc.WithStatsHandler(answerStats{}) }

type answerKey struct{}

// answer is what AnswerStats saw of one call.
type answer struct {
	// began: an attempt began on a connection with AnswerStats;
	// answered: the server sent the call's status (its trailers).
	began, answered atomic.Bool
}

// WatchAnswer marks a call's context for TransportFailed; pass the
// context returned to the call and to TransportFailed after it.
func WatchAnswer(ctx context.Context) context.Context {
	return context.WithValue(ctx, answerKey{}, &answer{})
}

// TransportFailed says whether a call made with ctx (from WatchAnswer,
// on a connection dialled with AnswerStats) failed with err at the
// transport: Unavailable that its server did not answer, while the
// caller's own context is live (a deadline or cancellation of the
// caller is never the server's). False for any answer of the server,
// whatever its code, and for a call not watched.
func TransportFailed(ctx context.Context, err error) bool {
	if err == nil || ctx.Err() != nil || status.Code(err) != codes.Unavailable {
		return false
	}
	a, ok := ctx.Value(answerKey{}).(*answer)
	return ok && a.began.Load() && !a.answered.Load()
}

type answerStats struct{}

func (answerStats) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }

func (answerStats) HandleRPC(ctx context.Context, s stats.RPCStats) {
	a, ok := ctx.Value(answerKey{}).(*answer)
	if !ok {
		return
	}
	switch s.(type) {
	case *stats.Begin:
		a.began.Store(true)
	case *stats.InTrailer:
		a.answered.Store(true)
	}
}

func (answerStats) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }

func (answerStats) HandleConn(context.Context, stats.ConnStats) {}
