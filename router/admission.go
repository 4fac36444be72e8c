package router

import (
	"context"
	"errors"
	"math"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/prism-serve/prism/api/prismv1"
)

// cost is what a valid request costs admission in bytes: its size, plus
// its shared context once more for every micro-batch after the first
// (each Lookup carries it). It refuses a context over
// Options.MaxContextBytes. A model fixed at batch fb (fixedbatch.go)
// runs micro-batches of fb, the last padded: its candidates cost what
// the padding makes of them.
func (r *Router) cost(req *prismv1.RecommendRequest, n, fb int) (int64, error) {
	ctxBytes := proto.Size(req.GetContext())
	if ctxBytes > r.opts.MaxContextBytes {
		return 0, status.Errorf(codes.InvalidArgument, "request context of %d bytes, the limit is %d", ctxBytes, r.opts.MaxContextBytes)
	}
	size := int64(proto.Size(req))
	k := (n + r.opts.MicroBatch - 1) / r.opts.MicroBatch
	if fb > 0 {
		k = (n + fb - 1) / fb
		size += int64(proto.Size(req.GetCandidates())) * int64(k*fb-n) / int64(n)
	}
	return size + int64(k-1)*int64(ctxBytes), nil
}

// admit charges a request's samples and bytes, or refuses it with
// ResourceExhausted; release gives them back, told how the request
// ended. remaining is the time to the request's deadline: unless
// Options.FixedAdmission is set, a request predicted to finish past it
// is refused too, so the system spends its time on work that can still
// succeed: predicted by the busy-time rate (predict.go) to take more than
// the adaptive share of that time (share.go), or with
// Options.AdmitLimit, refused when over the adaptive limit on samples
// in flight (limit.go). The fixed MaxInflight stays the upper
// bound. work is the request's samples as its workers run them, the
// unit of its model's measured rate: n, but for a model fixed at a
// batch (fixedbatch.go) its micro-batches padded to it, each a whole
// batch's time whatever its candidates.
func (r *Router) admit(model string, n, work, bytes int64, remaining time.Duration) (release func(error), err error) {
	// A request over a limit on its own is never admitted, however idle
	// the router: ResourceExhausted ("retry later") had its client retry
	// it for ever.
	if n > r.opts.MaxInflight {
		return nil, status.Errorf(codes.InvalidArgument, "request of %d candidates, more than the %d samples the router admits at once (--max-inflight): it is never admitted; split it", n, r.opts.MaxInflight)
	}
	if bytes > r.opts.MaxInflightBytes {
		return nil, status.Errorf(codes.InvalidArgument, "request of %d bytes as the router sends it (its context once per micro-batch, a fixed batch's padding), more than the %d the router admits at once (--max-inflight-bytes): it is never admitted; split it", bytes, r.opts.MaxInflightBytes)
	}
	mp := r.preds.get(model)
	// countRefusal is err with the pushback of a refusal for a limit on
	// what is in flight, excess samples over it.
	countRefusal := func(err error, excess int64) error {
		rate, floor := mp.estimate()
		wait, retry := countPushback(rate, excess, ownTime(rate, floor, work), remaining, jitter())
		return withPushback(err, wait, retry, rate > 0)
	}
	cur := r.inflight.Add(n)
	if cur > r.opts.MaxInflight {
		r.inflight.Add(-n)
		r.m.rejected.WithLabelValues("inflight").Inc()
		return nil, countRefusal(status.Errorf(codes.ResourceExhausted, "router overloaded: %d samples in flight, limit %d; retry later", cur-n, r.opts.MaxInflight), cur-r.opts.MaxInflight)
	}
	if curB := r.inflightBytes.Add(bytes); curB > r.opts.MaxInflightBytes {
		r.inflightBytes.Add(-bytes)
		r.inflight.Add(-n)
		r.m.rejected.WithLabelValues("bytes").Inc()
		// The samples to finish for the bytes over the limit to go,
		// as a share of the samples in flight.
		excess := int64(math.Ceil(float64(curB-r.opts.MaxInflightBytes) / float64(curB) * float64(cur)))
		return nil, countRefusal(status.Errorf(codes.ResourceExhausted, "router overloaded: %d request bytes in flight, this request's %d exceed the limit of %d; retry later", curB-bytes, bytes, r.opts.MaxInflightBytes), excess)
	}
	start := time.Now()
	ahead := mp.inflight.Add(work) - work // this model's samples admitted before this request, still in flight
	// Its samples as the router counts them (cur): its share is of
	// those, not of its work (a fixed batch's padding counted in).
	mine := mp.samples.Add(n)
	if !r.opts.FixedAdmission {
		// The adaptive limit decides once its first window has set one;
		// until then, and without it, the busy-time rate does.
		fits, known := true, false
		if r.lim != nil {
			fits, known = r.lim.allow(cur, n)
		}
		if known && !fits {
			// Several models share the limit: one within its share of it
			// (1/k) is admitted over it, as under the rate rule a model
			// under its share keeps its whole budget; the models over
			// theirs are refused until the samples in flight are back
			// under the limit.
			if k := r.preds.activeModels(mp, start); k > 1 && float64(mine*k) <= r.lim.limitNow() {
				fits = true
			}
		}
		if known && !fits {
			mp.inflight.Add(-work)
			mp.samples.Add(-n)
			r.inflightBytes.Add(-bytes)
			r.inflight.Add(-n)
			r.m.rejected.WithLabelValues("limit").Inc()
			// The limit read again may have grown since allow judged
			// (a window closed): at least one sample to drain, never a
			// "do not retry" for the most retryable refusal.
			limit := r.lim.limitNow()
			return nil, countRefusal(status.Errorf(codes.ResourceExhausted, "router at its admission limit: %d samples in flight, %d with this request's, limit %.0f; back off", cur-n, cur, limit), max(cur-int64(limit), 1))
		}
		if !known {
			share := r.share.get()
			budget := time.Duration(float64(remaining) * share)
			rate, floor := mp.estimate()
			k := r.preds.activeModels(mp, start)
			over := k > 1 && mine*k > cur && rate > 0
			if over {
				// Several models share the workers, and this one holds
				// more than its share of the samples in flight: it may
				// queue for only part of what its budget leaves beyond
				// its own work (fairShare), so the queues it builds
				// leave the others' requests time. A request that fits
				// alone is not refused for it.
				own := floor + time.Duration(float64(work)/rate*float64(time.Second))
				if budget > own {
					budget = own + time.Duration(float64(budget-own)*fairShare)
				}
			}
			if predicted, ok := predictFinish(rate, floor, ahead, work, budget); !ok {
				mp.inflight.Add(-work)
				mp.samples.Add(-n)
				r.inflightBytes.Add(-bytes)
				r.inflight.Add(-n)
				if over {
					r.m.rejected.WithLabelValues("fairshare").Inc()
					return nil, lateRefusal(status.Errorf(codes.ResourceExhausted, "predicted to finish in %s ms, past the %s ms of the %s ms to its deadline that model %q may fill while it holds more than its share of the samples in flight and %d models are served; back off", ms(predicted), ms(budget), ms(remaining), model, k))
				}
				r.m.rejected.WithLabelValues("deadline").Inc()
				return nil, lateRefusal(status.Error(codes.ResourceExhausted, lateMessage(predicted, remaining, share)))
			}
		}
	}
	mp.begin(start)
	if t := start.UnixNano(); t-mp.admitted.Swap(t) >= int64(activeWindow) {
		r.preds.activeAt.Store(0) // a model active again: count again
	}
	alone := ahead == 0
	return func(result error) {
		now := time.Now()
		mp.end(now)
		// The floor learns from answers only: a lone request that failed
		// took what its deadline, its client or a hung worker allowed,
		// and one held to the 30 s default timeout set a floor of
		// seconds that refused every request with anything of its model
		// ahead, which only lone requests (rare under load) brought down.
		if alone && result == nil {
			mp.alone(now.Sub(start), work)
		}
		// Learn from answers and from misses of the deadline; a request
		// that failed otherwise (a worker lost, the client gone) says
		// nothing about its latency.
		missed := status.Code(result) == codes.DeadlineExceeded || errors.Is(result, context.DeadlineExceeded)
		if result == nil || missed {
			if r.lim != nil {
				r.lim.seen(r.inflight.Load())
				r.lim.record(now, now.Sub(start), remaining, missed)
			}
			if !r.opts.FixedAdmission {
				r.share.record(now, now.Sub(start), remaining, missed)
			}
		}
		mp.inflight.Add(-work)
		mp.samples.Add(-n)
		r.inflight.Add(-n)
		r.inflightBytes.Add(-bytes)
	}, nil
}

// fairShare is the part of its admission budget, beyond its own
// request's predicted time, a model holding more than its share of the
// samples in flight may spend queued while other models are active
// (Router.admit). Admission predicts each model from its own
// rate and its own samples in flight, and every model may queue up to
// its budget: a model overloaded (a promotion on one surface) kept the
// shared workers' queues that long, and a lightly loaded model's
// requests, queued behind its work in the dense tier's deadline order,
// missed their deadlines (measured: a model at 10 requests/s from 99.5%
// to 83% within a 100 ms deadline beside another offered 400). Queued
// for half of that the loaded model still keeps the workers busy; the
// others' requests wait about half as long. A model's share is of the
// samples in flight, whatever each sample costs; models with requests
// admitted within activeWindow count, and the requesting one.
const fairShare = 0.5

// openStream counts a RecommendStream against Options.MaxStreams.
func (r *Router) openStream() (closeStream func(), err error) {
	if cur := r.streams.Add(1); cur > int64(r.opts.MaxStreams) {
		r.streams.Add(-1)
		r.m.rejected.WithLabelValues("streams").Inc()
		return nil, status.Errorf(codes.ResourceExhausted, "%d RecommendStream streams open, the limit is %d; retry later", cur-1, r.opts.MaxStreams)
	}
	return func() { r.streams.Add(-1) }, nil
}
