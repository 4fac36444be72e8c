// Package server is the embedding tier's gRPC service (prism serve embedding):
// for one micro-batch it looks up and pools the embeddings through the
// store, runs the plan's CPU subgraph, frames the cut tensors as Arrow and
// sends them straight to the dense worker the router chose, then returns
// that worker's scores with a per-stage time breakdown.
package server

import (
	"context"
	"errors"
	"fmt"
	"github.com/prism-serve/prism/internal/prelookup"
	"github.com/prism-serve/prism/plan"
	"log/slog"
	"maps"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/cpuserve/store"
	"github.com/prism-serve/prism/internal/arrowframe"
	"github.com/prism-serve/prism/internal/lograte"
	"github.com/prism-serve/prism/internal/ort"
	"github.com/prism-serve/prism/internal/serve"
	"github.com/prism-serve/prism/internal/tracing"
)

// Options configure a Server.
type Options struct {
	// Plans are the partition folders of the models to serve. A model the
	// store does not hold yet is ingested from its plan by New.
	Plans []string
	// MaxSamples bounds one request's samples (default 8192).
	MaxSamples int
	// Threads is ONNX Runtime's intra-op pool of each session (cpu.onnx,
	// pre.onnx; 0: the cores shared among the models' sessions,
	// ort.IntraOpThreads).
	Threads int
	// IngestProgress, if set, reports a startup ingest's bytes.
	IngestProgress func(model string, done, total int64)
	// DialOptions are added to the dense tier connections.
	DialOptions []grpc.DialOption
	// MaxInflightSamples bounds the samples of the Lookups in flight
	// (default DefaultMaxInflightSamples); beyond it a Lookup is
	// ResourceExhausted at once (the router retries another replica).
	MaxInflightSamples int64
	// MaxInflightBytes, when > 0, bounds the cut-tensor bytes the
	// Lookups in flight fill and send (samples x the model's frame bytes
	// per sample): a memory budget's share (store.Budget.InflightBytes),
	// so a backlog (cold misses, a slow dense worker) is refused with
	// ResourceExhausted instead of growing the worker into its memory
	// limit.
	MaxInflightBytes int64
	// AnyDenseAddr lets a Lookup name any dense_addr. Off (the default),
	// only the dense workers the router last announced (SetDenseAddrs)
	// are dialled: set it only for a worker without a router (tools,
	// tests).
	AnyDenseAddr bool
	// AskRouter, when set, asks the routers for their list of dense
	// workers out of turn (internal/serve.Prompt.Ask: the worker
	// announces at once); it must not block. A Lookup naming a dense
	// worker missing from the list calls it and waits for the new list,
	// at most DenseWait (default DefaultDenseWait) and a quarter of its
	// remaining deadline: a dense worker that registered since the
	// worker's last heartbeat is served at once, not refused until the
	// next one.
	AskRouter func()
	DenseWait time.Duration
	// DictionaryFrames sends a cut column that is one id's row per
	// sample dictionary-encoded when its ids repeat within the
	// micro-batch: each distinct row once, looked up once (dedup.go).
	DictionaryFrames bool
	Logger           *slog.Logger
}

// DefaultMaxSamples is Options.MaxSamples' default.
const DefaultMaxSamples = 8192

// EnsureDefaults fills zero fields.
func (o *Options) EnsureDefaults() {
	if o.MaxSamples <= 0 {
		o.MaxSamples = DefaultMaxSamples
	}
	if o.MaxInflightSamples <= 0 {
		o.MaxInflightSamples = DefaultMaxInflightSamples
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
}

// Validate reports options that cannot work.
func (o *Options) Validate() error {
	if len(o.Plans) == 0 {
		return errors.New("no models to serve: give at least one plan folder")
	}
	if o.Threads < 0 {
		return fmt.Errorf("threads %d < 0", o.Threads)
	}
	return nil
}

// Server implements prismv1.EmbeddingTierServer. The store is the
// caller's: Close leaves it open.
type Server struct {
	prismv1.UnimplementedEmbeddingTierServer
	st   *store.Store
	opts Options
	log  *slog.Logger
	// floods holds a failure every request meets (a cpu.onnx that
	// fails) to one record per model and window, then a summary.
	floods *lograte.Limiter
	models map[string]*model
	// shards holds, per model the store holds one shard of, that shard
	// (shard.go); empty when every model is whole.
	shards map[string]*shardRef

	mu    sync.Mutex
	conns map[string]*grpc.ClientConn // dense workers by address
	// inUse counts the Lookups sending on each connection; retired are
	// connections to dense workers the router's list no longer has
	// (retireDense), closed once no Lookup sends on them.
	inUse   map[*grpc.ClientConn]int
	retired map[*grpc.ClientConn]bool
	used    map[string]time.Time // last use of each conn, to evict the oldest

	outstanding atomic.Int64
	// inflightBytes is the cut-tensor bytes of the Lookups in flight
	// (charged only under Options.MaxInflightBytes).
	inflightBytes atomic.Int64
	met           *metrics
	// denseAddrs is the router's latest list of dense workers (nil, or
	// a list with a nil set, until it has answered an announcement);
	// denseMu orders its replacements; asked is the list a refused
	// Lookup last asked the routers to replace, plus 1 (awaitDense).
	denseAddrs atomic.Pointer[denseList]
	denseMu    sync.Mutex
	asked      atomic.Uint64

	// stranded holds the models the sequencing router said this worker
	// is stranded on (AnnounceResponse.stranded), kept until the mender
	// finds the router no longer says so (ForgetStranded): no replay
	// brings it back, only a copy of a serving worker's store.
	// outNews hears of each model newly out for good (OutForGood).
	strandedMu sync.Mutex
	stranded   map[string]bool
	outNews    chan struct{}
}

var _ prismv1.EmbeddingTierServer = (*Server)(nil)

// newSession loads an ONNX Runtime session (cpu.onnx, pre.onnx): a
// variable for the tests.
var newSession = ort.NewSession

// New loads the plans, ingesting the models st lacks, and opens their CPU
// subgraphs.
func New(ctx context.Context, st *store.Store, o Options) (*Server, error) {
	o.EnsureDefaults()
	if err := o.Validate(); err != nil {
		return nil, err
	}
	s := &Server{st: st, opts: o, log: o.Logger, floods: lograte.New(o.Logger, lograte.DefaultWindow), models: map[string]*model{}, shards: map[string]*shardRef{}, conns: map[string]*grpc.ClientConn{}, outNews: make(chan struct{}, 1),
		inUse: map[*grpc.ClientConn]int{}, retired: map[*grpc.ClientConn]bool{}}
	s.met = newMetrics(s)
	plans := make([]*plan.Plan, len(o.Plans))
	sessions := 0 // the ONNX Runtime sessions the models open
	for i, dir := range o.Plans {
		p, err := plan.Read(dir)
		if err != nil {
			s.Close()
			return nil, err
		}
		plans[i] = p
		if p.CPUModel != "" {
			sessions++
		}
		if p.PreModel != "" {
			sessions++
		}
	}
	so := ort.SessionOptions{IntraOpThreads: ort.IntraOpThreads(o.Threads, sessions, runtime.GOMAXPROCS(0), runtime.NumCPU())}
	for i, dir := range o.Plans {
		p := plans[i]
		name := p.ServedName(dir)
		if s.models[name] != nil {
			s.Close()
			return nil, fmt.Errorf("model %q given twice (%s and %s)", name, s.models[name].dir, dir)
		}
		start := time.Now()
		ingested, err := ensureServed(ctx, st, dir, p, o.IngestProgress)
		if err != nil {
			s.Close()
			return nil, err
		}
		if ingested {
			s.log.Info("ingested model", "model", name, "plan", dir, "elapsed", time.Since(start).Round(time.Millisecond))
		}
		m, err := loadModel(dir, p, so)
		if err == nil {
			var pd *plan.PartDamagedError
			if m.content, err = p.Content(dir); errors.As(err, &pd) && pd.Role != "dense" {
				// A part this tier runs (cpu.onnx, pre.onnx).
				err = fmt.Errorf("load %s: %w", dir, err)
			} else if err != nil {
				// As the dense tier: a copy of the plan lacking an ONNX
				// part the embedding tier does not run (dense.onnx).
				s.log.Warn("model content unknown: the router pairs this worker with dense workers of any content", "model", name, "err", err)
				err = nil
			}
		}
		if err != nil {
			s.Close()
			return nil, err
		}
		s.models[name] = m
		sr, err := shardModel(st, m)
		if err != nil {
			s.Close()
			return nil, err
		}
		if o.DictionaryFrames {
			// After shardModel: a shard's columns and lookups are its
			// own. Its whole (table-wise) columns may go as dictionaries;
			// partial columns (row-wise tables) go plain.
			m.dedup = dedupColumns(m)
		}
		if sr != nil {
			s.shards[name] = sr
			s.log.Info("serving a shard of the model", "model", name, "shard", sr.shard, "shards", sr.shards, "lookups", len(m.lookups), "cut_tensors", len(m.cut), "dictionary_columns", dictColumns(m))
		}
		// The plan's tables: a shard's worker holds some of them (the
		// line before says how many lookups it serves).
		s.log.Info("serving model", "model", name, "plan", dir, "content", m.content, "plan_tables", len(p.Tables), "cpu_model", p.CPUModel != "", "cut_tensors", len(p.Cut))
	}
	return s, nil
}

// Close frees the CPU subgraphs and the dense connections.
func (s *Server) Close() {
	defer s.floods.Close()
	for _, m := range s.models {
		m.close()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.conns {
		c.Close()
	}
	for c := range s.retired {
		c.Close()
	}
	s.conns = map[string]*grpc.ClientConn{}
	s.used = nil
	s.retired = map[*grpc.ClientConn]bool{}
}

// retireDense closes the connections to dense workers missing from the
// router's latest list (left, drained, returned to a lender): workers
// come and go (capacity borrowing) and their connections, each with its
// goroutines and keepalive pings, must not pile up. One a Lookup still
// sends on is closed when that Lookup is done with it.
func (s *Server) retireDense(set denseSet) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for addr, c := range s.conns {
		if _, ok := set[addr]; ok {
			continue
		}
		delete(s.conns, addr)
		delete(s.used, addr)
		if s.inUse[c] > 0 {
			s.retired[c] = true
		} else {
			c.Close()
		}
	}
}

// Models are the served models' names, sorted.
func (s *Server) Models() []string {
	var out []string
	for name := range s.models {
		out = append(out, name)
	}
	slices.Sort(out)
	return out
}

// Outstanding is the number of samples in flight.
func (s *Server) Outstanding() int64 { return s.outstanding.Load() }

// WorkerInfo is what the heartbeat tells the router's registry.
func (s *Server) WorkerInfo(id, addr string) *prismv1.WorkerInfo {
	models := s.Models()
	seqs := make(map[string]int64, len(models))
	healthy := true
	for _, m := range models {
		seq, err := s.st.AppliedSeq(m)
		if err != nil {
			s.log.Error("update seq unreadable", "model", m, "err", err)
			healthy = false
		}
		seqs[m] = seq
	}
	// The models whose copy a router found diverged (Announced): every
	// router keeps the worker out of their lookups and updates.
	diverged, err := s.st.Diverged()
	if err != nil {
		s.log.Error("diverged marks unreadable", "err", err)
		healthy = false
	}
	maps.DeleteFunc(diverged, func(m string, _ int64) bool { return !slices.Contains(models, m) })
	content := map[string]string{}
	versions := make(map[string]int64, len(models))
	for _, name := range models {
		if c := s.models[name].content; c != "" {
			content[name] = c
		}
		if v := s.activeVersion(name); v != 0 {
			versions[name] = v
		}
	}
	return &prismv1.WorkerInfo{Id: id, Role: prismv1.Role_ROLE_EMBEDDING, Addr: addr, Models: models, Device: "cpu", Outstanding: s.Outstanding(), Healthy: healthy, UpdateSeq: seqs, Shards: s.shardRefs(), Jagged: s.jaggedRefs(), FixedBatch: s.fixedBatches(), Diverged: diverged,
		Content: content, Version: versions}
}

// Collectors are the tier's metrics: per-stage latency, samples in
// flight, and the store's (hot-tier hit ratio, lookups, Pebble reads).
func (s *Server) Collectors() []prometheus.Collector {
	return append(s.met.collectors(), store.NewCollector(s.st))
}

// dense returns the cached connection to a dense worker; release ends
// the caller's use of it.
func (s *Server) dense(addr string) (_ prismv1.DenseTierClient, release func(), _ error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.used == nil {
		s.used = map[string]time.Time{}
	}
	c := s.conns[addr]
	if c == nil {
		// dense_addr comes from the request (the router picks the dense
		// worker), so the cache is bounded: workers come and go, and the
		// least recently used connection makes room for a new one.
		if len(s.conns) >= maxDenseConns {
			// Make room by closing connections idle for a minute (never
			// one a lookup may be using); with none idle, grow.
			for a, last := range s.used {
				switch ca := s.conns[a]; {
				case ca == nil:
					delete(s.used, a) // its connection went (retired, closed)
				case time.Since(last) > time.Minute && s.inUse[ca] == 0:
					ca.Close()
					delete(s.conns, a)
					delete(s.used, a)
				}
			}
		}
		opts := append([]grpc.DialOption{
			grpc.WithTransportCredentials(insecure.NewCredentials()),
			// No transparent retry of a Score: serve.Codec sends the frame
			// without a copy, and a retry succeeding while the refused
			// attempt's writer still reads the frame would let this tier
			// reuse it under that writer (a frame is recycled after a
			// successful Score). A refused call fails instead; the router
			// retries it on another replica.
			grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20), grpc.MaxRetryRPCBufferSize(0)),
			grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 10 * time.Second, Timeout: 5 * time.Second}),
			// Tells a dense worker that cannot be reached from its
			// answers (serve.TransportFailed).
			serve.AnswerStats(),
		}, append(serve.DialOptions(), s.opts.DialOptions...)...)
		var err error
		if c, err = grpc.NewClient(addr, opts...); err != nil {
			return nil, nil, status.Errorf(codes.InvalidArgument, "dense_addr %q: %v", addr, err)
		}
		s.conns[addr] = c
	}
	s.used[addr] = time.Now()
	s.inUse[c]++
	return prismv1.NewDenseTierClient(c), func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.inUse[c]--; s.inUse[c] > 0 {
			return
		}
		delete(s.inUse, c)
		if s.retired[c] {
			delete(s.retired, c)
			c.Close()
		}
	}, nil
}

// maxDenseConns is the number of dense-worker connections beyond which
// idle ones are closed.
const maxDenseConns = 1024

// ctxErr is the status of a request whose context has ended.
func ctxErr(ctx context.Context, where string) error {
	if err := ctx.Err(); err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			return status.Errorf(codes.DeadlineExceeded, "deadline passed %s", where)
		}
		return status.Errorf(codes.Canceled, "cancelled %s", where)
	}
	if dl, ok := ctx.Deadline(); ok && !time.Now().Before(dl) {
		return status.Errorf(codes.DeadlineExceeded, "deadline passed %s", where)
	}
	return nil
}

// Lookup implements prismv1.EmbeddingTierServer.
func (s *Server) Lookup(ctx context.Context, req *prismv1.LookupRequest) (*prismv1.LookupResponse, error) {
	if err := ctxErr(ctx, "before the lookup started"); err != nil {
		return nil, err
	}
	m := s.models[req.GetModel()]
	if m == nil {
		return nil, status.Errorf(codes.NotFound, "model %q is not served here (serving: %v)", req.GetModel(), s.Models())
	}
	n := int(req.GetNumSamples())
	if n <= 0 {
		return nil, badInput("num_samples %d: want at least 1", n)
	}
	if n > s.opts.MaxSamples {
		return nil, badInput("num_samples %d over this server's limit of %d per request: split the request", n, s.opts.MaxSamples)
	}
	if len(s.shards) != 0 || req.GetShards() != 0 {
		if err := checkShard(m.name, s.shards[m.name], req); err != nil {
			return nil, err
		}
	}
	if req.GetDenseAddr() == "" {
		return nil, badInput("dense_addr is empty: the router names the dense worker to send the tensors to")
	}
	if err := s.awaitDense(ctx, req.GetDenseAddr()); err != nil {
		return nil, err
	}
	if c := req.GetContent(); c != "" {
		if c != m.content {
			return nil, status.Errorf(codes.NotFound, "model %q of content %.16q is not served (serving content %q)", m.name, c, m.content)
		}
	} else if v := req.GetVersion(); v != 0 {
		if err := s.checkVersion(m.name, v); err != nil {
			return nil, err
		}
	}
	release, err := s.admit(int64(n), int64(n)*m.sampleBytes)
	if err != nil {
		return nil, err
	}
	defer release()
	s.met.samples.Observe(float64(n))

	times := &prismv1.StageTimes{}
	// The decode stage is the request's columns alone: it starts after
	// the wait for a dense worker the router has not yet named to this
	// one (awaitDense, up to its answer) and admission, which made every
	// lookup naming a newly joined (borrowed) dense worker read as a
	// decode spike.
	t0 := time.Now()
	vals, err := m.decode(req, n)
	if err != nil {
		return nil, err
	}
	t1 := time.Now()
	times.DecodeUs = t1.Sub(t0).Microseconds()

	// pre.onnx first (preonnx.go): the frame's context columns depend on
	// its outputs (context.go). Timed with the lookups.
	if err := m.runPre(vals, n); err != nil {
		return nil, err
	}
	// With a known layout the frame is laid out first and the lookups
	// gather rows straight into it: no copy between lookup and wire.
	fb := framePool.Get().(*[]byte)
	var frame []byte
	var into map[string][]float32
	var dd *dedup
	// Context-only cut tensors go as one row (context.go).
	ctxCut, anyCtx := m.contextCut(vals)
	if m.cols != nil {
		cols := m.contextCols(ctxCut, anyCtx)
		if m.dedup != nil {
			cols = append([]arrowframe.Column(nil), cols...)
			dd = dedupFor(m, vals, n, cols, ctxCut)
			defer dd.release() // the lookups read its ids until the handler returns
		}
		var views [][]float32
		var index [][]int32
		if frame, views, index, err = arrowframe.AppendFrameIndexed(*fb, n, cols); err != nil {
			framePool.Put(fb)
			return nil, status.Errorf(codes.Internal, "model %q: %v", m.name, err)
		}
		*fb = frame[:0]
		into = make(map[string][]float32, len(views))
		for i, c := range m.cols {
			into[c.Name] = views[i]
			if dd != nil && dd.ids[i] != nil {
				copy(index[i], dd.index[i])
			}
		}
	}
	if err := s.lookup(m, vals, n, into, dd); err != nil {
		framePool.Put(fb)
		return nil, err
	}
	t2 := time.Now()
	times.LookupUs = t2.Sub(t1).Microseconds()

	if m.cpu != nil {
		if err := runCPU(m, vals, n); err != nil {
			framePool.Put(fb)
			s.floods.Log(slog.LevelError, m.name, "cpu model failed", "model", m.name, "request_id", req.GetRequestId(), "err", err)
			return nil, status.Errorf(codes.Internal, "model %q: cpu subgraph: %v", m.name, err)
		}
	}
	t3 := time.Now()
	times.CpuModelUs = t3.Sub(t2).Microseconds()

	if into != nil {
		err = fillCut(into, m, vals, n, ctxCut)
	} else {
		frame, err = encodeCut(*fb, m, vals, n, ctxCut)
		*fb = frame[:0]
	}
	if err != nil {
		framePool.Put(fb)
		return nil, status.Errorf(codes.Internal, "model %q: %v", m.name, err)
	}
	t4 := time.Now()
	times.EncodeUs = t4.Sub(t3).Microseconds()
	if tracing.Recording(ctx) {
		tracing.Annotate(ctx, attribute.String("prism.model", m.name), attribute.Int("prism.samples", n), attribute.Int("prism.shard", int(req.GetShard())))
		tracing.Stage(ctx, "embedding.decode", t0, t1)
		tracing.Stage(ctx, "embedding.lookup", t1, t2)
		tracing.Stage(ctx, "embedding.cpu_model", t2, t3)
		tracing.Stage(ctx, "embedding.encode", t3, t4)
	}

	if err := ctxErr(ctx, "before the dense call"); err != nil {
		framePool.Put(fb)
		return nil, err
	}
	dc, release, err := s.dense(req.GetDenseAddr())
	if err != nil {
		framePool.Put(fb)
		return nil, err
	}
	defer release()
	sreq := &prismv1.ScoreRequest{Model: m.name, Version: req.GetVersion(), Tensors: frame, NumSamples: int32(n), Content: m.content,
		FanoutKey: req.GetFanoutKey(), Shard: req.GetShard(), Shards: req.GetShards()}
	if sr := s.shards[m.name]; sr != nil && req.GetShards() != 0 {
		sreq.Sharding = sr.sharding // the dense worker refuses a part of another sharding
	}
	sctx := serve.WatchAnswer(ctx)
	resp, err := dc.Score(sctx, sreq)
	if err != nil {
		// The frame is not reused: serve.Codec hands it to the transport
		// without a copy, and a failed call (cancelled, reset) may not
		// have finished sending it. The dense tier's status goes back
		// unchanged; a transport failure is already a status
		// (Unavailable, DeadlineExceeded ...), and one of Unavailable
		// names the dense worker it could not reach, so that the router
		// stops picking that one rather than this worker.
		if serve.TransportFailed(sctx, err) {
			return nil, prismv1.DenseUnreachableError(req.GetDenseAddr(), err)
		}
		return nil, err
	}
	// A successful answer means the dense worker read the whole frame.
	framePool.Put(fb)
	s.met.frame(len(frame), n)
	t5 := time.Now()
	times.DenseUs = resp.GetDenseUs()
	times.TransferUs = max(t5.Sub(t4).Microseconds()-times.DenseUs, 0)
	// A multi-task model's dense worker answers tasks values per sample
	// (ScoreResponse.tasks), passed on for the router to split.
	tasks := resp.GetTasks()
	if tasks < 0 || tasks > plan.MaxTasks || len(resp.GetScores()) != n*max(int(tasks), 1) {
		return nil, status.Errorf(codes.Internal, "dense worker %s returned %d scores for %d samples of %d tasks", req.GetDenseAddr(), len(resp.GetScores()), n, max(tasks, 1))
	}
	s.met.observe(times)
	return &prismv1.LookupResponse{Scores: resp.GetScores(), Times: times, Version: s.activeVersion(m.name), Content: m.content, Tasks: tasks, TaskNames: resp.GetTaskNames()}, nil
}

// activeVersion is the version of model the store serves (0 if none),
// read from the store's published view: no lock, so a lookup's answer
// and the heartbeat never wait for a catalog write or an upsert under
// way, which sync to the WAL holding the catalog's lock (a cache of
// the version read under that lock, refreshed twice a second, held
// every lookup of the model behind the refresh that waited).
func (s *Server) activeVersion(model string) int64 {
	return int64(s.st.ActiveVersion(model))
}

func (s *Server) checkVersion(model string, v int64) error {
	vs, err := s.st.Versions(model)
	if err != nil {
		return storeStatus(err)
	}
	for _, vi := range vs {
		if vi.Active {
			if int64(vi.N) != v {
				return status.Errorf(codes.NotFound, "model %q version %d is not served (serving version %d; 0 asks for it)", model, v, vi.N)
			}
			return nil
		}
	}
	return status.Errorf(codes.NotFound, "model %q has no active version", model)
}

// storeStatus maps a store error to a gRPC status.
func storeStatus(err error) error {
	var gap *store.SeqGapError
	var stale *store.StaleEpochError
	switch {
	case errors.As(err, &stale):
		// The router that sent it lost the sequencing Lease: it must
		// not count this worker as holding the update (prismv1.IsStaleEpoch).
		return prismv1.StaleEpochError(stale.Model, stale.Seq, stale.Epoch, stale.Held)
	case errors.As(err, &gap):
		return status.Error(codes.FailedPrecondition, err.Error())
	case errors.Is(err, store.ErrUnknownModel), errors.Is(err, store.ErrUnknownVersion):
		return status.Error(codes.NotFound, err.Error())
	case store.IsInputError(err):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, store.ErrClosed):
		return status.Error(codes.Unavailable, err.Error())
	case errors.Is(err, store.ErrCorrupt):
		// A damaged block of this worker's store (the message names
		// the file): its rows are lost here, not at a peer's, so the
		// router tries another replica.
		return status.Error(codes.DataLoss, err.Error())
	case errors.Is(err, store.ErrDiskFull):
		// Nothing written, no number taken: the router catches the
		// worker up once space is freed.
		return status.Error(codes.ResourceExhausted, err.Error())
	}
	return status.Errorf(codes.Internal, "embedding store: %v", err)
}

// columnBufs are the buffers packed inputs are split into
// (prelookup.Columns), reused across micro-batches.
var columnBufs sync.Pool

// lookup runs every table lookup of the model in one store batch. A
// lookup whose ids (and weights) come from the context runs for one
// sample and its output stays one sample, a context value (repeated for
// all n only where a stage needs every sample: cpu.onnx, a frame column
// that is not a context column). A lookup whose output is a cut tensor
// with a view in into writes there (the frame being built; a context
// column's view is one row).
//
// On a shard holding part of a row-wise table, that table's lookups are
// partial (shard.go): pooled over the shard's rows, written as the
// output's partial column and, for the sum_count and max_count combines,
// its counts column.
// dd, when set, names the frame columns going dictionary-encoded
// (dedup.go): their lookups take the distinct ids, one row each, into
// the dictionary.
func (s *Server) lookup(m *model, vals map[string]*value, n int, into map[string][]float32, dd *dedup) error {
	distinct := func(i int) ([]int64, bool) {
		if dd == nil || dd.byLookup[i] == nil {
			return nil, false
		}
		return dd.byLookup[i], true
	}
	// pre.onnx (preonnx.go) has run: Lookup runs it before laying out the
	// frame, whose context columns depend on its outputs (context.go).
	sr := s.shards[m.name]
	batch := make([]store.TableLookup, len(m.lookups))
	once := make([]bool, len(m.lookups))
	var split map[string][]int64 // an input's columns (lookupSpec.split), made once
	defer func() {
		// The store lookups are done with the ids: the buffers go back.
		for _, cols := range split {
			columnBufs.Put(&cols)
		}
	}()
	for i, ls := range m.lookups {
		l := ls.l
		ids := vals[l.Input]
		if l.PreOutput != "" {
			ids = preIDs(vals, l, n)
		}
		if ls.pre != nil {
			// The pre-lookup ops make the ids from the input, natively.
			samples := n
			if ids.ctx {
				samples = 1
			}
			var made []int64
			var err error
			if k, ok := ls.pre.FirstColumn(); ok && ls.split && ids.i64 != nil {
				cols, done := split[l.Input]
				if !done {
					var buf []int64
					if b, ok := columnBufs.Get().(*[]int64); ok {
						buf = *b
					}
					if cols, err = prelookup.Columns(samples, ls.pre.InWidth, ids.i64, buf); err != nil {
						return badInput("model %q: input %q: %v", m.name, l.Input, err)
					}
					if split == nil {
						split = map[string][]int64{}
					}
					split[l.Input] = cols
				}
				made, err = ls.pre.RunColumn(samples, cols[k*samples:(k+1)*samples])
			} else {
				made, err = ls.pre.Run(samples, ids.f32, ids.i64)
			}
			if err != nil {
				return badInput("model %q: lookup of table %q: input %q: %v", m.name, ls.table, l.Input, err)
			}
			ids = &value{width: ls.pre.Width, i64: made, w: ids.w, ctx: ids.ctx}
		}
		var w []float32
		wctx := true
		if l.Weights != "" {
			if wv := vals[l.Weights]; wv != nil {
				w, wctx = wv.f32, wv.ctx
				if ids.ctx && !wv.ctx {
					ids = ids.full(n)
				} else if !ids.ctx && wv.ctx {
					w = tile(w, n)
				}
			} else {
				w = ids.w
			}
			if w == nil {
				// Pooling without them would silently score wrong.
				return badInput("model %q: lookup of %q needs per-id weights: send input %q, or weights on input %q", m.name, l.Input, l.Weights, l.Input)
			}
		}
		once[i] = ids.ctx && wctx
		samples := n
		if once[i] {
			samples = 1
		}
		if bag := max(l.Bag, 1); l.Offsets == "" && len(ids.i64) != samples*bag {
			// An input of a per-sample shape the plan leaves unknown:
			// its ids must still make the lookup's bags.
			return badInput("model %q: lookup of table %q: input %q has %d ids for %d samples, want %d per sample (bag %d)", m.name, ls.table, l.Input, len(ids.i64), samples, bag, bag)
		}
		if u, ok := distinct(i); ok {
			ids, samples = &value{width: 1, i64: u}, len(u)
		}
		size := samples * ls.dim
		if l.Pooling == plan.PoolNone {
			size = len(ids.i64) * ls.dim
		}
		po, partial := sr.partialOf(l.Output)
		name := l.Output
		if partial {
			name = arrowframe.PartialName(l.Output)
		}
		out := into[name] // one row for a context column
		if len(out) != size {
			out = make([]float32, size)
		}
		batch[i] = store.TableLookup{Table: ls.table, IDs: ids.i64, Bag: l.Bag, Weights: w, Pooling: l.Pooling, Out: out, Partial: partial}
		if l.Offsets != "" { // a jagged bag (jagged.go): offsets n+1, checked at decode
			batch[i].Offsets = vals[l.Offsets].i64
		}
		if partial && po.Combine != plan.CombineSum {
			counts := into[arrowframe.CountName(l.Output)]
			if once[i] || len(counts) != samples {
				counts = make([]float32, samples)
			}
			batch[i].Counts = counts
		}
	}
	if err := s.st.Lookup(m.name, batch); err != nil {
		return storeStatus(requestPosition(err, m, vals, batch, dd))
	}
	for i, ls := range m.lookups {
		l := ls.l
		out := batch[i].Out
		shape := []int64{int64(n), int64(ls.dim)}
		if l.Pooling == plan.PoolNone && !l.Rank1 {
			shape = []int64{int64(n), int64(l.Bag), int64(ls.dim)}
		}
		if !batch[i].Partial {
			if u, ok := distinct(i); ok {
				// A dictionary's rows, in the frame already: only its
				// column reads them (dedupColumns).
				vals[l.Output] = &value{width: ls.dim, shape: []int64{int64(len(u)), int64(ls.dim)}, f32: out}
				continue
			}
			// A lookup run once stays one sample (a context value):
			// tiled only where a stage needs every sample.
			vals[l.Output] = &value{width: len(out), shape: shape, f32: out, ctx: once[i]}
			if !once[i] {
				vals[l.Output].width = len(out) / n
			}
			continue
		}
		if once[i] {
			out = tile(out, n)
		}
		vals[arrowframe.PartialName(l.Output)] = &value{width: len(out) / n, shape: shape, f32: out}
		if counts := batch[i].Counts; counts != nil {
			if once[i] {
				counts = tile(counts, n)
			}
			vals[arrowframe.CountName(l.Output)] = &value{width: 1, shape: []int64{int64(n), 1}, f32: counts}
		}
	}
	return nil
}

// requestPosition is err, from the store's lookup of m's batch, with a
// bad id's error (store.IDError) of a lookup given distinct ids (dd,
// dedup.go) naming the id's position among the request's ids, not among
// the distinct ones. A dictionary lookup's request ids are its input's
// as they came (dedupFor takes only those), so nothing is kept for this
// on the way: it costs only a failed lookup.
//
// A bad id that a lookup's pre-lookup ops (or pre.onnx) made is not in
// the request at all: its error names the input and the sample it was
// made from instead (an ids[k] of the ops' output read as the input's
// k-th id named another sample, or another column of a packed input).
func requestPosition(err error, m *model, vals map[string]*value, batch []store.TableLookup, dd *dedup) error {
	var bad *store.IDError
	if !errors.As(err, &bad) {
		return err
	}
	// The store stops at the first lookup, in batch order, with a bad
	// id: the first of the table's lookups holding it there.
	for i, ls := range m.lookups {
		r := batch[i]
		if r.Table != bad.Table || bad.Index >= len(r.IDs) || r.IDs[bad.Index] != bad.ID {
			continue
		}
		if (dd != nil && dd.byLookup[i] != nil) || (ls.pre == nil && ls.l.PreOutput == "") {
			break
		}
		l := ls.l
		in, made := l.Input, "pre-lookup ops"
		if l.PreOutput != "" {
			made = "pre-lookup subgraph (pre.onnx)"
		}
		bag := max(l.Bag, 1)
		where := fmt.Sprintf("input %q, sample %d", in, bad.Index/bag)
		if v := vals[in]; v != nil && v.ctx && len(r.IDs) == bag {
			where = fmt.Sprintf("context input %q", in)
		}
		what := fmt.Sprintf("id %d", bad.ID)
		if bag > 1 {
			what = fmt.Sprintf("id %d (bag position %d)", bad.ID, bad.Index%bag)
		}
		if errors.Is(bad.Err, store.ErrNegativeID) {
			return fmt.Errorf("model %q: %s: the lookup's %s make %s for table %q: %w", m.name, where, made, what, bad.Table, bad.Err)
		}
		return fmt.Errorf("model %q: %s: the lookup's %s make %s for table %q, which has %d rows: %w", m.name, where, made, what, bad.Table, bad.Rows, bad.Err)
	}
	if dd == nil {
		return err
	}
	for i, u := range dd.byLookup {
		if u == nil || batch[i].Table != bad.Table || bad.Index >= len(u) || u[bad.Index] != bad.ID {
			continue
		}
		if v := vals[m.lookups[i].l.Input]; v != nil {
			if k := slices.Index(v.i64, bad.ID); k >= 0 {
				at := *bad
				at.Index = k
				return fmt.Errorf("model %q: %w", m.name, &at)
			}
		}
	}
	return err
}

// runCPU runs the CPU subgraph; its outputs join vals.
func runCPU(m *model, vals map[string]*value, n int) error {
	ins := make([]ort.Input, 0, len(m.cpuIns))
	for _, name := range m.cpuIns {
		v := vals[name]
		if v == nil {
			return fmt.Errorf("no value for its input %q", name)
		}
		v = v.full(n)
		ins = append(ins, ort.Input{Name: name, Shape: v.shape, Float32: v.f32, Int64: v.i64})
	}
	outs, err := m.cpu.Run(ins)
	if err != nil {
		return err
	}
	isCtx := func(name string) bool { v := vals[name]; return v != nil && v.ctx }
	for i, name := range m.cpuOuts {
		shape := append([]int64{int64(n)}, m.cutShape(name)...)
		w := len(outs[i]) / n
		if m.cpuContext(name, isCtx) {
			// Computed from context values alone: every row is the first.
			vals[name] = &value{width: w, shape: shape, f32: outs[i][:w:w], ctx: true}
			continue
		}
		vals[name] = &value{width: w, shape: shape, f32: outs[i]}
	}
	return nil
}

// framePool recycles frame buffers: a frame is half a megabyte for a
// 270-sample DLRM micro-batch. A buffer comes back only after a
// successful Score: serve.Codec sends the frame without copying it.
var framePool = sync.Pool{New: func() any { b := make([]byte, 0, 1<<20); return &b }}

// fillCut copies into the frame's views the cut tensors that are not
// already there (lookups wrote theirs in place): dense features, CPU
// subgraph outputs. A context column (ctx[i]) takes its value's one row.
func fillCut(into map[string][]float32, m *model, vals map[string]*value, n int, ctx []bool) error {
	for i, c := range m.cut {
		v := vals[c.name]
		if v == nil {
			return fmt.Errorf("cut tensor %q was not produced", c.name)
		}
		if v.i64 != nil {
			return fmt.Errorf("cut tensor %q is int64; the dense tier takes float32 tensors", c.name)
		}
		dst := into[c.name]
		rows := 1
		if !ctx[i] || !v.ctx {
			v, rows = v.full(n), n
		}
		if len(v.f32) != len(dst) {
			return fmt.Errorf("cut tensor %q: %d values for %d samples, the plan's shape %v holds %d", c.name, len(v.f32), rows, c.shape, len(dst))
		}
		if len(dst) > 0 && &v.f32[0] == &dst[0] {
			continue // written in place
		}
		copy(dst, v.f32)
	}
	return nil
}

// encodeCut frames the cut tensors in plan order, into dst's storage; a
// context-only one (ctx[i]) as a context column.
func encodeCut(dst []byte, m *model, vals map[string]*value, n int, ctx []bool) ([]byte, error) {
	ts := make([]arrowframe.Tensor, len(m.cut))
	for i, c := range m.cut {
		v := vals[c.name]
		if v == nil {
			return nil, fmt.Errorf("cut tensor %q was not produced", c.name)
		}
		if v.i64 != nil {
			return nil, fmt.Errorf("cut tensor %q is int64; the dense tier takes float32 tensors", c.name)
		}
		if ctx[i] && v.ctx {
			ts[i] = arrowframe.Tensor{Name: c.name, Width: len(v.f32), Data: v.f32, Context: true}
			continue
		}
		v = v.full(n)
		ts[i] = arrowframe.Tensor{Name: c.name, Width: len(v.f32) / n, Data: v.f32}
	}
	return arrowframe.AppendEncode(dst, n, ts)
}
