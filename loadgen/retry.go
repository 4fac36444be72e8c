package loadgen

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
)

// PushbackKey is the trailer a gRPC server sets to tell a retrying
// client when to retry (gRFC A6): a non-negative integer, retry after
// that many milliseconds; anything else (negative, unparsable, more than
// one value), do not retry.
const PushbackKey = "grpc-retry-pushback-ms"

// Retry is how a run's clients retry, as an application's retry loop
// (or gRPC's retryPolicy) does: a request refused with one of Codes is
// sent again, up to Retries times after the first attempt, after a
// backoff of Initial, then Multiplier times the last (at most Max), each
// jittered by 0.8-1.2 as grpc-go jitters it, while its deadline
// (Options.Timeout, from the first attempt) allows: a retry whose
// backoff would end past the deadline is not sent, and the request ends
// with its last attempt's error. A refusal carrying the server's
// pushback (PushbackKey) is retried after the pushback instead, and the
// backoff starts again from Initial; a pushback saying not to retry
// ends the request. Latency stays measured from the intended send time
// of the first attempt.
type Retry struct {
	Retries      int
	Initial, Max time.Duration
	Multiplier   float64
	Codes        []codes.Code
	// IgnorePushback retries on the client's backoff alone, as a
	// hand-written loop that reads no trailer does.
	IgnorePushback bool
	// GRPC leaves the retrying to gRPC itself: the connection carries
	// ServiceConfig(this Retry) and AttemptCounter, and the run only
	// counts the attempts. The runner's own loop (the default) is an
	// application's retry loop around each call.
	GRPC bool
}

// RetryCodes are the codes retried by default: the router's overload
// refusals (ResourceExhausted) and no worker right now (Unavailable).
var RetryCodes = []codes.Code{codes.ResourceExhausted, codes.Unavailable}

// EnsureDefaults fills zero fields: 10 ms initial backoff, multiplier
// 2, at most 1 s, RetryCodes.
func (r *Retry) EnsureDefaults() {
	if r.Initial <= 0 {
		r.Initial = 10 * time.Millisecond
	}
	if r.Multiplier <= 0 {
		r.Multiplier = 2
	}
	if r.Max <= 0 {
		r.Max = time.Second
	}
	if len(r.Codes) == 0 {
		r.Codes = RetryCodes
	}
}

// retrier is a run's Retry with its state: the codes as a set and the
// jitter's source, shared by the run's senders.
type retrier struct {
	Retry
	retryable map[codes.Code]bool
	mu        sync.Mutex
	rng       *rand.Rand
	draw      func() float64 // tests: the jitter's draw in [0, 1)
}

// newRetrier is r's state for one run, its jitter drawn from seed; nil
// when r retries nothing.
func newRetrier(r Retry, seed uint64, draw func() float64) *retrier {
	if r.Retries <= 0 || r.GRPC {
		return nil
	}
	r.EnsureDefaults()
	rt := &retrier{Retry: r, retryable: map[codes.Code]bool{}, rng: rand.New(rand.NewPCG(seed, 0x5eed)), draw: draw}
	for _, c := range r.Codes {
		rt.retryable[c] = true
	}
	return rt
}

// backoff is the client's own wait before retry n (1 for the first
// retry since the start or since the last pushback).
func (r *retrier) backoff(n int) time.Duration {
	d := float64(r.Initial) * math.Pow(r.Multiplier, float64(n-1))
	d = min(d, float64(r.Max))
	var u float64
	if r.draw != nil {
		u = r.draw()
	} else {
		r.mu.Lock()
		u = r.rng.Float64()
		r.mu.Unlock()
	}
	return time.Duration(d * (0.8 + 0.4*u))
}

// pushbackError is a failed attempt and the pushback its trailer
// carried. It answers GRPCStatus with the attempt's own status, so
// status.Code and status.FromError read through it unchanged.
type pushbackError struct {
	err   error
	value []string // the trailer's values, as sent
}

func (e *pushbackError) Error() string { return e.err.Error() }
func (e *pushbackError) Unwrap() error { return e.err }
func (e *pushbackError) GRPCStatus() *status.Status {
	return status.Convert(e.err)
}

// withPushback returns err carrying the pushback of trailer tr, if it
// has one.
func withPushback(err error, tr metadata.MD) error {
	if err == nil {
		return nil
	}
	if v := tr.Get(PushbackKey); len(v) > 0 {
		return &pushbackError{err: err, value: v}
	}
	return err
}

// Pushback reads the server's pushback an attempt's error carries, as
// grpc-go reads it: set says the refusal carried one; retry says it
// allows a retry, after wait. One value, a non-negative integer of
// milliseconds, allows it; a negative or unparsable one, or several
// values, does not.
func Pushback(err error) (wait time.Duration, set, retry bool) {
	var pe *pushbackError
	if !errors.As(err, &pe) {
		return 0, false, true
	}
	if len(pe.value) != 1 {
		return 0, true, false
	}
	ms, perr := strconv.Atoi(strings.TrimSpace(pe.value[0]))
	if perr != nil || ms < 0 {
		return 0, true, false
	}
	return time.Duration(ms) * time.Millisecond, true, true
}

// attempt is how one request went: its attempts, the pushbacks it
// waited, and whether a pushback or its deadline stopped its retries.
type attempt struct {
	n             int
	pushbacks     int
	pushbackStops int
	deadlineStops int
}

// sendRetrying sends j through src, retrying as r says, within ctx's
// deadline; clock times the backoffs. It returns the last attempt's
// error.
func sendRetrying(ctx context.Context, src source, j job, r *retrier, clock Clock) (attempt, error) {
	a := attempt{n: 1}
	err := src.send(ctx, j)
	since := 0 // retries since the start or the last pushback
	for r != nil && err != nil && a.n <= r.Retries && r.retryable[status.Code(err)] {
		wait, set, ok := Pushback(err)
		if r.IgnorePushback {
			set, ok = false, true
		}
		if !ok {
			a.pushbackStops++
			break
		}
		if set {
			since = 0
		} else {
			since++
			wait = r.backoff(since)
		}
		// A retry its deadline would cut is not sent: the request ends
		// with the refusal it got (grpc-go waits the backoff out and
		// ends DeadlineExceeded).
		if dl, has := ctx.Deadline(); has && !clock.Now().Add(wait).Before(dl) {
			a.deadlineStops++
			break
		}
		if set {
			a.pushbacks++
		}
		clock.Sleep(ctx, wait)
		if ctx.Err() != nil {
			break
		}
		a.n++
		err = src.send(ctx, j)
	}
	return a, err
}

// RetryStats is what a run's retries did, in its summary.
type RetryStats struct {
	// Retries is the most attempts after the first a request could make.
	Retries int `json:"retries"`
	// GRPC says grpc-go retried (Retry.GRPC): the attempts are counted,
	// the pushbacks and stops are its own and not.
	GRPC bool `json:"grpc,omitempty"`
	// Attempts is every attempt sent, first ones included; AttemptsRPS
	// is them per second of the run's window, against OfferedRPS.
	Attempts    int64   `json:"attempts"`
	AttemptsRPS float64 `json:"attempts_rps"`
	// ByAttempts[k] counts the requests that made k+1 attempts.
	ByAttempts []int64 `json:"requests_by_attempts"`
	// RetriedOK counts requests answered OK after a retry.
	RetriedOK int64 `json:"retried_ok"`
	// Pushbacks counts the retries timed by the server's pushback;
	// PushbackStops the requests a pushback told not to retry, and
	// DeadlineStops those whose next retry would have ended past the
	// deadline.
	Pushbacks     int64 `json:"pushbacks"`
	PushbackStops int64 `json:"pushback_stops"`
	DeadlineStops int64 `json:"deadline_stops"`
}

// writeText prints the retries' line of the summary of a run of kind
// (requests or updates).
func (s *RetryStats) writeText(w interface{ Write([]byte) (int, error) }, kind string, sent int64, offered float64) {
	what, perSecond, _, _ := units(kind)
	each := "a request"
	if kind == KindUpdates {
		each = "an update"
	}
	per := 0.0
	if sent > 0 {
		per = float64(s.Attempts) / float64(sent)
	}
	ratio := 0.0
	if offered > 0 {
		ratio = s.AttemptsRPS / offered
	}
	var by []string
	for k, n := range s.ByAttempts {
		if n > 0 {
			by = append(by, fmt.Sprintf("%d:%d", k+1, n))
		}
	}
	fmt.Fprintf(w, "retries     up to %d: %d attempts, %.2f %s; %.1f attempts/s against %.1f %s offered (%.2fx); %s by attempts %s; %d answered after a retry\n",
		s.Retries, s.Attempts, per, each, s.AttemptsRPS, offered, perSecond, ratio, what, strings.Join(by, " "), s.RetriedOK)
	if s.GRPC {
		fmt.Fprintln(w, "            pushback and deadline: grpc-go's retries (service config), not counted")
		return
	}
	fmt.Fprintf(w, "            pushback: %d retries timed by it, %d %s told not to retry; %d not retried past their deadline\n", s.Pushbacks, s.PushbackStops, what, s.DeadlineStops)
}

// retried records how a request's attempts went; code is how it ended.
func (r *Recorder) retried(a attempt, code codes.Code) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.attempts += int64(a.n)
	for len(r.byAttempts) < a.n {
		r.byAttempts = append(r.byAttempts, 0)
	}
	r.byAttempts[a.n-1]++
	if a.n > 1 && code == codes.OK {
		r.retriedOK++
	}
	r.pushbacks += int64(a.pushbacks)
	r.pushbackStops += int64(a.pushbackStops)
	r.deadlineStops += int64(a.deadlineStops)
}

// retryStats is the summary's RetryStats over window seconds. r.mu is held.
func (r *Recorder) retryStats(retries int, grpc bool, window float64) *RetryStats {
	s := &RetryStats{Retries: retries, GRPC: grpc, Attempts: r.attempts, ByAttempts: append([]int64(nil), r.byAttempts...), RetriedOK: r.retriedOK,
		Pushbacks: r.pushbacks, PushbackStops: r.pushbackStops, DeadlineStops: r.deadlineStops}
	if window > 0 {
		s.AttemptsRPS = float64(r.attempts) / window
	}
	return s
}

// RetryThrottling is gRPC's retryThrottling (gRFC A6): each failed
// attempt takes a token, each OK answer gives back TokenRatio of one;
// at MaxTokens/2 tokens or fewer the channel stops retrying.
type RetryThrottling struct {
	MaxTokens  float64 `json:"maxTokens"`
	TokenRatio float64 `json:"tokenRatio"`
}

// ServiceConfig is the gRPC service config (JSON) that has grpc-go's
// own retries do what r says for Recommend and for embedding updates
// (Embeddings/Update, its codes those of UpdateRetryCodes):
// retryPolicy with r's attempts (grpc-go caps them at 5 in all),
// backoff and codes, and throttling if given (one budget for the
// channel, both methods' failures counted). grpc-go honours the
// router's pushback (it reads it before anything else), sleeps a
// backoff past the deadline (the call then ends DeadlineExceeded), and
// retries only a refusal sent before any answer header (the router's
// admission and update refusals are) of a call whose message it still
// holds (256 KiB by default: a larger update is not retried).
func ServiceConfig(r Retry, throttling *RetryThrottling) string {
	r.EnsureDefaults()
	sec := func(d time.Duration) string { return strconv.FormatFloat(d.Seconds(), 'f', -1, 64) + "s" }
	method := func(service, name string, r Retry) string {
		names := make([]string, len(r.Codes))
		for i, c := range r.Codes {
			names[i] = strconv.Quote(strings.ToUpper(snake(c.String())))
		}
		return fmt.Sprintf(`{"name":[{"service":%q,"method":%q}],"retryPolicy":{"maxAttempts":%d,"initialBackoff":%q,"maxBackoff":%q,"backoffMultiplier":%g,"retryableStatusCodes":[%s]}}`,
			service, name, r.Retries+1, sec(r.Initial), sec(r.Max), r.Multiplier, strings.Join(names, ","))
	}
	configs := []string{method("prism.v1.Recommender", "Recommend", r)}
	if u := updateRetry(r); u.Retries > 0 {
		configs = append(configs, method("prism.v1.Embeddings", "Update", u))
	}
	sc := `{"methodConfig":[` + strings.Join(configs, ",") + `]`
	if throttling != nil {
		sc += fmt.Sprintf(`,"retryThrottling":{"maxTokens":%g,"tokenRatio":%g}`, throttling.MaxTokens, throttling.TokenRatio)
	}
	return sc + "}"
}

// snake turns a code's Go name (ResourceExhausted) into its service
// config name's words (Resource_Exhausted).
func snake(s string) string {
	var b strings.Builder
	for i, c := range s {
		if i > 0 && c >= 'A' && c <= 'Z' {
			b.WriteByte('_')
		}
		b.WriteRune(c)
	}
	return b.String()
}

// AttemptCounter is a client stats.Handler that counts the attempts
// gRPC makes of each call, retries included, into the counter the
// caller put in the call's context (WithAttemptCount). A run retrying
// through gRPC's service config (Retry.GRPC) counts its attempts so.
type AttemptCounter struct{}

var _ stats.Handler = AttemptCounter{}

type attemptKey struct{}

// WithAttemptCount returns ctx counting the attempts of the call made
// with it into n, through a connection with AttemptCounter.
func WithAttemptCount(ctx context.Context, n *atomic.Int32) context.Context {
	return context.WithValue(ctx, attemptKey{}, n)
}

func (AttemptCounter) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }
func (AttemptCounter) HandleRPC(ctx context.Context, s stats.RPCStats) {
	// A transparent retry (grpc-go resending a stream the server never
	// saw: a refused stream, a GOAWAY) is no attempt of the retry
	// policy's, nor one the server handled.
	if b, ok := s.(*stats.Begin); ok && b.Client && !b.IsTransparentRetryAttempt {
		if n, ok := ctx.Value(attemptKey{}).(*atomic.Int32); ok {
			n.Add(1)
		}
	}
}
func (AttemptCounter) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }
func (AttemptCounter) HandleConn(context.Context, stats.ConnStats)                       {}
