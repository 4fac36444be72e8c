package loadgen

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
)

// Sender sends one request and waits for its answer. A failure is a gRPC
// status error (status.Code tells its code). It is called from many
// goroutines at once.
type Sender interface {
	Send(ctx context.Context, req *prismv1.RecommendRequest) error
}

// GRPCSender sends through a Recommender client.
type GRPCSender struct {
	Client prismv1.RecommenderClient
	// Conn, if set, is Client's connection: pooled requests then go out
	// in the wire form they were given when the pool was built (see
	// SendPremarshaled) instead of being marshaled at every send.
	Conn grpc.ClientConnInterface
}

var _ Sender = GRPCSender{}

func (g GRPCSender) Send(ctx context.Context, req *prismv1.RecommendRequest) error {
	var tr metadata.MD
	resp, err := g.Client.Recommend(ctx, req, grpc.Trailer(&tr))
	if err != nil {
		return withPushback(err, tr) // a retrying run reads the server's pushback
	}
	return checkScores(resp, req)
}

func checkScores(resp *prismv1.RecommendResponse, req *prismv1.RecommendRequest) error {
	if len(resp.Scores) != int(req.NumCandidates) {
		return status.Errorf(codes.Internal, "%d scores for %d candidates", len(resp.Scores), req.NumCandidates)
	}
	return nil
}

// Clock is the runner's time source, a seam for tests. Sleep returns early
// when ctx is done.
type Clock interface {
	Now() time.Time
	Sleep(ctx context.Context, d time.Duration)
}

// WallClock is the real clock.
type WallClock struct{}

var _ Clock = WallClock{}

func (WallClock) Now() time.Time { return time.Now() }
func (WallClock) Sleep(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// Options configure one run.
type Options struct {
	// Profile is the offered rate of an open-loop run; Poisson draws
	// exponential gaps from it, otherwise the gaps are even.
	Profile Profile
	Poisson bool
	// Seed makes the schedule reproducible.
	Seed uint64
	// Clients > 0 runs closed loop instead: that many clients, each
	// sending its next request when the last one is answered.
	Clients int
	// Duration bounds the sending; MaxRequests bounds the count. Both are
	// required: every run stops by itself.
	Duration    time.Duration
	MaxRequests int64
	// MaxInFlight bounds open-loop requests awaiting an answer (default
	// 10000). When reached the generator waits; the wait counts in the
	// latency of the requests it delays, and shows as send lag.
	MaxInFlight int
	// Timeout is each request's deadline (default 10s). An open-loop
	// arrival the generator gets to only Timeout or more after its
	// intended time (behind its rate, or waiting on MaxInFlight) is not
	// sent: it is recorded as DeadlineExceeded at its deadline, so a run
	// ends by Duration + Timeout.
	Timeout time.Duration
	// SLO is the latency target for attainment (default 60ms, MLPerf
	// DLRMv2's server bound).
	SLO time.Duration
	// Clock defaults to the wall clock.
	Clock Clock
	// Live, if set, gets a status line every LiveEvery (default 1s); on
	// a terminal (TTY) it is redrawn in place.
	Live      io.Writer
	LiveEvery time.Duration
	TTY       bool
	// Watch, if set, is sampled every second of the run (Point.Watched).
	Watch *Watch
	// Kind is what the run sends: "" for Recommend requests,
	// KindUpdates for embedding updates (RunUpdates sets it).
	Kind string
	// Retry makes the run's clients retry refused requests (retry.go);
	// the zero value sends each request once.
	Retry Retry
	// retryDraw, if set, draws the retries' jitter (tests).
	retryDraw func() float64
	// TraceRatio (0 to 1) puts a W3C trace context on every Recommend,
	// sampled for this share of them (traced.go); 0: none.
	TraceRatio float64
}

// KindUpdates is the Kind of a run of embedding updates.
const KindUpdates = "updates"

// units names what a run of kind sends, its rate, its samples and its
// samples per thing sent, for people.
func units(kind string) (what, perSecond, samples, per string) {
	if kind == KindUpdates {
		return "updates", "updates/s", "rows", "rows/update"
	}
	return "requests", "req/s", "samples", "candidates/request"
}

// EnsureDefaults fills zero fields.
func (o *Options) EnsureDefaults() {
	if o.MaxInFlight == 0 {
		o.MaxInFlight = 10000
	}
	if o.Timeout == 0 {
		o.Timeout = 10 * time.Second
	}
	if o.SLO == 0 {
		o.SLO = 60 * time.Millisecond
	}
	if o.Clock == nil {
		o.Clock = WallClock{}
	}
	if o.LiveEvery == 0 {
		o.LiveEvery = time.Second
	}
}

// Validate checks o after EnsureDefaults.
func (o *Options) Validate() error {
	switch {
	case o.Duration <= 0:
		return errors.New("loadgen: the run needs a positive duration")
	case o.MaxRequests <= 0:
		return errors.New("loadgen: the run needs a positive request cap")
	case o.Clients < 0:
		return errors.New("loadgen: clients must not be negative")
	case o.Clients == 0 && o.Profile == nil:
		return errors.New("loadgen: an open-loop run needs a rate profile")
	case o.MaxInFlight < 1:
		return errors.New("loadgen: max in-flight must be positive")
	case o.Retry.Retries < 0:
		return errors.New("loadgen: retries must not be negative")
	case !(o.TraceRatio >= 0 && o.TraceRatio <= 1):
		return fmt.Errorf("loadgen: trace ratio %g: want 0 to 1", o.TraceRatio)
	}
	return nil
}

// job is one thing a run sends: a Recommend request or an embedding
// update, and its intended send time.
type job struct {
	intended time.Duration
	req      *prismv1.RecommendRequest
	wire     *Premarshaled // a pooled request's wire form, or nil
	upd      *prismv1.UpdateRequest
	samples  int // candidates of a request, rows of an update
	model    int // the request's model in a mix (Requests.Models), else 0
	// expired: not built, its deadline passed before the generator got
	// to it (the producer's check); recorded, never sent.
	expired bool
}

// source is what a run sends: it builds the next job (from the
// producer goroutine alone) and sends one (from many at once).
type source interface {
	next() (job, error)
	send(ctx context.Context, j job) error
}

// recommendSource sends Recommend requests.
type recommendSource struct {
	reqs *Requests
	s    Sender
	ps   PremarshaledSender // s, when it sends pooled requests' wire forms
}

func (r recommendSource) next() (job, error) {
	model, req, wire, err := r.reqs.nextModel()
	if err != nil {
		return job{}, err
	}
	return job{req: req, wire: wire, samples: int(req.NumCandidates), model: model}, nil
}

func (r recommendSource) send(ctx context.Context, j job) error {
	if j.wire != nil && r.ps != nil {
		return r.ps.SendPremarshaled(ctx, j.wire)
	}
	return r.s.Send(ctx, j.req)
}

// Run drives one run to its end and returns its summary. ctx cancels it
// early (the summary then covers what was sent). A mixed request stream
// (NewMixedRequests) is reported per model too (Summary.Models).
func Run(ctx context.Context, o Options, reqs *Requests, s Sender) (*Summary, error) {
	ps, _ := s.(PremarshaledSender)
	return run(ctx, o, recommendSource{reqs, s, ps}, reqs.Models())
}

// run drives src; mix, if set, names the models of src's jobs
// (job.model), each recorded apart as well as in the totals.
func run(ctx context.Context, o Options, src source, mix []ModelShare) (*Summary, error) {
	o.EnsureDefaults()
	if err := o.Validate(); err != nil {
		return nil, err
	}
	rec := NewRecorder(o.SLO)
	rec.cutoff = o.Duration + o.SLO
	// Each model of a mix has a recorder of its own beside the run's:
	// its counts, latencies and attainment as if it had been the only
	// model, with the totals kept as one model's run keeps them.
	perModel := make([]*Recorder, len(mix))
	for i := range perModel {
		perModel[i] = NewRecorder(o.SLO)
		perModel[i].cutoff = rec.cutoff
	}
	modelRec := func(j job) *Recorder {
		if len(perModel) == 0 {
			return nil
		}
		return perModel[j.model]
	}
	parent := ctx
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	cpu0 := cpuTime()
	start := o.Clock.Now()
	since := func() time.Duration { return o.Clock.Now().Sub(start) }

	jobs := make(chan job, 1024)
	var genErr error
	capped := false // the producer stopped at MaxRequests, not at Duration
	// drained: a closed-loop client found the producer's requests all
	// taken. The producer builds up to the channel's 1024 ahead, so it
	// can reach MaxRequests in a run its clients end at Duration.
	var drained atomic.Bool
	// The producer builds requests ahead of their send time, so building
	// never delays a send; it owns reqs and the schedule.
	var sched *Schedule
	if o.Clients == 0 {
		var err error
		if sched, err = NewSchedule(o.Profile, o.Poisson, o.Seed); err != nil {
			return nil, err
		}
	}
	go func() {
		defer close(jobs)
		for n := int64(0); ; n++ {
			var at time.Duration
			if sched != nil {
				if at = sched.Next(); at >= o.Duration {
					return
				}
			}
			// Capped only when the schedule had another arrival within
			// the duration: a cap equal to the arrivals of the window
			// stopped nothing.
			if n == o.MaxRequests {
				capped = true
				return
			}
			// An arrival already late by the request timeout is not
			// built: its deadline, counted from its intended time as its
			// latency is, has passed (expire below). A generator that
			// could not keep up with the rate sent every arrival of the
			// window however late: --rate 1e6 for --duration 2s was still
			// sending 35 s on, toward --max-requests.
			if sched != nil && since()-at >= o.Timeout {
				select {
				case jobs <- job{intended: at, expired: true}:
					continue
				case <-ctx.Done():
					return
				}
			}
			j, err := src.next()
			if err != nil {
				genErr = err
				cancel()
				return
			}
			j.intended = at
			select {
			case jobs <- j:
			case <-ctx.Done():
				return
			}
		}
	}()

	stopLive := startLive(o, rec, since)
	var watched []float64
	var watchErr error
	watchCtx, stopWatch := context.WithCancel(parent)
	watchDone := make(chan struct{})
	if o.Watch != nil {
		go watchLoop(watchCtx, o.Watch, o.Clock, start, &watched, &watchErr, watchDone)
	} else {
		close(watchDone)
	}
	var wg sync.WaitGroup
	rt := newRetrier(o.Retry, o.Seed, o.retryDraw)
	var tr *tracer
	if o.Kind == "" {
		tr = newTracer(o.TraceRatio, o.Seed)
	}
	send := func(j job) {
		// The deadline is the whole request's, its retries included.
		rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), o.Timeout)
		var traceID string
		var sampled bool
		if tr != nil {
			rctx, traceID, sampled = tr.start(rctx)
		}
		var grpcAttempts *atomic.Int32 // grpc-go's retries: its attempts, counted by AttemptCounter
		if o.Retry.GRPC && o.Retry.Retries > 0 {
			grpcAttempts = new(atomic.Int32)
			rctx = WithAttemptCount(rctx, grpcAttempts)
		}
		a, err := sendRetrying(rctx, src, j, rt, o.Clock)
		rcancel()
		rec.Failed(err)
		mr := modelRec(j)
		if mr != nil {
			mr.Failed(err)
		}
		if grpcAttempts != nil && grpcAttempts.Load() > 0 {
			a.n = int(grpcAttempts.Load())
		}
		if o.Retry.Retries > 0 {
			rec.retried(a, status.Code(err))
		}
		done := since()
		rec.Done(j.intended, done, j.samples, status.Code(err))
		if mr != nil {
			mr.Done(j.intended, done, j.samples, status.Code(err))
		}
		if sampled {
			model := ""
			if mr != nil {
				model = mix[j.model].Name
			}
			tr.done(traceID, model, done-j.intended, status.Code(err))
		}
	}
	// expire records an arrival whose deadline passed before it could be
	// sent (the generator, or --max-inflight, behind the rate) as the
	// client would have seen it: offered, and DeadlineExceeded at its
	// deadline.
	expire := func(j job) {
		at := j.intended + o.Timeout
		err := status.Errorf(codes.DeadlineExceeded, "not sent: the generator was %v or more behind its schedule, past the request timeout (--rate above what it, or --max-inflight, can send)", o.Timeout)
		for _, r := range []*Recorder{rec, modelRec(j)} {
			if r != nil {
				r.Sent(j.intended, at)
				r.Failed(err)
				r.Done(j.intended, at, j.samples, codes.DeadlineExceeded)
			}
		}
	}
	if o.Clients == 0 {
		sem := make(chan struct{}, o.MaxInFlight)
		for j := range jobs {
			if d := j.intended - since(); d > 0 {
				o.Clock.Sleep(ctx, d)
			}
			if ctx.Err() != nil {
				break
			}
			if j.expired || since()-j.intended >= o.Timeout {
				expire(j)
				continue
			}
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				// Interrupted (or the run's end) while --max-inflight
				// requests were out: nothing more is sent.
			}
			if ctx.Err() != nil {
				break
			}
			// Its deadline may have passed while --max-inflight requests
			// were out.
			if since()-j.intended >= o.Timeout {
				<-sem
				expire(j)
				continue
			}
			sentAt := since()
			rec.Sent(j.intended, sentAt)
			if mr := modelRec(j); mr != nil {
				mr.Sent(j.intended, sentAt)
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				send(j)
				<-sem
			}()
		}
	} else {
		for range o.Clients {
			wg.Go(func() {
				for {
					j, ok := <-jobs
					now := since()
					if !ok {
						drained.Store(true)
					}
					if !ok || now >= o.Duration || ctx.Err() != nil {
						return
					}
					// Closed loop: a request is intended when its client is free.
					j.intended = now
					rec.Sent(now, now)
					if mr := modelRec(j); mr != nil {
						mr.Sent(now, now)
					}
					send(j)
				}
			})
		}
		wg.Wait()
	}
	cancel() // stop the producer; in-flight requests keep their own deadline
	wg.Wait()
	for range jobs {
	}
	elapsed := since()
	if o.Clients > 0 && !drained.Load() {
		capped = false
	}
	windowed := !capped && parent.Err() == nil
	if windowed {
		// The run offered load over its whole duration, even when the last
		// arrival came before its end.
		elapsed = max(elapsed, o.Duration)
	}
	stopLive()
	stopWatch()
	<-watchDone
	if genErr != nil {
		return nil, genErr
	}
	sum := rec.summary(o, elapsed, windowed)
	for i, m := range mix {
		sum.Models = append(sum.Models, modelSummary(m, perModel[i].summary(o, elapsed, windowed)))
	}
	sum.GeneratorCPU = (cpuTime() - cpu0).Seconds()
	sum.Traced = tr.summary()
	if o.Watch != nil {
		sum.addWatched(o.Watch.Name, watched, watchErr)
	}
	return sum, nil
}

func startLive(o Options, rec *Recorder, since func() time.Duration) (stop func()) {
	if o.Live == nil {
		return func() {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(o.LiveEvery)
		defer t.Stop()
		var last Live
		for {
			select {
			case <-done:
				if o.TTY {
					fmt.Fprintln(o.Live)
				}
				return
			case <-t.C:
			}
			l := rec.live()
			el := since()
			rate := float64(l.OK-last.OK) / o.LiveEvery.Seconds()
			_, perSecond, _, _ := units(o.Kind)
			line := fmt.Sprintf("%6.1fs/%v sent %d ok %d err %d  %.0f %s  p99 %v", el.Seconds(), o.Duration, l.Sent, l.OK, l.Errors, rate, perSecond, l.IntervalP99)
			prefix := "loadgen:"
			if o.Kind != "" {
				prefix = "loadgen: " + o.Kind + ":"
			}
			if o.TTY {
				fmt.Fprintf(o.Live, "\r\033[K%s", line)
			} else {
				fmt.Fprintln(o.Live, prefix, line)
			}
			last = l
		}
	})
	return func() { close(done); wg.Wait() }
}
