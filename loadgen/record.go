package loadgen

import (
	"sync"
	"time"

	hdr "github.com/HdrHistogram/hdrhistogram-go"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Latencies are recorded in microseconds, from 1µs to 1h, 3 significant
// digits for the run and 2 for each second of the time series.
const (
	minLatencyUs = 1
	maxLatencyUs = int64(time.Hour / time.Microsecond)
)

func newHist(sig int) *hdr.Histogram { return hdr.New(minLatencyUs, maxLatencyUs, sig) }

// second is one second of the time series. Offered and latency are keyed
// by the intended send time (what happened to the load offered in that
// second); completions by the time the answer came.
type second struct {
	offered   int64
	completed int64 // answered OK in this second: the achieved throughput
	ok        int64
	samples   int64
	errs      int64
	hist      *hdr.Histogram
}

// Recorder collects the outcome of every request. Safe for concurrent use.
type Recorder struct {
	mu       sync.Mutex
	total    *hdr.Histogram
	interval *hdr.Histogram // since the last live line
	lag      *hdr.Histogram // how late the generator sent, intended to actual
	secs     []second
	sent     int64
	ok       int64
	samples  int64
	errs     map[codes.Code]int64
	// firstErr is the first error message seen per code: a count says
	// that requests failed, the message why.
	firstErr map[codes.Code]string
	slo      time.Duration
	inSLO    int64
	lastDone time.Duration
	// cutoff (0: none) is the end of the run's window plus the SLO: the
	// OK answers done by then, and their samples, are the run's
	// throughput, so that a straggler answered long after (up to the
	// request timeout) does not stretch the time it is divided by.
	cutoff                    time.Duration
	okByCutoff, samplesCutoff int64
	// A retrying run's attempts (retry.go).
	attempts, retriedOK                     int64
	byAttempts                              []int64
	pushbacks, pushbackStops, deadlineStops int64
}

// NewRecorder returns a recorder counting answers within slo as attained.
func NewRecorder(slo time.Duration) *Recorder {
	return &Recorder{total: newHist(3), interval: newHist(2), lag: newHist(2), errs: map[codes.Code]int64{}, firstErr: map[codes.Code]string{}, slo: slo}
}

func (r *Recorder) sec(t time.Duration) *second {
	i := int(t / time.Second)
	if i < 0 {
		i = 0
	}
	for len(r.secs) <= i {
		r.secs = append(r.secs, second{})
	}
	return &r.secs[i]
}

// Sent records that a request intended for offset intended (from the run's
// start) left at actual.
func (r *Recorder) Sent(intended, actual time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sent++
	r.sec(intended).offered++
	_ = r.lag.RecordValue(clampUs(actual - intended))
}

// Failed keeps err's message if it is the first of its code; Done counts
// the request.
func (r *Recorder) Failed(err error) {
	if err == nil {
		return
	}
	code := status.Code(err)
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, seen := r.firstErr[code]; !seen {
		msg := err.Error()
		if st, ok := status.FromError(err); ok {
			msg = st.Message()
		}
		r.firstErr[code] = msg
	}
}

// Done records the answer to a request intended for offset intended, come
// at offset done: its latency is done - intended, which includes any time
// the request waited to be sent (no coordinated omission).
func (r *Recorder) Done(intended, done time.Duration, samples int, code codes.Code) {
	lat := done - intended
	us := clampUs(lat)
	r.mu.Lock()
	defer r.mu.Unlock()
	if done > r.lastDone {
		r.lastDone = done
	}
	if code == codes.OK {
		// Completions are the throughput: counting refusals too
		// (ResourceExhausted at once), the plot showed a server refusing
		// its load as keeping up with it.
		r.sec(done).completed++
	}
	s := r.sec(intended) // after sec(done), which may move r.secs
	if code != codes.OK {
		r.errs[code]++
		s.errs++
		if code == codes.DeadlineExceeded {
			// A request that timed out took at least this long: left out
			// of the latencies, the slowest requests vanished from the
			// p99 (up to find-max's 1% error budget of them).
			r.recordLatency(s, us)
		}
		return
	}
	r.ok++
	r.samples += int64(samples)
	if done <= r.cutoff {
		r.okByCutoff++
		r.samplesCutoff += int64(samples)
	}
	s.ok++
	s.samples += int64(samples)
	r.recordLatency(s, us)
	if lat <= r.slo {
		r.inSLO++
	}
}

// recordLatency adds us to the run's, the live line's and second s's
// histograms. r.mu is held.
func (r *Recorder) recordLatency(s *second, us int64) {
	if s.hist == nil {
		s.hist = newHist(2)
	}
	_ = s.hist.RecordValue(us)
	_ = r.total.RecordValue(us)
	_ = r.interval.RecordValue(us)
}

func clampUs(d time.Duration) int64 {
	return min(max(int64(d/time.Microsecond), minLatencyUs), maxLatencyUs)
}

// Live is a snapshot for the live line; it resets the interval histogram.
type Live struct {
	Sent, OK, Errors int64
	IntervalP99      time.Duration
}

func (r *Recorder) live() Live {
	r.mu.Lock()
	defer r.mu.Unlock()
	var errs int64
	for _, n := range r.errs {
		errs += n
	}
	l := Live{Sent: r.sent, OK: r.ok, Errors: errs, IntervalP99: usDur(r.interval.ValueAtQuantile(99))}
	r.interval.Reset()
	return l
}

func usDur(us int64) time.Duration { return time.Duration(us) * time.Microsecond }
