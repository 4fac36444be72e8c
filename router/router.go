package router

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/internal/lograte"
	"github.com/prism-serve/prism/internal/serve"
	"github.com/prism-serve/prism/internal/tracing"
	"github.com/prism-serve/prism/plan"
)

// Options configure the router.
type Options struct {
	// MicroBatch is the most candidates per micro-batch (default 512). A
	// request is cut into equal micro-batches that run at once, so the
	// dense tier scores one while the embedding tier looks up the next;
	// each cut costs two RPCs and a merge in the dense batcher. On the
	// 2-core machine of BENCHMARKS.md, where the tiers share the cores,
	// one micro-batch per MLPerf-sized request (270) served 41k samples/s
	// against 32k at 256 (two of 135); pipelining pays when each tier has
	// cores of its own. Concurrent requests pipeline across tiers anyway.
	MicroBatch int
	// MaxCandidates bounds one request (default 4096).
	MaxCandidates int
	// MaxInflight bounds the samples admitted and not yet answered
	// (default 65536); beyond it requests fail at once with
	// ResourceExhausted instead of queueing without bound.
	MaxInflight int64
	// Heartbeat is the interval workers announce at (default 1s).
	Heartbeat time.Duration
	// AnnounceWindow is how long after its start the router waits for
	// its workers to announce (default DefaultAnnounceWindow): until
	// workers of both tiers have, or this long has passed, Ready stays
	// open, and a request for a model while no embedding worker has
	// announced is Unavailable (retry), not NotFound.
	AnnounceWindow time.Duration
	// DefaultTimeout bounds a request whose client set no deadline
	// (default 30s), so a stalled worker cannot hold admission forever;
	// and each request of a RecommendStream, whose deadline (if any) is
	// the whole stream's, unless that comes sooner.
	DefaultTimeout time.Duration
	// StreamWindow is how many requests of one RecommendStream the router
	// works on at once (default 16); answers still go out in order.
	StreamWindow int
	// UpdateLogBytes bounds the recent Embeddings.Update requests kept
	// per model to catch lagging embedding workers up (default 256 MiB),
	// by the memory they hold (heldBytes: rows, 8 bytes an id, the
	// messages' structs), not their size on the wire: it bounds the
	// router's memory, which an operator sizes to a container's limit.
	UpdateLogBytes int64
	// UpdateLogTotalBytes bounds every model's log together (default 1
	// GiB): with many models each taking updates, UpdateLogBytes apiece
	// (256 MiB by default) was a router's memory of tens of GiB. A
	// model's log may then use what the others' leave of it, and at
	// least an equal share; the bound gives way, as UpdateLogBytes does,
	// to the updates a live worker still lacks.
	UpdateLogTotalBytes int64
	// MaxUpdateQueueBytes bounds the memory the Embeddings.Update
	// requests this router has taken and not yet answered hold (default
	// 512 MiB): each waits for its model's turn, and a trainer sending
	// faster than the workers write queued them in the router's memory
	// until their deadlines. Each counts its decoded message and what
	// its call holds (queuedBytes: about 14 KiB, the handler's stack
	// and gRPC's stream). One more is ResourceExhausted.
	MaxUpdateQueueBytes int64
	Logger              *slog.Logger

	// Limits bound what the registry takes from workers (sizes, the
	// outstanding figure); see RegistryLimits for the defaults.
	Limits RegistryLimits
	// Peer, when set, names the caller of a registry RPC from its
	// certificate: a worker id is bound to the identity that first
	// announced it, and a worker's role must be its identity's. Nil:
	// no binding (plaintext).
	Peer PeerFunc
	// PeerInstance, with Peer, says whether the caller's certificate
	// names one worker (auth.PeerInstance): the registry keeps one id
	// live per such certificate (Registry.Instance).
	PeerInstance func(ctx context.Context) bool
	// MaxInflightBytes bounds the request bytes admitted and not yet
	// answered (default 1 GiB): a request costs its candidates against
	// MaxInflight and its size against this.
	MaxInflightBytes int64
	// MaxContextBytes bounds one request's shared context (default 4 MiB).
	MaxContextBytes int
	// MaxMessageBytes is the gRPC message limit of the router's server
	// (default 64 MiB, serve's): an update must fit it with room to
	// spare, and a page of the update log (Registry.UpdateLog) is cut
	// to fit it.
	MaxMessageBytes int
	// MaxStreams bounds the RecommendStream streams open at once
	// (default 1024); one more is ResourceExhausted.
	MaxStreams int
	// DialOptions are added to the connections to the embedding workers
	// (after the plaintext default, so transport credentials given here
	// win): the router's TLS identity, or an in-process dialer in tests.
	DialOptions []grpc.DialOption
	// DenseDialOptions are added to the connection a router dials to
	// probe a dense worker overdue (silent.go; after the plaintext
	// default): the router's TLS identity, expecting a dense worker's
	// certificate. Nil: DialOptions.
	DenseDialOptions []grpc.DialOption
	// UpdateWorkerTimeout bounds one worker's answer to an update of the
	// fan-out (default 10s): a worker that does not answer in time is
	// left behind and caught up later, and the update is answered
	// without it. A caller whose deadline passes first is answered
	// DeadlineExceeded then, and the fan-out goes on without it.
	UpdateWorkerTimeout time.Duration
	// UpdateQuorum is how many of a model's embedding workers must hold
	// an update before Embeddings.Update answers OK (default
	// QuorumMajority; quorum.go).
	UpdateQuorum Quorum
	// UpdateLogDir is the Pebble folder keeping the update log (default
	// "": in memory, lost when the router stops). With it, a restarted
	// router still holds the recent updates and catches up a worker
	// that missed them. Open it with Open.
	UpdateLogDir string
	// UpdateLogFS is the file system UpdateLogDir lives on (default:
	// the operating system's; tests use vfs.NewMem()).
	UpdateLogFS vfs.FS
	// Sequencer is the address of the router that sequences embedding
	// updates when it is not this one (default "": this router does).
	// With it, this router forwards Embeddings.Update there and serves
	// lookups from the workers that hold the acknowledged updates, as
	// follow.go describes; it keeps no update log.
	Sequencer string
	// SequencerDialOptions are added to the connection to Sequencer
	// (after the plaintext default): the router's TLS identity,
	// expecting a router's certificate on the other side.
	SequencerDialOptions []grpc.DialOption
	// Election, when set, chooses the router that sequences embedding
	// updates among several at run time (on Kubernetes a Lease,
	// internal/kubelease): this router sequences while it holds the
	// election and forwards to the holder otherwise (elect.go). Run
	// takes part in it. Not with Sequencer, nor with UpdateLogDir (a
	// sequencer starts afresh with each term and learns from the
	// workers; its log is in memory).
	Election Election

	// FixedAdmission admits by MaxInflight and MaxInflightBytes only
	// (the behaviour before issue 18): no request is refused for being
	// predicted to finish past its deadline.
	FixedAdmission bool
	// AdmitShare is the most of the time to its deadline a request may
	// be predicted to take and still be admitted (default 1: the whole
	// of it): the ceiling of the share admission uses, which shrinks
	// while admitted requests miss their deadlines (share.go). Below 1
	// it keeps headroom for the prediction's error and the queue's
	// variance always, light load included.
	AdmitShare float64
	// AdmitLimit admits by an adaptive limit on the samples in flight
	// (limit.go) instead of by each request's predicted finish; the
	// busy-time rate (predict.go) still rules until the limit's first
	// window closes.
	AdmitLimit bool

	// now is the router's clock (tests set it; default time.Now): the
	// registry's expiry and the update sequencer's start-up wait read it.
	now func() time.Time
}

// EnsureDefaults fills zero fields.
func (o *Options) EnsureDefaults() {
	if o.MicroBatch <= 0 {
		o.MicroBatch = 512
	}
	if o.MaxCandidates <= 0 {
		o.MaxCandidates = 4096
	}
	if o.MaxInflight <= 0 {
		o.MaxInflight = 65536
	}
	if o.Heartbeat <= 0 {
		o.Heartbeat = time.Second
	}
	if o.AnnounceWindow <= 0 {
		o.AnnounceWindow = DefaultAnnounceWindow(o.Heartbeat)
	}
	if o.DefaultTimeout <= 0 {
		o.DefaultTimeout = 30 * time.Second
	}
	if o.StreamWindow <= 0 {
		o.StreamWindow = 16
	}
	if o.UpdateLogTotalBytes <= 0 {
		o.UpdateLogTotalBytes = 1 << 30
	}
	if o.UpdateLogBytes <= 0 {
		o.UpdateLogBytes = 256 << 20
	}
	if o.MaxUpdateQueueBytes <= 0 {
		o.MaxUpdateQueueBytes = DefaultMaxUpdateQueueBytes
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	o.Limits.EnsureDefaults()
	if o.MaxInflightBytes <= 0 {
		o.MaxInflightBytes = DefaultMaxInflightBytes
	}
	if o.MaxContextBytes <= 0 {
		o.MaxContextBytes = DefaultMaxContextBytes
	}
	if o.MaxMessageBytes <= 0 {
		o.MaxMessageBytes = 64 << 20
	}
	if o.MaxStreams <= 0 {
		o.MaxStreams = DefaultMaxStreams
	}
	if o.UpdateWorkerTimeout <= 0 {
		o.UpdateWorkerTimeout = DefaultUpdateWorkerTimeout
	}
	if !(o.AdmitShare > 0 && o.AdmitShare <= 1) { // NaN too
		o.AdmitShare = 1
	}
}

// Defaults of Options' admission fields (the command's flags use them).
const (
	DefaultMaxInflightBytes    = 1 << 30
	DefaultMaxContextBytes     = 4 << 20
	DefaultMaxStreams          = 1024
	DefaultUpdateWorkerTimeout = 10 * time.Second
	DefaultMaxUpdateQueueBytes = 512 << 20
)

// Router serves Recommend over the registered workers.
type Router struct {
	prismv1.UnimplementedRecommenderServer
	Reg  *Registry
	opts Options
	log  *slog.Logger
	// floods rate-limits the records a persistent condition repeats per
	// micro-batch (a dead worker every micro-batch meets until it
	// expires): the first at once, then one summary per window.
	floods   *lograte.Limiter
	inflight atomic.Int64
	// draining is closed by Drain (drain.go).
	draining  chan struct{}
	drainOnce sync.Once
	// resignMu guards resigned and stopElection (Resign, Run).
	resignMu     sync.Mutex
	resigned     bool
	stopElection context.CancelFunc
	// inflightBytes are the admitted requests' bytes (admission.go);
	// streams the RecommendStream streams open.
	inflightBytes atomic.Int64
	streams       atomic.Int64
	// updateBytes are the bytes of the updates taken and not yet
	// answered (Updater.Update, Options.MaxUpdateQueueBytes).
	updateBytes atomic.Int64
	// preds measure each model's service rate for admission by
	// predicted time.
	preds predictors
	// share adapts the share of the time to its deadline a request may
	// be predicted to take (share.go).
	share *shareCtl
	// lim is the adaptive limit on samples in flight (limit.go); nil
	// unless Options.AdmitLimit is set.
	lim *limiter
	// started is when the router started: for Options.AnnounceWindow
	// after, its workers may still be announcing.
	started time.Time
	connMu  sync.Mutex
	conns   map[string]*grpc.ClientConn
	// retiring are the connections dropConns and sequencerConn retired,
	// each with the timer that closes it: Close closes them at once.
	retiring map[*grpc.ClientConn]*time.Timer
	upd      *updateDriver
	// fol is set when another router sequences updates (Options.Sequencer);
	// seqConn is its connection there.
	fol     *follower
	seqConn *grpc.ClientConn
	seqAddr string
	// polling: a poll of the sequencer's view is under way (describe.go);
	// copying: a pull of its update log (replica.go).
	polling atomic.Bool
	copying atomic.Bool
	// el is set when the routers elect the one that sequences updates
	// (Options.Election, elect.go); upd and fol are then its own.
	el *elected
	m  routerMetrics
	// calls are the Lookups in flight with the workers they wait on,
	// abandoned when one expires (silent.go); probing, the overdue
	// workers probed before.
	calls   inflightCalls
	probing probes
}

type routerMetrics struct {
	microBatches *prometheus.CounterVec
	retries      prometheus.Counter
	rejected     *prometheus.CounterVec
	inflight     prometheus.GaugeFunc
	stages       *prometheus.HistogramVec
	// stage are stages' observers, by stageNames' index.
	stage   [len(stageNames)]prometheus.Observer
	workers *prometheus.GaugeVec
	// streamed counts the requests of RecommendStream streams by their
	// answer's code: a stream is one RPC to internal/serve's counters,
	// OK however many of its requests failed.
	streamed *prometheus.CounterVec
	// models counts and times every request by model (modelmetrics.go).
	models *modelMetrics
}

// MinMessageBytes is the smallest Options.MaxMessageBytes Open takes:
// an update and a page of the update log must fit in one message.
const MinMessageBytes = 1 << 20

// New makes a router; register its metrics with reg (may be nil). It
// panics where Open would fail (Options.UpdateLogDir that cannot be
// opened, options that do not go together): use Open then.
func New(o Options, reg prometheus.Registerer) *Router {
	r, err := Open(o, reg)
	if err != nil {
		panic(err)
	}
	return r
}

// DefaultAnnounceWindow is how long a new router waits for its workers
// by default: a worker that finds its routers by resolving a name (the
// routers' headless Service on Kubernetes) learns of a new router only
// at its next resolution, up to serve.DefaultResolveEvery later, and
// the name's DNS records take a few seconds to show a new pod; then it
// announces within a heartbeat. Three heartbeats, as for workers that
// were announcing already (a router restarted at its address), are not
// enough: a router in a rollout or a scale-up would be ready, and
// answer NotFound, with an empty registry for up to half a minute.
func DefaultAnnounceWindow(heartbeat time.Duration) time.Duration {
	return serve.DefaultResolveEvery + 10*heartbeat
}

// Ready is closed once workers of both tiers have announced to the
// router, or Options.AnnounceWindow after its start whatever announced:
// the router's health stays NOT_SERVING until then, so a new router in
// a rollout takes no traffic from a load balancer before its registry
// can serve it.
func (r *Router) Ready() <-chan struct{} {
	gate := make(chan struct{})
	go func() {
		defer close(gate)
		wait := time.After(r.opts.AnnounceWindow - r.Reg.now().Sub(r.started))
		for {
			changed := r.Reg.Changed()
			if cpu, gpu := r.Reg.Models(); len(cpu) > 0 && len(gpu) > 0 {
				return
			}
			select {
			case <-changed:
			case <-wait:
				return
			}
		}
	}()
	return gate
}

// Open makes a router as New does, and with Options.UpdateLogDir set
// opens the update log there and starts from what it holds.
func Open(o Options, reg prometheus.Registerer) (*Router, error) {
	o.EnsureDefaults()
	if o.MaxMessageBytes < MinMessageBytes {
		return nil, fmt.Errorf("router: a message limit of %d bytes: want at least 1 MiB (updates and pages of the update log must fit it)", o.MaxMessageBytes)
	}
	r := &Router{Reg: NewRegistry(o.Heartbeat, o.now), opts: o, log: o.Logger, conns: map[string]*grpc.ClientConn{}, draining: make(chan struct{})}
	r.floods = lograte.New(o.Logger, lograte.DefaultWindow)
	r.calls.registered = r.Reg.registered
	r.started = r.Reg.now()
	r.share = newShareCtl(o.AdmitShare)
	if o.AdmitLimit {
		r.lim = &limiter{}
	}
	r.Reg.Limits, r.Reg.Peer, r.Reg.Instance, r.Reg.Log = o.Limits, o.Peer, o.PeerInstance, o.Logger
	r.m.microBatches = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "prism", Subsystem: "router", Name: "micro_batches_total", Help: "Micro-batches, by outcome: ok, the gRPC code of the failure (of the last attempt, or Unavailable when no worker was left to try), or shard_missing (a sharded model's shard had no worker)."}, []string{"outcome"})
	r.m.streamed = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "prism", Subsystem: "router", Name: "stream_requests_total", Help: "Requests sent on RecommendStream streams, by the gRPC code of their answer (the stream itself counts once in prism_rpc_requests_total, by how it ended, whatever its requests' outcomes)."}, []string{"code"})
	r.m.streamed.WithLabelValues(codes.OK.String())
	r.m.retries = prometheus.NewCounter(prometheus.CounterOpts{Namespace: "prism", Subsystem: "router", Name: "retries_total", Help: "Micro-batches retried on another replica."})
	r.m.rejected = prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "prism", Subsystem: "router", Name: "rejected_total", Help: "Requests rejected by admission control, by reason: inflight (samples), bytes, streams, deadline (predicted to finish past it), fairshare (past the part of its time a model holding more than its share of the samples in flight may fill while other models are served), limit (over the adaptive limit of --admit-limit), updates (an embedding update over --max-update-queue-bytes)."}, []string{"reason"})
	for _, reason := range []string{"inflight", "bytes", "streams", "deadline", "fairshare", "limit"} {
		r.m.rejected.WithLabelValues(reason)
	}
	r.m.inflight = prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "prism", Subsystem: "router", Name: "inflight_samples", Help: "Samples admitted and not yet answered (the queue depth)."}, func() float64 { return float64(r.inflight.Load()) })
	r.m.stages = prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "prism", Subsystem: "router", Name: "stage_seconds", Help: "Time per micro-batch stage: decode, lookup, cpu_model, encode (the embedding worker), transfer (its Score call less the dense worker's time), dense (the dense worker's queue and run), and wait: the router's call less all of those, i.e. the network to and from the embedding worker and the time before its handler ran (a paused or CPU-starved worker shows here).", Buckets: prometheus.ExponentialBuckets(20e-6, 2, 18)}, []string{"stage"})
	for i, name := range stageNames {
		r.m.stage[i] = r.m.stages.WithLabelValues(name)
	}
	r.m.workers = prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "prism", Subsystem: "router", Name: "workers", Help: "Registered workers by role."}, []string{"role"})
	r.m.models = newModelMetrics(r.Reg.Known)
	if reg != nil {
		admitShare := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "prism", Subsystem: "router", Name: "admit_share", Help: "The share of the time to its deadline a request may be predicted to take and be admitted (--admit-share is its ceiling; it shrinks while admitted requests miss their deadlines)."}, r.share.get)
		reg.MustRegister(r.m.microBatches, r.m.streamed, r.m.retries, r.m.rejected, r.m.inflight, &r.preds, admitShare, r.m.stages, r.m.workers, r.m.models.requests, r.m.models.seconds, copyLagCollector{r}, updateLogCollector{r}, opsCollector{r})
		if r.lim != nil {
			reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "prism", Subsystem: "router", Name: "admission_limit_samples", Help: "The adaptive limit on samples in flight (--admit-limit; 0 until its first window closes)."}, r.lim.limitNow))
		}
	}
	if o.Sequencer != "" && o.UpdateLogDir != "" {
		return nil, fmt.Errorf("router: an update log (%q) is kept by the router that sequences updates, and this one follows %s", o.UpdateLogDir, o.Sequencer)
	}
	if o.Election != nil {
		switch {
		case o.Sequencer != "":
			return nil, fmt.Errorf("router: the sequencing router is either elected or named (%s), not both", o.Sequencer)
		case o.UpdateLogDir != "":
			return nil, fmt.Errorf("router: an update log (%q) is kept only by a router that always sequences updates; an elected one keeps it in memory", o.UpdateLogDir)
		case o.Election.Identity() == "":
			return nil, errors.New("router: no identity in the election: the address the other routers dial this one at is needed")
		}
		r.el = newElected(r, o.Election.Identity())
		r.Reg.describe = r.describeUpdates
		r.Reg.sequencer = r.sequencerAddr
		r.Reg.readLog = r.readUpdateLog
		r.Reg.observe = r.el.announced
		r.Reg.gone = r.el.gone
		r.Reg.eligible = r.el.inSync
		r.Reg.epoch = r.el.epoch
		r.Reg.outOf = r.el.outOf
		r.log.Info("the router that sequences embedding updates is elected", "self", o.Election.Identity())
		return r, nil
	}
	r.upd = newUpdateDriver(newSequencer(r.Reg.now(), o.Heartbeat, o.UpdateLogBytes, o.UpdateLogTotalBytes, o.UpdateQuorum), r.Reg.now, r.log, o.DefaultTimeout, o.UpdateWorkerTimeout, r.applyUpdate)
	r.upd.floods = r.floods
	r.upd.pageBytes = min(maxLogPage, int64(o.MaxMessageBytes-logPageMargin))
	r.upd.seq.mergeBytes = mergeBytesFor(o.MaxMessageBytes)
	if o.UpdateLogDir != "" {
		l, err := openUpdateLog(o.UpdateLogDir, o.UpdateLogFS)
		if err != nil {
			return nil, err
		}
		models, updates, err := r.upd.restore(l)
		if err != nil {
			l.Close()
			return nil, fmt.Errorf("open update log %q: %w", o.UpdateLogDir, err)
		}
		r.log.Info("update log opened", "dir", o.UpdateLogDir, "models", models, "updates", updates)
	}
	r.Reg.describe = r.describeUpdates
	r.Reg.sequencer = r.sequencerAddr
	r.Reg.readLog = r.readUpdateLog
	r.Reg.observe = r.upd.announced
	r.Reg.gone = r.upd.gone
	r.Reg.eligible = r.upd.inSync
	r.Reg.outOf = r.upd.outOf
	if o.Sequencer != "" {
		r.fol = newFollower(o.Sequencer, r.sequencerConn, o.UpdateQuorum, r.Reg.now, o.Heartbeat)
		r.Reg.observe = r.fol.announced
		r.Reg.gone = r.fol.gone
		r.Reg.eligible = r.fol.inSync
		r.Reg.outOf = nil // the sequencer's answer tells the workers
		r.log.Info("embedding updates go to another router", "sequencer", o.Sequencer)
	}
	return r, nil
}

// Run expires silent workers, and takes part in Options.Election, until
// ctx ends; it returns once the election is given up. Cancel it only
// after the gRPC server has drained (requests in flight still need the
// workers), then call Close.
func (r *Router) Run(ctx context.Context) {
	t := time.NewTicker(r.opts.Heartbeat)
	defer t.Stop()
	defer r.probing.wg.Wait()
	if r.el != nil {
		ectx, stop := context.WithCancel(ctx)
		defer stop()
		r.resignMu.Lock()
		r.stopElection = stop
		if r.resigned {
			stop()
		}
		r.resignMu.Unlock()
		done := make(chan struct{})
		go func() {
			defer close(done)
			r.opts.Election.Run(ectx, r.el.setLeader)
		}()
		defer func() { <-done }()
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			// Expires the workers that stopped announcing, and abandons
			// their calls in flight for a retry elsewhere, but those
			// still answering a probe (silent.go).
			r.sweep(ctx)
			r.dropConns()
			counts := map[prismv1.Role]int{prismv1.Role_ROLE_EMBEDDING: 0, prismv1.Role_ROLE_DENSE: 0}
			for _, w := range r.Reg.live() {
				counts[w.GetRole()]++
			}
			for role, n := range counts {
				r.m.workers.WithLabelValues(role.Name()).Set(float64(n))
			}
			if r.el != nil {
				r.el.tick()
			} else {
				r.upd.tick(ctx)
			}
			if (r.fol != nil || r.el != nil) && r.polling.CompareAndSwap(false, true) {
				go func() {
					defer r.polling.Store(false)
					r.pollSequencer(ctx)
				}()
			}
			if r.el != nil && r.copying.CompareAndSwap(false, true) {
				go func() {
					defer r.copying.Store(false)
					r.copySequencerLog(ctx)
				}()
			}
		}
	}
}

// Close closes the connections to the workers and the update log.
func (r *Router) Close() {
	defer r.floods.Close()
	r.Reg.mu.Lock()
	regFloods := r.Reg.floods
	r.Reg.mu.Unlock()
	defer regFloods.Close()
	if r.el != nil {
		r.el.close()
	}
	if r.upd != nil && r.upd.ulog != nil {
		if err := r.upd.ulog.Close(); err != nil {
			r.log.Error("closing the update log", "err", err)
		}
	}
	r.connMu.Lock()
	defer r.connMu.Unlock()
	for addr, c := range r.conns {
		c.Close()
		delete(r.conns, addr)
	}
	for c, t := range r.retiring {
		t.Stop()
		c.Close()
		delete(r.retiring, c)
	}
	if r.seqConn != nil {
		r.seqConn.Close()
		r.seqConn = nil
	}
}

// retire closes c after the longest a router call may take, so calls
// still running on it finish; Close closes it at once. r.connMu is held.
func (r *Router) retire(c *grpc.ClientConn) {
	if r.retiring == nil {
		r.retiring = map[*grpc.ClientConn]*time.Timer{}
	}
	r.retiring[c] = time.AfterFunc(r.opts.DefaultTimeout+5*time.Second, func() {
		r.connMu.Lock()
		delete(r.retiring, c)
		r.connMu.Unlock()
		c.Close()
	})
}

// dropConns retires connections to addresses no registered worker has:
// workers come and go (capacity borrowing) and their connections must not
// pile up. A retired connection is closed only after the longest a router
// call may take, so calls still running on it (a leaving worker drains
// its requests) finish.
func (r *Router) dropConns() {
	r.connMu.Lock()
	defer r.connMu.Unlock()
	live := map[string]bool{}
	for _, w := range r.Reg.live() {
		live[w.GetAddr()] = true
	}
	for addr, c := range r.conns {
		if !live[addr] {
			delete(r.conns, addr)
			r.retire(c)
		}
	}
}

// sequencerConn is the connection to the router that sequences updates
// (Options.Sequencer, or the lease holder of Options.Election), made
// once per address: when the holder moves, the connection to the old
// one is closed after the longest a forwarded update may take.
func (r *Router) sequencerConn(addr string) (*grpc.ClientConn, error) {
	r.connMu.Lock()
	defer r.connMu.Unlock()
	if r.seqConn != nil && r.seqAddr == addr {
		return r.seqConn, nil
	}
	// Its view (Registry.List: every worker, and per model those in
	// sync) is what its server sends (its MaxMessageBytes): past gRPC's
	// default 4 MiB at a fleet of about 2,000 workers of 16 models, and
	// every poll failed; a forwarded update is what this router's server
	// took.
	msg := max(64<<20, r.opts.MaxMessageBytes)
	c, err := grpc.NewClient(addr, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(msg), grpc.MaxCallSendMsgSize(msg))},
		append(serve.DialOptions(), r.opts.SequencerDialOptions...)...)...)
	if err != nil {
		return nil, err
	}
	if old := r.seqConn; old != nil {
		r.retire(old)
	}
	r.seqConn, r.seqAddr = c, addr
	return c, nil
}

func (r *Router) conn(addr string) (*grpc.ClientConn, error) {
	r.connMu.Lock()
	defer r.connMu.Unlock()
	if c, ok := r.conns[addr]; ok {
		return c, nil
	}
	// A Lookup carries a request's micro-batch and context: what the
	// router's own server accepts (MaxMessageBytes) must go on to them.
	msg := max(64<<20, r.opts.MaxMessageBytes)
	c, err := grpc.NewClient(addr, append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(msg), grpc.MaxCallSendMsgSize(msg)),
		// Keepalive notices a worker that vanished without closing its
		// connections (a lost node), so calls to it fail instead of hanging.
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 10 * time.Second, Timeout: 5 * time.Second}),
		// Tells a worker that did not answer a call from one that
		// answered it with an error (call, serve.TransportFailed).
		serve.AnswerStats(),
	}, append(serve.DialOptions(), r.opts.DialOptions...)...)...)
	if err != nil {
		return nil, err
	}
	r.conns[addr] = c
	return c, nil
}

// applyUpdate sends one numbered update to the embedding worker at addr.
func (r *Router) applyUpdate(ctx context.Context, addr string, req *prismv1.ApplyUpdateRequest) (*prismv1.UpdateResponse, error) {
	c, err := r.conn(addr)
	if err != nil {
		return nil, err
	}
	return prismv1.NewEmbeddingTierClient(c).Update(ctx, req)
}

// Recommend scores the candidates of one request. An overload refusal
// carries the retry pushback admission predicts (pushback.go) in its
// trailer.
func (r *Router) Recommend(ctx context.Context, req *prismv1.RecommendRequest) (*prismv1.RecommendResponse, error) {
	resp, err := r.recommend(ctx, req)
	if err != nil {
		setPushback(ctx, err)
	}
	return resp, err
}

// recommend is Recommend, and each request of a RecommendStream, whose
// refusals go in its answers (no trailer: a stream's one trailer is its
// own).
func (r *Router) recommend(ctx context.Context, req *prismv1.RecommendRequest) (_ *prismv1.RecommendResponse, err error) {
	start := time.Now()
	defer func() { r.m.models.observe(ctx, req.GetModel(), err, time.Since(start)) }()
	n := int(req.GetNumCandidates())
	if err := r.validate(req); err != nil {
		return nil, err
	}
	fb := r.Reg.FixedBatch(req.GetModel())
	bytes, err := r.cost(req, n, fb)
	if err != nil {
		return nil, err
	}
	jc, err := newJaggedCut(r.Reg.Jagged(req.GetModel()), req, n) // jagged.go
	if err != nil {
		return nil, err
	}
	// k micro-batches of near-equal size: 270 candidates at 256 per
	// micro-batch are two of 135, not 256 and a 14-sample straggler. A
	// model fixed at batch B gets runs of exactly B, the last padded
	// (fixedbatch.go).
	var parts [][2]int
	if fb > 0 {
		if jc != nil {
			return nil, status.Errorf(codes.Unimplemented, "model %q: a model with jagged inputs exported with a fixed batch (%d) is not served: re-export it with a dynamic batch axis", req.GetModel(), fb)
		}
		parts = fixedBatches(n, fb)
	} else {
		k := (n + r.opts.MicroBatch - 1) / r.opts.MicroBatch
		for i := range k {
			parts = append(parts, [2]int{i * n / k, (i + 1) * n / k})
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, status.FromContextError(err).Err()
	}
	remaining := r.opts.DefaultTimeout
	if dl, ok := ctx.Deadline(); ok {
		remaining = time.Until(dl)
	}
	work := int64(n)
	if fb > 0 {
		work = int64(len(parts) * fb)
	}
	release, err := r.admit(req.GetModel(), int64(n), work, bytes, remaining)
	if err != nil {
		return nil, err
	}
	defer func() { release(err) }()
	if tracing.Recording(ctx) {
		tracing.Annotate(ctx, attribute.String("prism.model", req.GetModel()), attribute.Int("prism.candidates", n),
			attribute.Int("prism.micro_batches", len(parts)), attribute.String("prism.request_id", req.GetRequestId()))
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, r.opts.DefaultTimeout)
		defer cancel()
	}
	// The first failing micro-batch cancels its siblings: the request has
	// failed, and their work and admission are better spent elsewhere.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	// A request pinned to a version number goes pinned to the content
	// the workers number so (their stores number apart); with no
	// worker announcing content, to the number (earlier releases).
	byNumber := req.GetContent() == "" && req.GetVersion() != 0
	if byNumber {
		if c := r.Reg.VersionContent(req.GetModel(), req.GetVersion()); c != "" {
			req = pinTo(req, answer{version: req.GetVersion(), content: c})
		}
	}
	// Each micro-batch's scores: k values per candidate for a model of k
	// tasks (answers[i].tasks), split once every part is in.
	outs := make([][]float32, len(parts))
	answers := make([]answer, len(parts))
	errs := make([]error, len(parts))
	// run scores the micro-batches numbered in which, at once.
	run := func(req *prismv1.RecommendRequest, which []int) error {
		var wg sync.WaitGroup
		for _, i := range which {
			lo, hi := parts[i][0], parts[i][1]
			wg.Add(1)
			go func() {
				defer wg.Done()
				sub, err := jc.sliceFeatures(req.GetCandidates(), n, lo, hi)
				if err == nil && fb > 0 {
					sub, err = padFeatures(sub, hi-lo, fb)
				}
				if err != nil {
					errs[i] = err
					return
				}
				size := hi - lo
				if fb > 0 {
					size = fb
				}
				out, v, err := r.microBatch(ctx, req, sub, size, i)
				if err == nil {
					err = checkScores(req.GetModel(), out, size, v.tasks)
				}
				if err != nil {
					errs[i] = err
					cancel()
					return
				}
				if req.GetVersion() != 0 && v.content == "" {
					v.version = req.GetVersion() // a worker answers a pinned one only (its reported one may lag)
				}
				answers[i] = v
				// A fixed batch's padding scored last: dropped.
				outs[i] = out[:(hi-lo)*tasksOf(v)]
			}()
		}
		wg.Wait()
		// Siblings cancelled after the first failure report Canceled; the
		// first other error is the cause.
		var first error
		for _, err := range errs {
			if err != nil && (first == nil || status.Code(first) == codes.Canceled) {
				first = err
			}
		}
		return first
	}
	all := make([]int, len(parts))
	for i := range all {
		all[i] = i
	}
	if err := run(req, all); err != nil {
		return nil, err
	}
	// While a model's replicas switch versions, micro-batches of one
	// request may be scored by two: its candidates would be ranked by
	// two models under one version's name. Those of another version than
	// the one that scored the most candidates are scored again, pinned
	// to it (a replica not serving it is NotFound, retried elsewhere).
	// Versions are told apart by content where the workers announce it:
	// stores number apart, so one content may come under two numbers
	// (one model) and two contents under one (two models).
	won, redo := splitVersions(parts, answers)
	if len(redo) > 0 {
		if err := run(pinTo(req, won), redo); err != nil {
			return nil, err
		}
	}
	scores, taskScores, tasks, err := joinScores(req.GetModel(), parts, outs, answers, n)
	if err != nil {
		return nil, err
	}
	taskNames, err := joinTaskNames(req.GetModel(), answers, int(tasks))
	if err != nil {
		return nil, err
	}
	if err := nonFiniteScore(req, jc, scores, n); err != nil { // finite.go
		return nil, err
	}
	if err := nonFiniteTaskScore(req, jc, taskScores, n, int(tasks)); err != nil {
		return nil, err
	}
	version := won.version
	switch {
	case won.content != "" && byNumber:
		// Pinned to a number, served by the content the workers number
		// so (VersionContent): the number asked for, not the one the
		// replica that answered gives it (a replica ingested after an
		// update numbers it lower).
		version = req.GetVersion()
	case won.content != "":
		// The number the workers serving it give it, the same in every
		// response whichever replica answered (a content pinned by the
		// client decides over a number given with it).
		version = max(version, r.Reg.ContentVersion(req.GetModel(), won.content))
	}
	return &prismv1.RecommendResponse{Scores: scores, Model: req.GetModel(), Version: version, RequestId: req.GetRequestId(), Content: won.content,
		Tasks: tasks, TaskScores: taskScores, TaskNames: taskNames}, nil
}

// joinTaskNames is the names of a request's k tasks (k > 1) its
// micro-batches' answers give, nil when none gives them (workers of
// earlier releases); Internal when two give other names, or names that
// are not k.
func joinTaskNames(model string, answers []answer, k int) ([]string, error) {
	if k <= 1 {
		return nil, nil
	}
	var names []string
	for _, a := range answers {
		got := a.names()
		switch {
		case len(got) == 0:
			continue
		case len(got) != k:
			return nil, status.Errorf(codes.Internal, "model %q: a micro-batch of %d tasks a candidate named %d", model, k, len(got))
		case names == nil:
			for _, n := range got {
				if len(n) > plan.MaxTaskName {
					return nil, status.Errorf(codes.Internal, "model %q: a micro-batch named a task of %d bytes (at most %d)", model, len(n), plan.MaxTaskName)
				}
			}
			names = got
		case !slices.Equal(names, got):
			return nil, status.Errorf(codes.Internal, "model %q: micro-batches of one request named its tasks %q and %q", model, names, got)
		}
	}
	return names, nil
}

// tasksOf is the values per sample of a micro-batch's scores.
func tasksOf(a answer) int { return max(int(a.tasks), 1) }

// checkScores is the Internal status of a micro-batch of size samples
// answered with tasks (0: one) values a sample whose scores are not
// that many, or of more tasks than a plan can have; nil when they are.
func checkScores(model string, out []float32, size int, tasks int32) error {
	switch {
	case tasks < 0 || tasks > plan.MaxTasks:
		return status.Errorf(codes.Internal, "model %q: a micro-batch answered with %d tasks a sample (at most %d)", model, tasks, plan.MaxTasks)
	case tasks > 1 && len(out) != size*int(tasks):
		return status.Errorf(codes.Internal, "model %q: %d scores for a micro-batch of %d samples of %d tasks", model, len(out), size, tasks)
	case tasks <= 1 && len(out) != size:
		return status.Errorf(codes.Internal, "model %q: %d scores for a micro-batch of %d", model, len(out), size)
	}
	return nil
}

// joinScores puts the micro-batches' scores (outs[i] those of the
// candidates parts[i], tasksOf(answers[i]) values each) together for n
// candidates: scores, one a candidate (task 0's for a multi-task model),
// and for a model of k > 1 tasks every task's, candidate-major, with k
// (RecommendResponse.task_scores and tasks; nil and 0 otherwise). Every
// micro-batch must answer as many tasks (a version rolling out with
// another head is one model, and splitVersions scores a request with
// one version): Internal otherwise.
func joinScores(model string, parts [][2]int, outs [][]float32, answers []answer, n int) (scores, taskScores []float32, tasks int32, err error) {
	k := 1
	for i, a := range answers {
		if i == 0 {
			k = tasksOf(a)
			continue
		}
		if tasksOf(a) != k {
			return nil, nil, 0, status.Errorf(codes.Internal, "model %q: micro-batches of one request answered %d and %d tasks a candidate", model, k, tasksOf(a))
		}
	}
	scores = make([]float32, n)
	if k == 1 {
		for i, p := range parts {
			copy(scores[p[0]:p[1]], outs[i])
		}
		return scores, nil, 0, nil
	}
	taskScores = make([]float32, n*k)
	for i, p := range parts {
		copy(taskScores[p[0]*k:p[1]*k], outs[i])
	}
	for c := range scores {
		scores[c] = taskScores[c*k]
	}
	return scores, taskScores, int32(k), nil
}

// answer is what a micro-batch's embedding worker said scored it: the
// model's content (WorkerInfo.content, "" unknown) and its store's
// number for the version (0 unknown).
type answer struct {
	version int64
	content string
	// tasks is the values per sample of the micro-batch's scores
	// (LookupResponse.tasks): 0 for one score, k for a multi-task
	// model's k. Not part of the version: same and splitVersions leave
	// it out.
	tasks int32
	// taskNames names them (LookupResponse.task_names; nil: unknown),
	// behind a pointer so answers stay comparable (map keys of version
	// and content alone).
	taskNames *[]string
}

// names is a's task names (nil: unknown).
func (a answer) names() []string {
	if a.taskNames == nil {
		return nil
	}
	return *a.taskNames
}

// namesOf points at names, nil when empty.
func namesOf(names []string) *[]string {
	if len(names) == 0 {
		return nil
	}
	return &names
}

// same says whether two answers name one version: by content where
// both know it, else by number.
func (a answer) same(b answer) bool {
	if a.content != "" && b.content != "" {
		return a.content == b.content
	}
	return a.version == b.version
}

// known: the answer names a version (an unknown one counts for none).
func (a answer) known() bool { return a.content != "" || a.version != 0 }

// pinTo is req pinned to the version of answer a: to its content where
// known (every replica serving it answers), else to its number.
func pinTo(req *prismv1.RecommendRequest, a answer) *prismv1.RecommendRequest {
	pinned := &prismv1.RecommendRequest{Model: req.GetModel(), Version: a.version, Content: a.content, Context: req.GetContext(),
		NumCandidates: req.GetNumCandidates(), Candidates: req.GetCandidates(), RequestId: req.GetRequestId()}
	if req.GetVersion() != 0 {
		pinned.Version = req.GetVersion()
	}
	return pinned
}

// splitVersions is the version that answered the most candidates (on
// a tie the higher number, then the lower content; an unknown answer
// counts for none) and the micro-batches another answered.
func splitVersions(parts [][2]int, answers []answer) (won answer, others []int) {
	// Every request but those of a rollout: one version (unknowns
	// aside), no map.
	one := true
	for _, a := range answers {
		if !a.known() {
			continue
		}
		if won.known() && !a.same(won) {
			one = false
			break
		}
		won.version = max(won.version, a.version)
		if won.content == "" {
			won.content = a.content
		}
	}
	if one {
		return won, nil
	}
	// The groups of answers naming one version, by first appearance.
	var groups []answer
	var count []int
	for i, a := range answers {
		if !a.known() {
			continue
		}
		g := slices.IndexFunc(groups, a.same)
		if g < 0 {
			groups, count = append(groups, a), append(count, 0)
			g = len(groups) - 1
		}
		groups[g].version = max(groups[g].version, a.version)
		if groups[g].content == "" {
			groups[g].content = a.content
		}
		count[g] += parts[i][1] - parts[i][0]
	}
	best := 0
	for g := range groups {
		switch {
		case count[g] != count[best]:
			if count[g] > count[best] {
				best = g
			}
		case groups[g].version != groups[best].version:
			if groups[g].version > groups[best].version {
				best = g
			}
		case groups[g].content < groups[best].content:
			best = g
		}
	}
	won = groups[best]
	for i, a := range answers {
		if a.known() && !a.same(won) {
			others = append(others, i)
		}
	}
	return won, others
}

// RecommendStream answers the requests of a stream in order, working on
// up to StreamWindow of them at once (an offline job's requests pipeline
// through the tiers as concurrent clients' would). A failed request gets
// a response carrying its status, and the stream goes on: one bad row
// does not end a scoring job. The stream ends with an error only when it
// breaks (cancelled, deadline, a message that does not decode).
func (r *Router) RecommendStream(s grpc.BidiStreamingServer[prismv1.RecommendRequest, prismv1.RecommendResponse]) error {
	closeStream, err := r.openStream()
	if err != nil {
		return err
	}
	defer closeStream()
	ctx, cancel := context.WithCancel(s.Context())
	// slots carries, in request order, one channel per request for its
	// response: the ones buffered plus the one the sender waits on make
	// the window.
	slots := make(chan chan *prismv1.RecommendResponse, r.opts.StreamWindow-1)
	// Every request's goroutine has finished before the handler returns
	// (they use the router's connections; shutdown waits for handlers).
	// The receiving goroutine may still be in Recv then (it returns once
	// the handler has), so it starts no work after done is set.
	var (
		work sync.WaitGroup
		mu   sync.Mutex
		done bool
	)
	defer func() {
		cancel()
		mu.Lock()
		done = true
		mu.Unlock()
		work.Wait()
	}()
	recvErr := make(chan error, 1)
	go func() {
		defer close(slots)
		for {
			req, err := s.Recv()
			if err != nil {
				if errors.Is(err, io.EOF) {
					err = nil
				}
				recvErr <- err
				return
			}
			slot := make(chan *prismv1.RecommendResponse, 1)
			select {
			case slots <- slot:
			case <-ctx.Done():
				recvErr <- nil // the sender has stopped; its error ends the stream
				return
			}
			mu.Lock()
			if done {
				mu.Unlock()
				recvErr <- nil
				return
			}
			select {
			case <-r.draining:
				// Not taken: the sender ends the stream here.
				mu.Unlock()
				slot <- nil
				recvErr <- errDraining
				return
			default:
			}
			work.Add(1)
			mu.Unlock()
			go func() {
				defer work.Done()
				slot <- r.streamAnswer(ctx, req)
			}()
		}
	}()
	// Once the router drains (Drain) the receiver takes no request: the
	// slots queued then are requests taken, answered in order, or the
	// one refused (nil); with none queued, no request taken is coming.
	for {
		var slot chan *prismv1.RecommendResponse
		ok := true
		select {
		case <-r.draining:
			select {
			case slot, ok = <-slots:
			default:
				return errDraining
			}
		default:
			select {
			case slot, ok = <-slots:
			case <-r.draining:
				continue
			}
		}
		if !ok {
			return <-recvErr
		}
		var resp *prismv1.RecommendResponse
		select {
		case resp = <-slot:
		case <-ctx.Done():
			return status.FromContextError(ctx.Err()).Err()
		}
		if resp == nil {
			return errDraining
		}
		if err := s.Send(resp); err != nil {
			return err
		}
	}
}

// streamAnswer is Recommend's answer for one request of a stream, a
// failure included as the response's error.
func (r *Router) streamAnswer(ctx context.Context, req *prismv1.RecommendRequest) *prismv1.RecommendResponse {
	// The stream's deadline is its whole job's, not one request's (a
	// client sets none per request): each request is bounded as one
	// without a deadline is, by DefaultTimeout, or by the stream's
	// deadline when that is sooner. Held to a long stream deadline, a
	// request at a stalled worker held every answer after it too.
	ctx, cancel := context.WithTimeout(ctx, r.opts.DefaultTimeout)
	defer cancel()
	// A traced stream's requests are each a subtree of the stream's span.
	ctx, end := tracing.Span(ctx, "prism.recommend")
	resp, err := r.recommend(ctx, req)
	end(err)
	r.m.streamed.WithLabelValues(status.Code(err).String()).Inc()
	if err == nil {
		return resp
	}
	st := status.Convert(err)
	return &prismv1.RecommendResponse{
		Model:     req.GetModel(),
		RequestId: req.GetRequestId(),
		Error:     &prismv1.RequestError{Code: int32(st.Code()), Message: st.Message()},
	}
}

func (r *Router) validate(req *prismv1.RecommendRequest) error {
	n := int(req.GetNumCandidates())
	switch {
	case req.GetModel() == "":
		return status.Error(codes.InvalidArgument, "no model named in the request")
	case n <= 0:
		return status.Errorf(codes.InvalidArgument, "empty request: num_candidates is %d", n)
	case n > r.opts.MaxCandidates:
		return status.Errorf(codes.InvalidArgument, "request has %d candidates, the limit is %d", n, r.opts.MaxCandidates)
	case req.GetVersion() < 0:
		return status.Errorf(codes.InvalidArgument, "version %d: versions are numbered from 1 (0: the one being served)", req.GetVersion())
	}
	l := r.Reg.Limits
	l.EnsureDefaults()
	if len(req.GetModel()) > l.MaxNameBytes {
		// No worker may announce such a name; and the errors below would
		// echo all of it.
		return status.Errorf(codes.InvalidArgument, "model name of %d bytes: names are at most %d", len(req.GetModel()), l.MaxNameBytes)
	}
	if !r.Reg.Serves(req.GetModel()) {
		cpu, _ := r.Reg.Models() // only to name them in the error
		if r.Reg.Known(req.GetModel()) {
			return status.Errorf(codes.Unavailable, "model %q has no live workers right now; retry", req.GetModel())
		}
		if since := r.Reg.now().Sub(r.started); len(cpu) == 0 && since < r.opts.AnnounceWindow {
			// A router just (re)started that has heard from no worker
			// yet: the model may well be served in a moment.
			return status.Errorf(codes.Unavailable, "model %q is not served yet: the router started %s ago and its workers are still announcing; retry", req.GetModel(), since.Round(time.Millisecond))
		}
		return status.Errorf(codes.NotFound, "model %q is not served (served: %v)", req.GetModel(), cpu)
	}
	jagged := r.Reg.Jagged(req.GetModel()) // jagged.go: cut by their offsets
	for _, in := range req.GetCandidates().GetInputs() {
		if isJagged(jagged, in.GetName()) {
			continue
		}
		if len(in.GetValues())%n != 0 || len(in.GetIds())%n != 0 || len(in.GetWeights())%n != 0 {
			return status.Errorf(codes.InvalidArgument, "candidate input %q: %d values, %d ids, %d weights do not split over %d candidates", in.GetName(), len(in.GetValues()), len(in.GetIds()), len(in.GetWeights()), n)
		}
	}
	return nil
}

// sliceFeatures takes candidates [lo, hi) of every candidate input.
func sliceFeatures(f *prismv1.Features, n, lo, hi int) (*prismv1.Features, error) {
	if lo == 0 && hi == n {
		return f, nil
	}
	out := &prismv1.Features{Inputs: make([]*prismv1.Input, len(f.GetInputs()))}
	for i, in := range f.GetInputs() {
		s := &prismv1.Input{Name: in.GetName()}
		if v := in.GetValues(); len(v) > 0 {
			w := len(v) / n
			s.Values = v[lo*w : hi*w]
		}
		if v := in.GetIds(); len(v) > 0 {
			w := len(v) / n
			s.Ids = v[lo*w : hi*w]
		}
		if v := in.GetWeights(); len(v) > 0 {
			w := len(v) / n
			s.Weights = v[lo*w : hi*w]
		}
		out.Inputs[i] = s
	}
	return out, nil
}

// microBatch sends one micro-batch to the least-loaded embedding worker,
// naming the least-loaded dense worker as its destination, and retries
// once on other replicas when a worker fails (a micro-batch is
// idempotent: scoring it twice is harmless).
//
// A model whose embedding workers hold shards of it fans each
// micro-batch out to a replica of every shard (shards.go); mb numbers
// the micro-batch in its request for the fan-out's key.
func (r *Router) microBatch(ctx context.Context, req *prismv1.RecommendRequest, cands *prismv1.Features, n, mb int) ([]float32, answer, error) {
	var tried retry
	var last error
	// Embedding workers a dense worker can score for (of its content),
	// of the content pinned if one is.
	want := pickWant{embedding: EmbeddingWant{Content: req.GetContent(), Version: numberPin(req), Paired: true}}
	for attempt := range 2 {
		cn, releaseCN, err := r.pickWith(prismv1.Role_ROLE_EMBEDDING, req.GetModel(), n, tried, "", want)
		if err != nil {
			return nil, answer{}, untoldRetry(r.failedMicroBatch(firstErr(last, err)))
		}
		if ref := cn.GetShards()[req.GetModel()]; ref != nil {
			releaseCN()
			scores, a, err := r.microBatchSharded(ctx, req, cands, n, mb, int(ref.GetShards()))
			if !errors.Is(err, errWholeLayout) {
				return scores, a, err
			}
			// Its sharding lacks a shard; the whole model's workers serve.
			if cn, releaseCN, err = r.pickWhole(req.GetModel(), n, tried, want); err != nil {
				return nil, answer{}, untoldRetry(r.failedMicroBatch(firstErr(last, err)))
			}
		}
		hn, releaseHN, err := r.pickWith(prismv1.Role_ROLE_DENSE, req.GetModel(), n, tried, cn.GetId(), pickWant{dense: DenseWant{Content: cn.GetContent()[req.GetModel()]}})
		if err != nil {
			releaseCN()
			return nil, answer{}, untoldRetry(r.failedMicroBatch(firstErr(last, err)))
		}
		if attempt > 0 {
			r.m.retries.Inc() // counted once it goes: a retry finding no worker is none
		}
		called := time.Now()
		resp, err := r.call(ctx, cn.GetId(), cn.GetAddr(), lookupRequest(req, cands, n, hn.GetAddr()))
		releaseCN()
		releaseHN()
		if err == nil {
			now := time.Now()
			r.m.microBatches.WithLabelValues("ok").Inc()
			r.preds.get(req.GetModel()).answered(now, int64(n))
			r.observe(resp.GetTimes(), now.Sub(called))
			return resp.GetScores(), answer{version: resp.GetVersion(), content: resp.GetContent(), tasks: resp.GetTasks(), taskNames: namesOf(resp.GetTaskNames())}, nil
		}
		last = err
		if !retryable(ctx, err) || attempt == 1 {
			break
		}
		// The embedding worker passes the dense worker's failures through,
		// so either may be at fault: the retry avoids both where another
		// replica exists. The one really down is left out of every
		// request's picks already if it did not answer (call marks it
		// unreachable), and stops heartbeating and expires.
		tried.failed(ctx, err, cn.GetId(), hn.GetId())
		// Once per pair and window: a dead worker fails every
		// micro-batch sent its way until its heartbeats expire.
		r.floods.Warn(cn.GetAddr()+" "+hn.GetAddr(), "micro-batch failed; retrying where another pair is live", "embedding", cn.GetAddr(), "dense", hn.GetAddr(), "err", err)
	}
	return nil, answer{}, untoldRetry(r.failedMicroBatch(last))
}

// untoldRetry is a micro-batch's error as the client gets it. An
// embedding worker refusing a dense worker it has not been told of yet
// (it asked its routers out of turn and waited, briefly, for the
// answer; prismv1.IsUntoldDense) passes with its next announcement, so
// the client is told Unavailable (retry), whether every pair tried
// refused or the retry found no worker left to try. Any other
// PermissionDenied here is one tier refusing another's certificate (a
// role it does not take): the servers' configuration, Internal to the
// client. Passed on, PermissionDenied told a client its own credentials
// were refused.
func untoldRetry(err error) error {
	switch {
	case prismv1.IsUntoldDense(err):
		return status.Errorf(codes.Unavailable, "%s; retry", status.Convert(err).Message())
	case status.Code(err) == codes.PermissionDenied:
		return status.Errorf(codes.Internal, "a tier refused another's certificate (the servers' configuration, not the caller's credentials): %s", status.Convert(err).Message())
	}
	return err
}

// numberPin is the version number a micro-batch of req is pinned to (0:
// none, or a content, which decides; lookupRequest sends the number
// only without one).
func numberPin(req *prismv1.RecommendRequest) int64 {
	if req.GetContent() != "" {
		return 0
	}
	return req.GetVersion()
}

// lookupRequest is the Lookup of one micro-batch of req (cands, n
// samples) whose cut tensors go to dense: pinned to req's content where
// it has one, else to its version number.
func lookupRequest(req *prismv1.RecommendRequest, cands *prismv1.Features, n int, dense string) *prismv1.LookupRequest {
	lr := &prismv1.LookupRequest{
		Model: req.GetModel(), Version: req.GetVersion(), Content: req.GetContent(), NumSamples: int32(n),
		Context: req.GetContext(), Candidates: cands, DenseAddr: dense, RequestId: req.GetRequestId(),
	}
	if lr.Content != "" {
		lr.Version = 0 // stores number apart: the content decides
	}
	return lr
}

// failedMicroBatch counts a micro-batch that failed with err under its
// code, whether its last attempt failed on a worker or no worker was
// left to make one (every embedding worker gone since the first), and
// returns err.
func (r *Router) failedMicroBatch(err error) error {
	r.m.microBatches.WithLabelValues(status.Code(err).String()).Inc()
	return err
}

// retry is what a request's failed attempts say of the workers they
// used, for its next attempt to avoid.
type retry struct {
	// avoid holds the workers of every failed attempt; dead, those of
	// the attempts that failed as if a worker was down (Unavailable, or
	// a connection closed under the call). An embedding worker passes
	// its dense worker's failures through, so both of an attempt are
	// named.
	avoid, dead []string
}

// failed records an attempt that failed with err on workers ids.
func (t *retry) failed(ctx context.Context, err error, ids ...string) {
	t.avoid = append(t.avoid, ids...)
	if c := status.Code(err); c == codes.Unavailable || (c == codes.Canceled && ctx.Err() == nil) {
		t.dead = append(t.dead, ids...)
	}
}

// tiers are the exclusions a pick tries in turn: every failed worker,
// then (when some failed otherwise) only those that seemed down, then
// none (retrying on the same replica beats failing when there is no
// other).
func (t retry) tiers() [][]string {
	switch {
	case len(t.avoid) == 0:
		return [][]string{nil}
	case len(t.dead) == 0 || len(t.dead) == len(t.avoid):
		return [][]string{t.avoid, nil}
	}
	return [][]string{t.avoid, t.dead, nil}
}

// pickWith picks a worker want keeps, preferring one not in
// tried.avoid, then one not in tried.dead, and falling back to any. A
// tier's pick marked unreachable (Registry.Unreachable: the pick took it
// for want of another in that tier) is taken only when no later tier
// has a reachable one: a worker this request failed on may answer the
// retry, one that did not answer any call will not (a fan-out's retry
// ranks them so too, pickShards).
func (r *Router) pickWith(role prismv1.Role, model string, n int, tried retry, sender string, want pickWant) (*prismv1.WorkerInfo, func(), error) {
	var w *prismv1.WorkerInfo
	var release func()
	var err error
	var downW *prismv1.WorkerInfo
	var downRelease func()
	for _, ex := range tried.tiers() {
		if w, release, err = r.Reg.pickFor(role, model, int64(n), ex, sender, want); err != nil {
			continue
		}
		if !r.Reg.isUnreachable(w.GetId()) {
			if downRelease != nil {
				downRelease()
			}
			return w, release, nil
		}
		if downW == nil {
			downW, downRelease = w, release
		} else {
			release()
		}
	}
	if downW != nil {
		return downW, downRelease, nil
	}
	if err != nil {
		if _, ok := status.FromError(err); ok {
			return nil, nil, err // a status of its own (NotFound: a content pinned that none serves)
		}
		return nil, nil, status.Error(codes.Unavailable, err.Error())
	}
	return w, release, nil
}

// pickDense is pick of the dense worker for a sharded fan-out whose
// embedding workers hold sharding: one that names it, then one that
// names none (an earlier release's), then (whole tables only) any
// other; each first among those the sender has been told of (it
// refuses the others until its next heartbeat), then among all. A
// dense worker of another sharding refuses a fan-out's row-wise parts
// (rowWise), so for those a worker of the sharding comes first even if
// a retry avoids it, and any other only last; whole tables are the same
// in every sharding, so for a fan-out of those alone avoiding a failed
// worker comes first.
func (r *Router) pickDense(model string, n int, tried retry, sender, sharding string, rowWise bool, content string) (*prismv1.WorkerInfo, func(), error) {
	if sharding == "" {
		return r.pickWith(prismv1.Role_ROLE_DENSE, model, n, tried, sender, pickWant{dense: DenseWant{Content: content}})
	}
	tries := tried.tiers()
	if !rowWise {
		tries = tries[:1]
	}
	for _, toldOnly := range []bool{true, false} {
		for _, ex := range tries {
			wants := [3]DenseWant{{Sharding: sharding, Exact: true, ToldOnly: toldOnly, Content: content}, {Sharding: sharding, ToldOnly: toldOnly, Content: content}, {ToldOnly: toldOnly, Content: content}}
			k := len(wants)
			if rowWise {
				k-- // any other refuses row-wise parts: last, below
			}
			for _, want := range wants[:k] {
				if w, release, err := r.Reg.PickDense(model, int64(n), ex, sender, want); err == nil {
					return w, release, nil
				}
			}
		}
	}
	return r.pickWith(prismv1.Role_ROLE_DENSE, model, n, tried, sender, pickWant{dense: DenseWant{Content: content}})
}

func firstErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// call sends one Lookup to the embedding worker id at addr. A failure
// of the transport (the worker did not answer: refused, reset, lost)
// marks it unreachable, and the worker's answer that it could not
// reach its dense worker marks that one (Registry.Unreachable): picks
// leave them out from this failure on, not from their expiry, three
// heartbeats later. An answer takes both marks back. A call still in
// flight when either worker expires (silent: no answer, no reset) is
// abandoned then, Unavailable, for the caller to retry (silent.go).
func (r *Router) call(ctx context.Context, id, addr string, req *prismv1.LookupRequest) (*prismv1.LookupResponse, error) {
	c, err := r.conn(addr)
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "embedding worker %s: %v", addr, err)
	}
	wctx, done := r.calls.watch(ctx, id, req.GetDenseAddr())
	defer done()
	wctx = serve.WatchAnswer(wctx)
	resp, err := prismv1.NewEmbeddingTierClient(c).Lookup(wctx, req)
	if s := abandoned(ctx, wctx); s != nil && err != nil {
		// Retried elsewhere as a call whose worker is down (retry).
		return nil, status.Errorf(codes.Unavailable, "%v; retry", s)
	}
	switch {
	case err == nil:
		r.Reg.Reached(id, req.GetDenseAddr())
	case serve.TransportFailed(wctx, err):
		r.Reg.Unreachable(id)
	default:
		if dense, ok := prismv1.DenseUnreachable(err); ok && dense == req.GetDenseAddr() && ctx.Err() == nil {
			r.Reg.UnreachableAt(prismv1.Role_ROLE_DENSE, dense)
		}
	}
	return resp, err
}

// retryable: the failure is the worker's, not the request's. Canceled
// while the request itself is live means a connection closed under the
// call.
func retryable(ctx context.Context, err error) bool {
	if ctx.Err() != nil {
		return false
	}
	switch status.Code(err) {
	case codes.Unavailable, codes.Aborted, codes.Internal, codes.Unknown, codes.ResourceExhausted, codes.Canceled:
		return true
	case codes.DataLoss:
		// A damaged block of the worker's store: a replica's copy of
		// the rows is intact.
		return true
	case codes.NotFound:
		// The worker does not serve the model, or the version pinned
		// (each serves its active one): a replica that does may.
		return true
	case codes.PermissionDenied:
		// An embedding worker refusing a dense worker it has not been
		// told of yet (it joined since the worker's last heartbeat):
		// another pair may serve.
		return true
	case codes.FailedPrecondition:
		// A worker of another layout than the registry holds for it (a
		// shard worker or a dense worker restarted in place with
		// another plan, a reshard rolling out, until its next
		// heartbeat): another replica may serve.
		return true
	}
	return false
}

// stageNames are prism_router_stage_seconds's stages: the workers'
// (StageTimes) and the router's own, wait.
var stageNames = [...]string{"decode", "lookup", "cpu_model", "encode", "transfer", "dense", "wait"}

// observe records a micro-batch's stages, as its workers timed them,
// and wait: what of call, the router's call to the embedding worker
// (every shard's, for a sharded model), those stages do not cover. The
// workers time their handlers only, so a worker paused or starved of
// CPU before its handler ran (or a slow network) showed in no stage,
// the router's request time well above their sum.
func (r *Router) observe(t *prismv1.StageTimes, call time.Duration) {
	if t == nil {
		return
	}
	us := [len(stageNames)]int64{t.GetDecodeUs(), t.GetLookupUs(), t.GetCpuModelUs(), t.GetEncodeUs(), t.GetTransferUs(), t.GetDenseUs()}
	var sum int64
	for _, v := range us[:len(us)-1] {
		sum += v
	}
	us[len(us)-1] = max(call.Microseconds()-sum, 0)
	for i, v := range us {
		r.m.stage[i].Observe(float64(v) / 1e6)
	}
}

// Resign gives up this router's part in the election of the update
// sequencer (Options.Election), now or when Run starts, while Run goes
// on serving: a router told to stop calls it before it drains, so that
// another router takes the Lease at once rather than when this one's
// drain ends, up to --shutdown-grace later (every update was
// Unavailable meanwhile: the draining server takes no new calls). Its
// sequencer's term ends first, as at a lost Lease: the updates in
// flight fail unacknowledged, and their callers retry at the new
// holder. No-op without an election.
func (r *Router) Resign() {
	r.resignMu.Lock()
	defer r.resignMu.Unlock()
	r.resigned = true
	if r.stopElection != nil {
		r.stopElection()
	}
}

// String describes the router for logs.
func (r *Router) String() string {
	return fmt.Sprintf("router(micro-batch %d, max in flight %d)", r.opts.MicroBatch, r.opts.MaxInflight)
}
