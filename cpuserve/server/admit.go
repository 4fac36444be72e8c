package server

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
)

// DefaultMaxInflightSamples is Options.MaxInflightSamples' default.
const DefaultMaxInflightSamples = 65536

// denseSet is the dense workers' addresses the router last told this
// worker of (AnnounceResponse.dense_addrs).
type denseSet map[string]struct{}

// denseList is one of the router's lists: set (nil before any answer),
// its number gen (0 before any answer), and next, closed when the list
// is replaced.
type denseList struct {
	set  denseSet
	gen  uint64
	next chan struct{}
}

// DefaultDenseWait is Options.DenseWait's default.
const DefaultDenseWait = 200 * time.Millisecond

// SetDenseAddrs replaces the dense workers a Lookup may send cut tensors
// to: the router's latest list (internal/serve hands every announce
// answer here). Lookups read it with one atomic load; those waiting for
// a new list (awaitDense) are woken. The connections to dense workers
// the list no longer has are closed (retireDense).
func (s *Server) SetDenseAddrs(addrs []string) {
	set := make(denseSet, len(addrs))
	for _, a := range addrs {
		set[a] = struct{}{}
	}
	s.denseMu.Lock()
	defer s.denseMu.Unlock()
	old := s.denseListLocked()
	s.denseAddrs.Store(&denseList{set: set, gen: old.gen + 1, next: make(chan struct{})})
	close(old.next)
	if !s.opts.AnyDenseAddr {
		// Only the listed are dialled from now on: the connections to
		// the others go.
		s.retireDense(set)
	}
}

// denseList is the current list, the empty one before any answer.
func (s *Server) denseList() *denseList {
	if l := s.denseAddrs.Load(); l != nil {
		return l
	}
	s.denseMu.Lock()
	defer s.denseMu.Unlock()
	return s.denseListLocked()
}

func (s *Server) denseListLocked() *denseList {
	l := s.denseAddrs.Load()
	if l == nil {
		l = &denseList{next: make(chan struct{})}
		s.denseAddrs.Store(l)
	}
	return l
}

// Announced takes a router's answer to this worker's announcement
// (internal/serve hands every one here, before the worker announces
// again): the dense workers a Lookup may send to, and the election
// epoch of a router that holds the sequencing Lease, which the store
// keeps (store.RaiseEpoch) so that the updates of the router that held
// it before are refused from now on, within the new holder's start-up
// window; and the models whose copy the sequencing router found
// diverged from their other workers' (AnnounceResponse.diverged), which
// the store records (store.MarkDiverged) so that the worker announces
// them to every router from its next heartbeat on, also after the
// router that found it restarts. An error says the epoch or a mark
// could not be recorded; the dense workers are taken either way.
func (s *Server) Announced(resp *prismv1.AnnounceResponse) error {
	s.SetDenseAddrs(resp.GetDenseAddrs())
	var errs []error
	if e := resp.GetEpoch(); e != 0 {
		if _, err := s.st.RaiseEpoch(e); err != nil {
			errs = append(errs, fmt.Errorf("record the sequencing router's election epoch %s: %w", prismv1.FormatEpoch(e), err))
		}
	}
	for _, model := range slices.Sorted(maps.Keys(resp.GetDiverged())) {
		if _, served := s.models[model]; !served {
			continue
		}
		seq := resp.GetDiverged()[model]
		marked, err := s.st.MarkDiverged(model, seq)
		if err != nil {
			errs = append(errs, fmt.Errorf("record that model %q diverged at update %d: %w", model, seq, err))
			continue
		}
		if marked {
			s.log.Error("the sequencing router found this worker's copy of the model diverged from its other workers' (it answered an update otherwise than they did); recorded in the store, so no router sends it the model's lookups or updates: give it a copy of a serving worker's store (prism store copy --from A_SERVING_WORKER --db ITS_STORE) and restart it, or serve with --mend, which does that by itself",
				"model", model, "seq", seq)
			s.tellOut()
		}
	}
	for _, model := range resp.GetStranded() {
		if _, served := s.models[model]; !served {
			continue
		}
		s.strandedMu.Lock()
		told := s.stranded[model]
		if !told {
			if s.stranded == nil {
				s.stranded = map[string]bool{}
			}
			s.stranded[model] = true
		}
		s.strandedMu.Unlock()
		if !told {
			s.log.Error("the sequencing router no longer holds updates of the model this worker lacks (stranded): no router sends it the model's lookups or updates until its store is replaced with a copy of a serving worker's (prism store copy --from A_SERVING_WORKER --db ITS_STORE, then a restart), or serve with --mend, which does that by itself",
				"model", model)
			s.tellOut()
		}
	}
	return errors.Join(errs...)
}

// tellOut wakes a reader of OutNews.
func (s *Server) tellOut() {
	select {
	case s.outNews <- struct{}{}:
	default:
	}
}

// ForgetStranded drops models from what the routers said this worker is
// stranded on: the sequencing router no longer says so (another router
// took over, its log reaching further back).
func (s *Server) ForgetStranded(models ...string) {
	s.strandedMu.Lock()
	defer s.strandedMu.Unlock()
	for _, m := range models {
		delete(s.stranded, m)
	}
}

// OutNews hears when a model this worker serves is newly out for good
// (OutForGood): a router's answer marked it diverged or said it is
// stranded.
func (s *Server) OutNews() <-chan struct{} { return s.outNews }

// OutForGood is, per model this worker serves that no router sends
// lookups or updates of until its store is replaced with a copy of a
// serving worker's, why: "diverged at update N" (its store's mark, which
// outlives the process) or "stranded" (a router's answer this process
// heard). Empty when none.
func (s *Server) OutForGood() (map[string]string, error) {
	out := map[string]string{}
	marks, err := s.st.Diverged()
	for model, seq := range marks {
		if _, served := s.models[model]; served {
			out[model] = fmt.Sprintf("diverged at update %d", seq)
		}
	}
	s.strandedMu.Lock()
	defer s.strandedMu.Unlock()
	for model := range s.stranded {
		if _, marked := out[model]; !marked {
			out[model] = "stranded"
		}
	}
	return out, err
}

// checkDense refuses a dense_addr the router has not registered: the
// cut tensors (pooled embeddings) go only to dense workers of this
// deployment.
func (s *Server) checkDense(addr string) error {
	if s.opts.AnyDenseAddr {
		return nil
	}
	var set denseSet
	if l := s.denseAddrs.Load(); l != nil {
		set = l.set
	}
	return refuseDense(set, addr)
}

func refuseDense(set denseSet, addr string) error {
	if set == nil {
		return status.Error(codes.Unavailable, "this embedding worker has not heard from a router yet, so it knows no dense worker to send to; retry")
	}
	if _, ok := set[addr]; !ok {
		return prismv1.UntoldDenseError(addr, len(set))
	}
	return nil
}

// awaitDense is checkDense for a Lookup: a dense_addr missing from the
// router's list may be a dense worker that registered after this
// worker's last announcement (the router picks only registered ones,
// and tells this worker of them in its answers). So, with
// Options.AskRouter set, a refused Lookup has the worker announce out of
// turn and waits for the routers' new list, for at most a quarter of
// its remaining deadline and Options.DenseWait, instead of refusing
// until the next heartbeat. Lookups that wait on one list ask once
// between them.
func (s *Server) awaitDense(ctx context.Context, addr string) error {
	err := s.checkDense(addr)
	if err == nil {
		return nil
	}
	err = s.waitDense(ctx, addr, err)
	outcome := "served"
	if err != nil {
		outcome = "refused"
	}
	s.met.unknownDense.WithLabelValues(outcome).Inc()
	return err
}

// waitDense is awaitDense's wait, for a dense_addr refused with err.
func (s *Server) waitDense(ctx context.Context, addr string, err error) error {
	if s.opts.AskRouter == nil {
		return err
	}
	dl, ok := ctx.Deadline()
	wait := denseWait(s.opts.DenseWait, ok, time.Until(dl))
	if wait <= 0 {
		return err
	}
	end := time.Now().Add(wait)
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		l := s.denseList()
		if err = refuseDense(l.set, addr); err == nil {
			return nil
		}
		if !time.Now().Before(end) {
			return err
		}
		s.askRouter(l.gen)
		select {
		case <-l.next:
		case <-timer.C:
			return err
		case <-ctx.Done():
			return err
		}
	}
}

// denseWait is how long a refused Lookup waits for the router's new
// list: limit (DefaultDenseWait when 0), and, with a deadline, at most a
// quarter of the time left before it.
func denseWait(limit time.Duration, hasDeadline bool, left time.Duration) time.Duration {
	if limit <= 0 {
		limit = DefaultDenseWait
	}
	if hasDeadline {
		limit = min(limit, left/4)
	}
	return limit
}

// askRouter asks the routers for a new list once per list: gen is the
// list a Lookup was refused by (s.asked holds the last such gen+1).
func (s *Server) askRouter(gen uint64) {
	for {
		asked := s.asked.Load()
		if asked > gen {
			return // asked for this list (or a later one) already
		}
		if s.asked.CompareAndSwap(asked, gen+1) {
			s.opts.AskRouter()
			return
		}
	}
}

// admit charges a Lookup of n samples, whose cut tensors take bytes,
// against Options.MaxInflightSamples and MaxInflightBytes; release gives
// them back once it is answered. A Lookup alone in flight is admitted
// whatever its samples and bytes (it passed MaxSamples), so a small
// budget slows the worker instead of refusing every large request (a
// refusal on an idle worker would be "retry later" forever).
func (s *Server) admit(n, bytes int64) (release func(), err error) {
	if cur := s.outstanding.Add(n); cur > s.opts.MaxInflightSamples && cur != n {
		s.outstanding.Add(-n)
		return nil, status.Errorf(codes.ResourceExhausted, "embedding worker overloaded: %d samples in flight, limit %d; retry later", cur-n, s.opts.MaxInflightSamples)
	}
	if max := s.opts.MaxInflightBytes; max > 0 {
		if cur := s.inflightBytes.Add(bytes); cur > max && cur != bytes {
			s.inflightBytes.Add(-bytes)
			s.outstanding.Add(-n)
			return nil, status.Errorf(codes.ResourceExhausted, "embedding worker overloaded: %d bytes of cut tensors in flight, limit %d (its memory budget); retry later", cur-bytes, max)
		}
	} else {
		bytes = 0
	}
	return func() {
		s.outstanding.Add(-n)
		if bytes != 0 {
			s.inflightBytes.Add(-bytes)
		}
	}, nil
}
