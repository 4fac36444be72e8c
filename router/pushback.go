package router

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// PushbackKey is the trailer gRPC's retry design (gRFC A6) reads as the
// server's pushback: a non-negative integer, retry after that many
// milliseconds (the client's backoff starts over); a negative one, do
// not retry. grpc-go's retryPolicy honours it, and so does prism
// loadgen --retries.
const PushbackKey = "grpc-retry-pushback-ms"

// refusal is an overload refusal and the pushback it tells a retrying
// client. It answers GRPCStatus with its status, so status.Code and the
// server's status read through it.
type refusal struct {
	st *status.Status
	// wait is when to retry; retry false says not to (a negative
	// pushback): no retry can be admitted and answered in time.
	wait  time.Duration
	retry bool
}

func (e *refusal) Error() string              { return e.st.Err().Error() }
func (e *refusal) GRPCStatus() *status.Status { return e.st }

// value is the pushback trailer's value.
func (e *refusal) value() string {
	if !e.retry {
		return "-1"
	}
	ms := int64(math.Ceil(float64(e.wait) / float64(time.Millisecond)))
	return strconv.FormatInt(max(ms, 0), 10)
}

// withPushback is err (an admission refusal) carrying the pushback of
// wait, retry and known; without a prediction (known false: no rate
// measured yet) err goes as it is, and the client's backoff decides.
func withPushback(err error, wait time.Duration, retry, known bool) error {
	if !known || err == nil {
		return err
	}
	return &refusal{st: status.Convert(err), wait: wait, retry: retry}
}

// setPushback puts the pushback err carries into the call's trailer, if
// it carries one. A unary handler's refusal goes out trailers only,
// which is what grpc-go retries.
func setPushback(ctx context.Context, err error) {
	var r *refusal
	if errors.As(err, &r) {
		_ = grpc.SetTrailer(ctx, metadata.Pairs(PushbackKey, r.value()))
	}
}

// windowRefusal is err, an update refused in a start-up window (the
// router's, a model's, a new election holder's: updates are taken once
// it has heard what the workers hold), carrying the time left in the
// window as its pushback: a retry sent then is taken, where one on a
// client's backoff (grpc-go's starts at a fraction of a second) is
// refused again until the window ends. The message says it too ("retry
// in N ms"), for people and clients that read no trailer.
func windowRefusal(err error, left time.Duration) error { return withPushback(err, left, true, true) }

// relayPushback is err, the refusal of an update this router forwarded
// to the sequencing one, carrying the pushback the sequencer's trailer
// tr gave it, so that the client of this router retries when the
// sequencer said (its start-up window). Several values, or one that is
// no integer, are not relayed: the client's backoff decides.
func relayPushback(err error, tr metadata.MD) error {
	v := tr.Get(PushbackKey)
	if err == nil || len(v) != 1 {
		return err
	}
	ms, perr := strconv.ParseInt(strings.TrimSpace(v[0]), 10, 64)
	if perr != nil {
		return err
	}
	if ms < 0 {
		return withPushback(err, 0, false, true)
	}
	return withPushback(err, time.Duration(ms)*time.Millisecond, true, true)
}

// lateRefusal is err, the refusal of a request for its predicted finish
// (the deadline and fair share rules), telling it not to retry (-1). Its budget is a share of the
// time left to its deadline, and the queue ahead drains no faster than
// the deadline nears: at the whole share (1, the default) no wait makes
// it fit. With the share lowered (deadlines missed lately) a wait would,
// were the queue ahead drained and nothing new queued ahead of it; but
// the router refuses only while arrivals keep the queue at its limit,
// and a retry timed so was refused again: measured (BENCHMARKS.md,
// "Retrying clients"), such pushbacks left attempts at 1.08-1.64x the
// requests offered, goodput below that of clients that did not retry
// in 3 of 4 runs; with -1 the attempts were the requests, 1.00x.
func lateRefusal(err error) error { return withPushback(err, 0, false, true) }

// countPushback is the pushback of a request refused for a limit on
// what is in flight (samples, bytes, the adaptive limit): the time
// excess samples (beyond the limit, this request's counted in) take to
// finish at rate, spread by u in [0, 1) up to half as long again. A
// request that, waited so long, could not be answered by its deadline
// even alone (own more) is told not to retry.
func countPushback(rate float64, excess int64, own, remaining time.Duration, u float64) (wait time.Duration, retry bool) {
	if rate <= 0 || excess < 0 {
		return 0, false
	}
	d := float64(excess) / rate * float64(time.Second) * (1 + u/2)
	if d+float64(own) > float64(remaining) {
		return 0, false
	}
	return time.Duration(d), true
}

// ownTime is a request's predicted time alone: floor + work/rate.
func ownTime(rate float64, floor time.Duration, work int64) time.Duration {
	if rate <= 0 {
		return floor
	}
	return floor + time.Duration(float64(work)/rate*float64(time.Second))
}

// jitter draws the spread of a count refusal's pushback.
var jitter = rand.Float64
