package gpuserve

import (
	"context"
	"errors"
	"fmt"
	"github.com/prism-serve/prism/gpuserve/devices"
	"github.com/prism-serve/prism/plan"
	"log/slog"
	"os"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/internal/arrowframe"
	"github.com/prism-serve/prism/internal/ort"
)

// Options configure a dense tier Server.
type Options struct {
	// Plans are partition folders (plan.json + dense.onnx), one per model.
	Plans []string
	Batch BatchOptions
	// Threads is the intra-op pool size of each ONNX Runtime session
	// (each of Sessions, of each model). 0: the cores (GOMAXPROCS) shared
	// among the runs that can be in flight at once (sessionThreads), so
	// Sessions S does not start S pools of every core; with one run at a
	// time ONNX Runtime chooses (one thread per physical core).
	Threads int
	// Spin lets ONNX Runtime's idle threads spin (see ort.SessionOptions).
	Spin bool
	// AcrossModels says whether a worker serving several models runs
	// their formed batches by deadline across the models through one
	// RunGate (gate.go): "on" (or "", the default) or "off", each model
	// running its batches as formed. On the 2-core sandbox the two
	// measured alike within a wide spread (BENCHMARKS), the gate with
	// the better worst runs.
	AcrossModels string
	// Sessions is how many ONNX Runtime sessions each model gets on the
	// worker's device, each run by a batching loop of its own, so one
	// session's host work (assembling a batch, copies, launches) overlaps
	// another's run (default 1).
	Sessions int
	// MaxSamples bounds one Score request (default 4096, at most
	// Batch.MaxQueue: a request the queue could never hold is refused as
	// too large rather than as overload).
	MaxSamples int
	// Memory is the bytes this process may use, against which a batch's
	// inputs are checked (batchFits); 0: the machine's memory or its
	// memory cgroup's limit (memlimit.Read), a negative value: no check.
	Memory int64
	// NVML is the device library for discovery (nvml.New() in production);
	// nil skips discovery and serves on the CPU execution provider.
	NVML   nvml.Interface
	Logger *slog.Logger
}

// EnsureDefaults fills zero fields.
func (o *Options) EnsureDefaults() {
	o.Batch.EnsureDefaults()
	if o.MaxSamples <= 0 {
		o.MaxSamples = 4096
	}
	o.MaxSamples = min(o.MaxSamples, o.Batch.MaxQueue)
	if o.Sessions <= 0 {
		o.Sessions = 1
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
}

// DefaultMaxBatch is the dense tier's batch size when none is given: 512
// samples on the CPU, where larger batches add latency and no throughput
// (1024 measured 62k against 65k samples/s on 2 cores, p99 higher);
// 4096 on CUDA, where a batch of one 270-candidate request leaves the GPU
// waiting on each run's launches and copies (dlrm-kaggle on an H200, four
// dense workers: 1.08M samples/s at 4096 against 0.56M at 512;
// BENCHMARKS.md).
func DefaultMaxBatch(cuda bool) int {
	if cuda {
		return 4096
	}
	return 512
}

// Validate reports options that cannot work.
func (o *Options) Validate() error {
	if len(o.Plans) == 0 {
		return errors.New("no models to serve: give at least one plan folder")
	}
	if o.Threads < 0 {
		return fmt.Errorf("threads %d: want 0 (the cores shared among the sessions) or more", o.Threads)
	}
	if o.Sessions < 0 || o.Sessions > 64 {
		return fmt.Errorf("sessions %d: want 1 to 64 per model (0: one)", o.Sessions)
	}
	switch o.AcrossModels {
	case "", "on", "off":
	default:
		return fmt.Errorf("across models %q: want on or off", o.AcrossModels)
	}
	return nil
}

// Server is the dense tier: one batcher over ONNX Runtime per model. It
// implements prismv1.DenseTierServer; the caller owns the gRPC server and
// calls Close after it has stopped taking requests.
type Server struct {
	prismv1.UnimplementedDenseTierServer
	opts   Options
	log    *slog.Logger
	models map[string]*model
	names  []string
	device string
	// cuda: sessions run on the CUDA execution provider.
	cuda    bool
	metrics *metrics

	mu     sync.RWMutex
	closed bool
}

var _ prismv1.DenseTierServer = (*Server)(nil)

// model is one served dense.onnx.
type model struct {
	name  string
	plan  *plan.Plan
	spec  []InputSpec
	index map[string]int // cut tensor name -> spec position
	// sessions are the model's ONNX Runtime sessions
	// (Options.Sessions), one batching loop each.
	sessions []*ort.Session
	batcher  *Batcher
	// assembly joins the parts of sharded fan-outs (assemble.go).
	assembly *assembler
	// fixed, when not 0, is the only batch dense.onnx runs at
	// (plan.DenseFixedBatch): requests of exactly that many samples,
	// run one at a time.
	fixed int
	// content identifies the model (plan.Plan.Content; "" unknown):
	// announced, and checked against the embedding worker's.
	content string
	// tasks is the number of values per sample of the score (plan.Tasks):
	// 1, or k for a multi-task model, answered sample-major.
	tasks int
	// widths are the values per sample of each output the model answers
	// with (plan.TaskWidths): one entry, or one per task output, whose
	// values scores interleaves sample-major.
	widths []int
	// taskNames names the tasks values (plan.TaskNames) when tasks > 1:
	// ScoreResponse.task_names.
	taskNames []string
}

// maxTaskName is plan.MaxTaskName (loadModel's plan is the plan read).
const maxTaskName = plan.MaxTaskName

// longestName is the length of the longest of names.
func longestName(names []string) int {
	n := 0
	for _, s := range names {
		n = max(n, len(s))
	}
	return n
}

// New discovers devices, loads every plan's dense.onnx and starts the
// batchers.
func New(o Options) (*Server, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	s := &Server{opts: o, log: o.Logger, models: map[string]*model{}, device: "cpu"}
	if err := ort.Init(); err != nil {
		return nil, err
	}
	s.device = s.chooseDevice()
	// The batch size follows the device found (a zero MaxBatch).
	if o.Batch.MaxBatch <= 0 {
		o.Batch.MaxBatch = DefaultMaxBatch(s.cuda)
	}
	o.EnsureDefaults()
	if len(o.Plans) > 1 && o.Batch.Gate == nil && o.AcrossModels != "off" {
		// The models share the worker's device: their batches run by
		// deadline across models, as many at once as one model's
		// sessions (gate.go).
		o.Batch.Gate = NewRunGate(o.Sessions)
	}
	s.opts = o
	for _, dir := range o.Plans {
		m, err := loadModel(dir, o, s.cuda)
		if err != nil {
			s.Close()
			return nil, err
		}
		if _, dup := s.models[m.name]; dup {
			m.batcher.Close()
			m.closeSessions()
			s.Close()
			return nil, fmt.Errorf("load %s: model %q is served twice", dir, m.name)
		}
		if m.content, err = m.plan.Content(dir); err != nil {
			if pd := (*plan.PartDamagedError)(nil); errors.As(err, &pd) && pd.Role == "dense" {
				m.batcher.Close()
				m.closeSessions()
				s.Close()
				return nil, fmt.Errorf("load %s: %w", dir, err)
			}
			// A copy of the plan without every ONNX part (a dense host
			// given plan.json and dense.onnx only): its model cannot be
			// told from another, so it pairs with any embedding worker.
			s.log.Warn("model content unknown: the router pairs this worker with embedding workers of any content", "model", m.name, "err", err)
		}
		s.models[m.name] = m
		s.names = append(s.names, m.name)
		s.log.Info("dense model loaded", "model", m.name, "dir", dir, "content", m.content, "inputs", len(m.spec), "bytes_per_sample", m.bytesPerSample())
	}
	sort.Strings(s.names)
	s.metrics = newMetrics(s)
	return s, nil
}

// chooseDevice runs NVML discovery once and says, once, why the dense
// tier serves on the CPU execution provider.
func (s *Server) chooseDevice() string {
	if s.opts.NVML == nil {
		return "cpu"
	}
	d, err := devices.Discover(s.opts.NVML)
	switch {
	case err != nil:
		s.log.Warn("GPU discovery failed: serving on the CPU execution provider", "err", err)
		return "cpu"
	case d.NoDriver != "":
		s.log.Info(d.WhyCPU() + ": serving on the CPU execution provider")
		return "cpu"
	}
	for _, why := range d.Skipped {
		s.log.Warn("GPU not used: " + why)
	}
	pinned, set := os.LookupEnv("CUDA_VISIBLE_DEVICES")
	if set && cudaHidesAll(pinned) {
		// NVML lists the GPUs whatever CUDA_VISIBLE_DEVICES says; a CUDA
		// session in this process would find none and fail to load.
		s.log.Info(fmt.Sprintf("CUDA_VISIBLE_DEVICES=%q hides every NVIDIA device from CUDA: serving on the CPU execution provider", pinned))
		return "cpu"
	}
	var found []string
	for _, dev := range d.Devices {
		found = append(found, string(dev.Kind)+" "+dev.UUID)
	}
	if reason := cudaUnavailable(); reason != "" {
		s.log.Warn(fmt.Sprintf("%d NVIDIA device(s) found but ONNX Runtime has no CUDA execution provider (%s): serving on the CPU execution provider", len(d.Devices), reason),
			"devices", strings.Join(found, ","), "driver", d.DriverVersion, "cuda_visible_devices", pinned, "ort_lib", ort.LibraryPath())
		return "cpu"
	}
	s.cuda = true
	dev, ok := pinnedDevice(d, pinned)
	if !ok {
		// An index, or a UUID NVML does not list: CUDA's order need not
		// be NVML's, so the device is named as CUDA_VISIBLE_DEVICES names it.
		label := "cuda " + strings.TrimSpace(strings.Split(pinned, ",")[0])
		s.log.Info("serving on the CUDA execution provider", "device", label, "cuda_visible_devices", pinned)
		return label
	}
	s.log.Info("serving on the CUDA execution provider", "device", string(dev.Kind)+" "+dev.UUID, "name", dev.Name, "cuda_visible_devices", pinned)
	return string(dev.Kind) + " " + dev.UUID
}

// pinnedDevice is the device of d that CUDA numbers 0 in a process whose
// CUDA_VISIBLE_DEVICES is pinned: the one its first entry names by UUID
// (prism up starts one worker per GPU or MIG slice that way), else, with
// none set, the first device. ok is false when the first entry names
// none of d's devices by UUID (an index: CUDA's order need not be
// NVML's).
func pinnedDevice(d devices.Discovery, pinned string) (devices.Device, bool) {
	first := strings.TrimSpace(strings.Split(pinned, ",")[0])
	if first == "" {
		return d.Devices[0], true
	}
	for _, cand := range d.Devices {
		if cand.VisibleDevices() == first || cand.UUID == first {
			return cand, true
		}
	}
	return devices.Device{}, false
}

// cudaHidesAll reports whether a CUDA_VISIBLE_DEVICES that is set leaves
// CUDA no device: empty, or a negative index first (CUDA reads the list
// up to its first invalid entry; -1 is the usual way to hide them all).
func cudaHidesAll(visible string) bool {
	first := strings.TrimSpace(strings.Split(visible, ",")[0])
	if first == "" {
		return true
	}
	n, err := strconv.Atoi(first)
	return err == nil && n < 0
}

// newSession loads an ONNX Runtime session: a variable for the tests.
var newSession = ort.NewSession

// sessionThreads is the intra-op pool size each ONNX Runtime session of
// a server of options o gets on a machine of cores cores: o.Threads when
// given, else the cores shared among the runs that can be in flight at
// once. Those are one model's sessions; with several models, the gate's
// slots (as many as one model's sessions) or, without the gate, every
// model's sessions. A single run at a time is left ONNX Runtime's
// choice (0: one thread per physical core), as before sessions shared,
// unless the process has fewer cores than the machine (all): GOMAXPROCS
// set below the machine's cores by the user, by a container's CPU quota
// (which Go's GOMAXPROCS follows) or by prism up for one of several CPU
// dense workers. ONNX Runtime's choice counts the machine's cores, so
// each of several workers given --threads 0 ran a thread per core of the
// whole machine.
func sessionThreads(o Options, cores, all int) int {
	runs := max(o.Sessions, 1)
	if len(o.Plans) > 1 && o.Batch.Gate == nil {
		runs *= len(o.Plans)
	}
	return ort.IntraOpThreads(o.Threads, runs, cores, all)
}

func loadModel(dir string, o Options, cuda bool) (*model, error) {
	plan, err := plan.Read(dir)
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", dir, err)
	}
	m := &model{name: plan.ServedName(dir), plan: plan, index: map[string]int{}}
	if len(plan.Cut) == 0 {
		return nil, fmt.Errorf("load %s: plan has no cut tensors", dir)
	}
	for i, ct := range plan.Cut {
		if ct.DType != "float32" {
			return nil, fmt.Errorf("load %s: cut tensor %q is %s; the dense tier takes float32 only", dir, ct.Name, ct.DType)
		}
		w := 1
		for _, d := range ct.Shape {
			if d <= 0 {
				return nil, fmt.Errorf("load %s: cut tensor %q has per-sample shape %v: every dimension must be known", dir, ct.Name, ct.Shape)
			}
			w *= int(d)
		}
		m.spec = append(m.spec, InputSpec{Name: ct.Name, Width: w, Shape: ct.Shape})
		m.index[ct.Name] = i
	}
	// One score per sample, or k of a multi-task model's [k] (bounded):
	// every one answered (ScoreResponse.tasks).
	if m.widths, err = plan.TaskWidths(); err != nil {
		return nil, fmt.Errorf("load %s: %w", dir, err)
	}
	var outputs []string
	for i, w := range m.widths {
		m.tasks += w
		outputs = append(outputs, plan.Outputs[i].Name)
	}
	if m.tasks > 1 {
		if m.taskNames, err = plan.TaskNames(); err != nil {
			return nil, fmt.Errorf("load %s: %w", dir, err)
		}
		// A name past the router's bound fails every request there
		// (Internal): the tasks go unnamed, as from an earlier release.
		if n := longestName(m.taskNames); n > maxTaskName {
			o.Logger.Warn("a task's name is too long to pass on: the model's tasks are answered unnamed (ScoreResponse.task_names empty), in the plan's order", "dir", dir, "bytes", n, "max", maxTaskName)
			m.taskNames = nil
		}
	}
	bo := o.Batch
	if fb := plan.DenseFixedBatch(); fb > 0 {
		// Batches of one request each: the router sends micro-batches of
		// exactly fb (router/fixedbatch.go).
		m.fixed, bo.MaxBatch = int(fb), int(fb)
	}
	if err := batchFits(m.name, m.spec, bo.MaxBatch, o.memory()); err != nil {
		return nil, fmt.Errorf("load %s: %w", dir, err)
	}
	path, err := planFile(dir, plan.DenseModel)
	if err != nil {
		return nil, fmt.Errorf("load %s: %w", dir, err)
	}
	threads := sessionThreads(o, runtime.GOMAXPROCS(0), runtime.NumCPU())
	for range max(o.Sessions, 1) {
		// Only the scores: a dense.onnx may list other outputs (an
		// auxiliary head, the monolith's other outputs), in any order,
		// and Score answers with Run's, in the plan's order.
		sess, err := newSession(path, ort.SessionOptions{IntraOpThreads: threads, CUDA: cuda, Spin: o.Spin, Outputs: outputs})
		if err != nil {
			m.closeSessions()
			return nil, fmt.Errorf("load %s: the plan's scores are its outputs %q: %w", dir, outputs, err)
		}
		m.sessions = append(m.sessions, sess)
	}
	if got := m.sessions[0].InputNames(); !sameNames(got, plan.Cut) {
		m.closeSessions()
		return nil, fmt.Errorf("load %s: dense model inputs %v differ from the plan's cut", dir, got)
	}
	var runners []Runner
	for _, sess := range m.sessions {
		if err := warmUp(sess, m.spec, bo.MaxBatch, m.fixed); err != nil {
			m.closeSessions()
			return nil, fmt.Errorf("load %s: warm-up run: %w", dir, err)
		}
		runners = append(runners, sess)
	}
	m.batcher = NewBatcher(m.spec, runners, bo)
	m.assembly = newAssembler(o.Batch.MaxQueue)
	m.assembly.sharding = m.plan.Sharding.Fingerprint()
	if m.assembly.partials, err = partialSpecs(m); err != nil {
		m.batcher.Close()
		m.closeSessions()
		return nil, fmt.Errorf("load %s: %w", dir, err)
	}
	return m, nil
}

// closeSessions closes every ONNX Runtime session of the model.
func (m *model) closeSessions() {
	for _, s := range m.sessions {
		s.Close()
	}
}

func sameNames(got []string, cut []plan.CutTensor) bool {
	if len(got) != len(cut) {
		return false
	}
	for i := range got {
		if got[i] != cut[i].Name {
			return false
		}
	}
	return true
}

func (m *model) bytesPerSample() int {
	n := 0
	for _, s := range m.spec {
		n += 4 * s.Width
	}
	return n
}

// Models are the served model names, sorted.
func (s *Server) Models() []string { return append([]string(nil), s.names...) }

// Device is what the worker runs on, as the registry shows it ("cpu",
// "gpu GPU-...", "mig MIG-...").
func (s *Server) Device() string { return s.device }

// Outstanding is the samples queued or running over all models.
func (s *Server) Outstanding() int64 {
	var n int64
	for _, m := range s.models {
		n += int64(m.batcher.QueueDepth())
	}
	return n
}

// WorkerInfo is what the worker announces to the router's registry: id
// (unique per process) and addr are the caller's.
func (s *Server) WorkerInfo(id, addr string) *prismv1.WorkerInfo {
	info := &prismv1.WorkerInfo{
		Id: id, Role: prismv1.Role_ROLE_DENSE, Addr: addr, Models: s.Models(),
		Device: s.Device(), Outstanding: s.Outstanding(), Healthy: s.Healthy(),
	}
	for name, m := range s.models {
		// The sharding its plan combines row-wise parts by: the router
		// pairs it with embedding workers of that sharding. A plan
		// without one combines none: said so (prismv1.NoSharding), not
		// left unnamed, which the router reads as a worker of an earlier
		// release that may (a dense worker still on the plan from before
		// prism shard was picked for row-wise fan-outs and refused them,
		// InvalidArgument, the request failed).
		fp := m.assembly.sharding
		if fp == "" {
			fp = prismv1.NoSharding
		}
		if info.Sharding == nil {
			info.Sharding = map[string]string{}
		}
		info.Sharding[name] = fp
		if m.content != "" {
			if info.Content == nil {
				info.Content = map[string]string{}
			}
			info.Content[name] = m.content
		}
	}
	return info
}

// Healthy is false once Close has begun.
func (s *Server) Healthy() bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return !s.closed
}

// Close finishes the queued work, stops the batchers and frees the
// sessions. Parts of sharded fan-outs still waiting for their siblings,
// and Score calls after Close, get Unavailable.
func (s *Server) Close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	s.mu.Unlock()
	for _, m := range s.models {
		if m.assembly != nil {
			failed := m.assembly.closeAll(status.Errorf(codes.Unavailable, "model %q: %v: the parts of this fan-out still missing will not be scored here", m.name, ErrClosed))
			for range failed {
				// Once per fan-out, as a deadline that fails one counts.
				s.metrics.reject(m.name, "closed")
			}
		}
		m.batcher.Close()
		m.closeSessions()
	}
}

// Score runs one micro-batch of cut tensors through its model's dense.onnx.
func (s *Server) Score(ctx context.Context, req *prismv1.ScoreRequest) (*prismv1.ScoreResponse, error) {
	start := time.Now()
	m, ok := s.models[req.GetModel()]
	if !ok {
		s.metrics.reject("", "not_found")
		return nil, status.Errorf(codes.NotFound, "model %q is not served here (serving %s)", req.GetModel(), strings.Join(s.names, ", "))
	}
	if err := ctx.Err(); err != nil {
		s.metrics.reject(m.name, "deadline")
		return nil, status.FromContextError(err).Err()
	}
	if c := req.GetContent(); c != "" && m.content != "" && c != m.content {
		// The embedding worker serves another model of this name (a
		// rollout of a retrained model): its rows with this dense.onnx
		// would score garbage. Another pair may serve.
		s.metrics.reject(m.name, "content")
		err := status.Errorf(codes.Aborted, "model %q: the embedding worker looked up content %.16q; this dense worker serves content %q", m.name, c, m.content)
		if key := req.GetFanoutKey(); key != "" {
			// A part of a fan-out: its siblings waiting here are failed
			// now, not at their deadline.
			m.assembly.refuse(key, int(req.GetShard()), int(req.GetShards()), status.Errorf(codes.Aborted, "model %q: fan-out %q: shard %d's part was refused: %s", m.name, key, req.GetShard(), status.Convert(err).Message()))
		}
		return nil, err
	}
	if req.GetShards() != 0 || req.GetFanoutKey() != "" {
		return s.scorePart(ctx, m, req, start)
	}
	in, err := s.decode(m, req)
	if err != nil {
		s.metrics.reject(m.name, "invalid")
		return nil, err
	}
	s.mu.RLock()
	closed := s.closed
	s.mu.RUnlock()
	if closed {
		s.metrics.reject(m.name, "closed")
		return nil, status.Error(codes.Unavailable, ErrClosed.Error())
	}
	outs, err := m.batcher.Submit(ctx, in)
	if err != nil {
		return nil, s.submitError(m, err)
	}
	scores, err := m.scores(outs, in.N)
	if err != nil {
		return nil, err
	}
	return &prismv1.ScoreResponse{Scores: scores, DenseUs: time.Since(start).Microseconds(), Tasks: m.wireTasks(), TaskNames: m.taskNames}, nil
}

// scores is a run's answer for n samples: the score output's values, or
// a multi-task model's task outputs' interleaved sample-major (sample
// i's values of output 0, then of output 1, ...). A count that is not n
// times an output's width is an Internal error.
func (m *model) scores(outs [][]float32, n int) ([]float32, error) {
	if len(outs) != len(m.widths) {
		return nil, status.Errorf(codes.Internal, "model %q: the run answered %d outputs, want %d", m.name, len(outs), len(m.widths))
	}
	for j, w := range m.widths {
		if len(outs[j]) != n*w {
			return nil, status.Errorf(codes.Internal, "model %q: output %d has %d values for %d samples of %d tasks", m.name, j, len(outs[j]), n, w)
		}
	}
	if len(outs) == 1 {
		return outs[0], nil
	}
	res := make([]float32, 0, n*m.tasks)
	for i := range n {
		for j, w := range m.widths {
			res = append(res, outs[j][i*w:(i+1)*w]...)
		}
	}
	return res, nil
}

// wireTasks is ScoreResponse.tasks for the model's answers: k for a
// multi-task model, 0 for one score per sample (as before).
func (m *model) wireTasks() int32 {
	if m.tasks > 1 {
		return int32(m.tasks)
	}
	return 0
}

// decode checks a request against the plan's cut and returns the batcher
// request, inputs in dense.onnx order.
func (s *Server) decode(m *model, req *prismv1.ScoreRequest) (Request, error) {
	n := int(req.GetNumSamples())
	switch {
	case n <= 0:
		return Request{}, status.Errorf(codes.InvalidArgument, "model %q: num_samples is %d; want at least 1", m.name, n)
	case n > s.opts.MaxSamples:
		return Request{}, status.Errorf(codes.InvalidArgument, "model %q: %d samples in one request; this dense worker takes at most %d (split the request)", m.name, n, s.opts.MaxSamples)
	case m.fixed > 0 && n != m.fixed:
		return Request{}, status.Errorf(codes.InvalidArgument, "model %q: %d samples: dense.onnx was exported with a fixed batch of %d (plan.json fixed_batch), so it runs batches of exactly %d", m.name, n, m.fixed, m.fixed)
	}
	// Dictionary columns stay unexpanded (their distinct rows and
	// indices, views of the frame): the batcher gathers their rows
	// straight into the batch it writes anyway (Request.Index). The
	// frame's samples and columns are checked against num_samples and
	// the plan first: a frame the fast path declines goes to arrow-go's
	// reader, which expands every dictionary column.
	seen := make([]bool, len(m.spec))
	want := arrowframe.Want{Rows: n, Column: func(name string, width int) error {
		i, ok := m.index[name]
		if !ok {
			return status.Errorf(codes.InvalidArgument, "model %q: tensor %q is not a cut tensor of the plan (want %s)", m.name, name, m.cutNames())
		}
		return m.checkColumn(seen, i, name, width, m.spec[i].Width)
	}}
	_, ts, err := arrowframe.DecodeIndexedWant(req.GetTensors(), want)
	if err != nil {
		return Request{}, m.decodeError(err, n)
	}
	inputs := make([][]float32, len(m.spec))
	var ctx []bool      // nil unless some tensor is a context column
	var index [][]int32 // nil unless some tensor is dictionary-encoded
	for _, t := range ts {
		i, ok := m.index[t.Name]
		if !ok {
			return Request{}, status.Errorf(codes.InvalidArgument, "model %q: tensor %q is not a cut tensor of the plan (want %s)", m.name, t.Name, m.cutNames())
		}
		if inputs[i] != nil {
			return Request{}, status.Errorf(codes.InvalidArgument, "model %q: tensor %q appears twice", m.name, t.Name)
		}
		if t.Width != m.spec[i].Width {
			return Request{}, status.Errorf(codes.InvalidArgument, "model %q: tensor %q has width %d; the plan says %d (shape %v)", m.name, t.Name, t.Width, m.spec[i].Width, m.spec[i].Shape)
		}
		inputs[i] = t.Data
		if t.Index != nil {
			if index == nil {
				index = make([][]int32, len(m.spec))
			}
			index[i] = t.Index
		}
		if t.Context {
			if ctx == nil {
				ctx = make([]bool, len(m.spec))
			}
			ctx[i] = true
		}
	}
	var missing []string
	for i, in := range inputs {
		if in == nil {
			missing = append(missing, m.spec[i].Name)
		}
	}
	if len(missing) > 0 {
		return Request{}, status.Errorf(codes.InvalidArgument, "model %q: missing tensors %s", m.name, strings.Join(missing, ", "))
	}
	return Request{N: n, Inputs: inputs, Context: ctx, Index: index}, nil
}

// checkColumn refuses a frame's column name (of width floats) that is
// the second of its name (seen[i]: the first came) or not of the plan's
// width.
func (m *model) checkColumn(seen []bool, i int, name string, width, plan int) error {
	if seen[i] {
		return status.Errorf(codes.InvalidArgument, "model %q: tensor %q appears twice", m.name, name)
	}
	seen[i] = true
	if width != plan {
		return status.Errorf(codes.InvalidArgument, "model %q: tensor %q has width %d; the plan says %d (shape %v)", m.name, name, width, plan, m.spec[i].Shape)
	}
	return nil
}

// decodeError is the status of a frame arrowframe.DecodeWant refused for
// a Score request of n samples.
func (m *model) decodeError(err error, n int) error {
	var rows *arrowframe.RowsError
	switch {
	case errors.As(err, &rows):
		return status.Errorf(codes.InvalidArgument, "model %q: tensors hold %d samples, num_samples says %d", m.name, rows.Got, n)
	case status.Code(err) != codes.Unknown:
		return err // a column refused by the plan
	}
	return status.Errorf(codes.InvalidArgument, "model %q: tensors: %v", m.name, err)
}

func (m *model) cutNames() string {
	names := make([]string, len(m.spec))
	for i, s := range m.spec {
		names[i] = s.Name
	}
	return strings.Join(names, ", ")
}

func (s *Server) submitError(m *model, err error) error {
	switch {
	case errors.Is(err, ErrOverloaded):
		s.metrics.reject(m.name, "overloaded")
		return status.Errorf(codes.ResourceExhausted, "model %q: %v (%d samples queued or running, limit %d)", m.name, err, m.batcher.QueueDepth(), s.opts.Batch.MaxQueue)
	case errors.Is(err, ErrClosed):
		s.metrics.reject(m.name, "closed")
		return status.Error(codes.Unavailable, err.Error())
	case errors.As(err, new(*DeadlineError)):
		// Refused by the batcher for its deadline: the message says why.
		s.metrics.reject(m.name, "deadline")
		return status.Errorf(codes.DeadlineExceeded, "model %q: %v", m.name, err)
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		s.metrics.reject(m.name, "deadline")
		return status.FromContextError(err).Err()
	}
	s.metrics.reject(m.name, "error")
	return status.Errorf(codes.Internal, "model %q: %v", m.name, err)
}

// warmUp runs the session on zeros at a spread of batch sizes before the
// worker takes traffic, so the first requests do not pay for ONNX
// Runtime's first runs (kernel selection, arena growth): measured at 300
// ms of p99 in the first seconds of the demo without it.
//
// A model fixed at a batch (fixed > 0) is warmed up at that batch only.
func warmUp(r Runner, spec []InputSpec, maxBatch, fixed int) error {
	seen := map[int]bool{}
	sizes := []int{1, 16, 64, 256, maxBatch}
	if fixed > 0 {
		sizes = []int{fixed}
	}
	for _, n := range sizes {
		if n > maxBatch || seen[n] {
			continue
		}
		seen[n] = true
		ins := make([]ort.Input, len(spec))
		for i, s := range spec {
			ins[i] = ort.Input{Name: s.Name, Shape: append([]int64{int64(n)}, s.Shape...), Float32: make([]float32, n*s.Width)}
		}
		if _, err := r.Run(ins); err != nil {
			return err
		}
	}
	return nil
}

// planFile resolves a file the plan names inside its folder (plan.Resolve:
// no symlink out of it); in loadModel a local variable hides package plan.
func planFile(dir, rel string) (string, error) { return plan.Resolve(dir, rel) }
