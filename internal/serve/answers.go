package serve

import (
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/prism-serve/prism/api/prismv1"
)

// answers joins the answers of the routers a worker announces to into
// the one answer the worker acts on. dense_addrs is the union of the
// latest lists of the routers that answered within silentHeartbeats of
// their heartbeats: each router names the dense workers of its own
// registry, and a router silent longer than that has dropped this
// worker from its registry too (its expiry, and the probes it gives an
// overdue worker first), so it sends it no work that would name a dense
// worker only it knows of. heartbeat_ms is the
// shortest router's. epoch is the answering router's own, delivered
// with its answer (not merged: the worker keeps the highest it heard,
// store.RaiseEpoch), 0 in a delivery no answer caused; so are diverged
// (the worker records each mark, store.MarkDiverged) and stranded (the
// worker keeps each model named, server.OutForGood), nil in one.
type answers struct {
	mu  sync.Mutex
	now func() time.Time
	out func(*prismv1.AnnounceResponse)
	by  map[string]routerAnswer
	// sent is the union delivered last; told says one was.
	sent []string
	told bool
}

type routerAnswer struct {
	dense     []string
	heartbeat time.Duration
	at        time.Time
}

func newAnswers(out func(*prismv1.AnnounceResponse), now func() time.Time) *answers {
	if now == nil {
		now = time.Now
	}
	return &answers{now: now, out: out, by: map[string]routerAnswer{}}
}

// heard takes one announce attempt's outcome at router: an answer is
// delivered (merged) every time, as a single router's are; an error
// delivers only when it ends a silent router's part of the union.
func (a *answers) heard(router string, resp *prismv1.AnnounceResponse, err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := a.now()
	if err == nil {
		hb := time.Duration(resp.GetHeartbeatMs()) * time.Millisecond
		if hb <= 0 {
			hb = time.Second
		}
		a.by[router] = routerAnswer{dense: resp.GetDenseAddrs(), heartbeat: hb, at: now}
		a.deliver(true, resp)
		return
	}
	if r, ok := a.by[router]; ok && now.Sub(r.at) > silentHeartbeats*r.heartbeat {
		delete(a.by, router)
		a.deliver(false, nil)
	}
}

// silentHeartbeats is how long, in a router's heartbeats, a worker
// keeps the dense list of a router it has not heard from. The router
// expires a worker silent for three heartbeats, but one answering its
// health probe keeps its registration, and gets lookups, for up to
// maxProbes (4) more sweeps, a heartbeat apart (router/silent.go): seven
// heartbeats, and a probe's time. Dropped after three, a worker whose
// announcements were held up (a link that loses them, a router too busy
// to answer) refused the lookups the router still sent it, naming dense
// workers it had been told of ("not a dense worker registered with the
// router (0 are)").
const silentHeartbeats = 8

// forget drops a router the worker no longer announces to.
func (a *answers) forget(router string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, ok := a.by[router]; ok {
		delete(a.by, router)
		a.deliver(false, nil)
	}
}

// deliver hands the merged answer to out, with the epoch, diverged
// marks and stranded models of own (the answer that caused it, nil for
// none): always, or only when the union changed; a.mu held, so
// deliveries keep the order of the merges.
func (a *answers) deliver(always bool, own *prismv1.AnnounceResponse) {
	union := map[string]bool{}
	var hb time.Duration
	for _, r := range a.by {
		for _, d := range r.dense {
			union[d] = true
		}
		if hb == 0 || r.heartbeat < hb {
			hb = r.heartbeat
		}
	}
	dense := slices.Sorted(maps.Keys(union))
	if !always && a.told && slices.Equal(dense, a.sent) {
		return
	}
	a.sent, a.told = dense, true
	if a.out != nil {
		a.out(&prismv1.AnnounceResponse{HeartbeatMs: hb.Milliseconds(), DenseAddrs: dense, Epoch: own.GetEpoch(), Diverged: own.GetDiverged(), Stranded: own.GetStranded()})
	}
}
