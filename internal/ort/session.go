package ort

import (
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	ort "github.com/yalue/onnxruntime_go"
)

// SessionOptions are the knobs Prism sets on an ONNX Runtime session.
type SessionOptions struct {
	// IntraOpThreads is the thread pool size for one operator; 0 lets
	// ONNX Runtime choose (one per core).
	IntraOpThreads int
	// InterOpThreads is the pool for running operators in parallel; 0: 1.
	InterOpThreads int
	// CUDA runs the session on the CUDA execution provider, on device
	// CUDADevice of those the process sees (CUDA_VISIBLE_DEVICES pins a
	// worker to one GPU or MIG slice, which is then device 0). It needs an
	// ONNX Runtime build with CUDA (ORT_LIB); the CPU build `make setup`
	// installs refuses it with an error.
	CUDA       bool
	CUDADevice int
	// TF32 lets cuBLAS run the CUDA session's float32 matrix products in
	// TF32 (Ampere and later): faster, but about 1e-3 off float32, so
	// scores no longer match the monolith's within 1e-5. Off by default.
	TF32 bool
	// Spin lets idle intra-op threads spin-wait for work (ONNX Runtime's
	// default). Off, they sleep: slower to wake, but they leave the cores to
	// the other tiers when Prism shares a machine.
	Spin bool
	// Outputs, when set, are the only outputs Run computes and returns,
	// in this order (ONNX Runtime skips the nodes only the others need);
	// a name the model does not output is an error. Nil: every output,
	// in graph order.
	Outputs []string
}

// Input is one named float32, int64 or int32 input of a Run. The slice
// of the model input's type holds exactly the values Shape holds.
type Input struct {
	Name    string
	Shape   []int64
	Float32 []float32
	Int64   []int64
	// Int32 feeds an int32 model input; without it, an int32 input takes
	// Int64 narrowed (two's complement, as ONNX Cast wraps).
	Int32 []int32
}

// Session is a loaded model. Run may be called from several goroutines:
// ONNX Runtime sessions are safe for concurrent Run calls.
type Session struct {
	path    string
	inputs  []ort.InputOutputInfo
	outputs []ort.InputOutputInfo
	// mu guards s: Run holds it shared, Close exclusively, so a session is
	// never destroyed under a running call.
	mu sync.RWMutex
	s  *ort.DynamicAdvancedSession
}

// sharedArena: ShareArena registered the environment's CPU arena, and
// sessions made since use it.
var (
	sharedArena     atomic.Bool
	shareArenaOnce  sync.Once
	shareArenaError error
)

// ShareArena makes the sessions created from now on in this process
// allocate their CPU memory from one arena, the ONNX Runtime
// environment's, instead of one arena each. A session's arena grows to
// its largest run and keeps it, so a process serving many models held
// the sum of their peaks (20 sessions of dlrm-kaggle's dense side after
// one 4,096-sample run each: 872 MB resident; shared, 177 MB). Memory
// on a CUDA device keeps its provider's arenas. Idempotent.
func ShareArena() error {
	shareArenaOnce.Do(func() {
		if shareArenaError = Init(); shareArenaError != nil {
			return
		}
		mi, err := ort.GetMemoryInfo()
		if err != nil {
			shareArenaError = fmt.Errorf("shared arena: %w", err)
			return
		}
		cfg, err := ort.NewArenaCfg(0, -1, -1, -1) // ONNX Runtime's defaults
		if err != nil {
			shareArenaError = fmt.Errorf("shared arena: %w", err)
			return
		}
		defer cfg.Destroy()
		if err := ort.CreateAndRegisterAllocator(mi, cfg); err != nil {
			shareArenaError = fmt.Errorf("shared arena: %w", err)
			return
		}
		sharedArena.Store(true)
	})
	return shareArenaError
}

// NewSession loads the model at path (external data is read from beside it).
func NewSession(path string, opts SessionOptions) (*Session, error) {
	if err := Init(); err != nil {
		return nil, err
	}
	ins, outs, err := ort.GetInputOutputInfo(path)
	if err != nil {
		return nil, fmt.Errorf("load model %q in ONNX Runtime: %w", path, err)
	}
	if opts.Outputs != nil {
		if len(opts.Outputs) == 0 {
			// ONNX Runtime would load it, and the first Run panic.
			return nil, fmt.Errorf("load model %q: no outputs asked for (nil: every output)", path)
		}
		if outs, err = pickOutputs(path, outs, opts.Outputs); err != nil {
			return nil, err
		}
	}
	if len(outs) == 0 {
		// ONNX Runtime loads such a model, and the binding's Run then
		// panics (it indexes the first output name).
		return nil, fmt.Errorf("load model %q in ONNX Runtime: the model has no outputs", path)
	}
	so, err := ort.NewSessionOptions()
	if err != nil {
		return nil, fmt.Errorf("session options: %w", err)
	}
	defer so.Destroy()
	if opts.IntraOpThreads > 0 {
		if err := so.SetIntraOpNumThreads(opts.IntraOpThreads); err != nil {
			return nil, fmt.Errorf("session options: %w", err)
		}
	}
	inter := max(opts.InterOpThreads, 1)
	if err := so.SetInterOpNumThreads(inter); err != nil {
		return nil, fmt.Errorf("session options: %w", err)
	}
	if !opts.Spin && opts.IntraOpThreads != 1 {
		if err := so.AddSessionConfigEntry("session.intra_op.allow_spinning", "0"); err != nil {
			return nil, fmt.Errorf("session options: %w", err)
		}
	}
	if sharedArena.Load() {
		if err := so.AddSessionConfigEntry("session.use_env_allocators", "1"); err != nil {
			return nil, fmt.Errorf("session options: %w", err)
		}
	}
	if opts.CUDA {
		po, err := ort.NewCUDAProviderOptions()
		if err != nil {
			return nil, fmt.Errorf("load model %q on CUDA: %w", path, err)
		}
		defer po.Destroy()
		// use_tf32 0: ONNX Runtime's CUDA provider otherwise lets cuBLAS
		// run float32 matrix products in TF32 (10-bit mantissas) on
		// Ampere and later, and scores would drift from the monolith's
		// by more than Prism's 1e-5.
		tf32 := "0"
		if opts.TF32 {
			tf32 = "1"
		}
		if err := po.Update(map[string]string{"device_id": fmt.Sprint(opts.CUDADevice), "use_tf32": tf32}); err != nil {
			return nil, fmt.Errorf("load model %q on CUDA: %w", path, err)
		}
		if err := so.AppendExecutionProviderCUDA(po); err != nil {
			return nil, fmt.Errorf("load model %q on CUDA: %w", path, err)
		}
	}
	names := func(infos []ort.InputOutputInfo) []string {
		out := make([]string, len(infos))
		for i, in := range infos {
			out[i] = in.Name
		}
		return out
	}
	s, err := ort.NewDynamicAdvancedSession(path, names(ins), names(outs), so)
	if err != nil {
		return nil, fmt.Errorf("load model %q in ONNX Runtime: %w", path, err)
	}
	sess := &Session{path: path, inputs: ins, outputs: outs, s: s}
	runtime.SetFinalizer(sess, func(s *Session) { s.Close() })
	return sess, nil
}

// pickOutputs returns the infos of the outputs named by want, in want's
// order.
func pickOutputs(path string, outs []ort.InputOutputInfo, want []string) ([]ort.InputOutputInfo, error) {
	picked := make([]ort.InputOutputInfo, 0, len(want))
	for _, name := range want {
		i := slices.IndexFunc(outs, func(o ort.InputOutputInfo) bool { return o.Name == name })
		if i < 0 {
			have := make([]string, len(outs))
			for k, o := range outs {
				have[k] = fmt.Sprintf("%q", o.Name)
			}
			return nil, fmt.Errorf("load model %q: it has no output %q (its outputs: %s)", path, name, strings.Join(have, ", "))
		}
		picked = append(picked, outs[i])
	}
	return picked, nil
}

// InputNames are the model's inputs in graph order.
func (s *Session) InputNames() []string {
	out := make([]string, len(s.inputs))
	for i, in := range s.inputs {
		out[i] = in.Name
	}
	return out
}

// OutputNames are the outputs Run returns: SessionOptions.Outputs, or
// else every output of the model in graph order.
func (s *Session) OutputNames() []string {
	out := make([]string, len(s.outputs))
	for i, o := range s.outputs {
		out[i] = o.Name
	}
	return out
}

// Run scores one batch. in must hold every model input, in any order; the
// outputs come back as float32 slices in OutputNames order. The returned
// slices are owned by the caller.
func (s *Session) Run(in []Input) ([][]float32, error) {
	if err := s.checkOutputs("float32", ort.TensorElementDataTypeFloat); err != nil {
		return nil, err
	}
	outs, err := s.run(in)
	if err != nil {
		return nil, err
	}
	defer destroy(outs)
	res := make([][]float32, len(outs))
	for i, o := range outs {
		t, ok := o.(*ort.Tensor[float32])
		if !ok {
			return nil, fmt.Errorf("run %q: output %q is not float32", s.path, s.outputs[i].Name)
		}
		res[i] = append([]float32(nil), t.GetData()...)
	}
	return res, nil
}

// RunInt64 is Run for a model whose outputs are integers (int64, or
// int32 widened): a pre-lookup subgraph's ids.
func (s *Session) RunInt64(in []Input) ([][]int64, error) {
	if err := s.checkOutputs("int64 or int32", ort.TensorElementDataTypeInt64, ort.TensorElementDataTypeInt32); err != nil {
		return nil, err
	}
	outs, err := s.run(in)
	if err != nil {
		return nil, err
	}
	defer destroy(outs)
	res := make([][]int64, len(outs))
	for i, o := range outs {
		switch t := o.(type) {
		case *ort.Tensor[int64]:
			res[i] = append([]int64(nil), t.GetData()...)
		case *ort.Tensor[int32]:
			res[i] = make([]int64, len(t.GetData()))
			for k, v := range t.GetData() {
				res[i][k] = int64(v)
			}
		default:
			return nil, fmt.Errorf("run %q: output %q is not int64 or int32", s.path, s.outputs[i].Name)
		}
	}
	return res, nil
}

// checkOutputs refuses, before anything runs, a model whose outputs are
// not of the types the caller reads: a float16 output otherwise failed
// inside the binding with "not enough space: expected 8, got 4" (it
// copies one byte per element), after the run.
func (s *Session) checkOutputs(want string, types ...ort.TensorElementDataType) error {
	for _, o := range s.outputs {
		if o.OrtValueType != ort.ONNXTypeTensor || !slices.Contains(types, o.DataType) {
			return fmt.Errorf("run %q: output %q is %s, not %s: export the model with %s outputs (a Cast node before them)", s.path, o.Name, describe(o), want, want)
		}
	}
	return nil
}

// describe is the type of an input or output: its element type for a
// tensor, else what kind of value it is.
func describe(info ort.InputOutputInfo) string {
	if info.OrtValueType == ort.ONNXTypeTensor {
		return strings.ToLower(strings.TrimPrefix(info.DataType.String(), "ONNX_TENSOR_ELEMENT_DATA_TYPE_"))
	}
	return info.OrtValueType.String()
}

func destroy(vs []ort.Value) {
	for _, v := range vs {
		if v != nil {
			v.Destroy()
		}
	}
}

// newValue makes the OrtValue of input x for the model input info, or
// an error; it returns a nil Value (never a typed nil, which the caller
// would Destroy) with the error. x's data must hold exactly the values
// its shape holds: the binding would take a longer slice's first
// values silently, and a batch of the wrong shape scored would answer
// with other samples' scores.
func newValue(info ort.InputOutputInfo, x *Input) (ort.Value, error) {
	if len(x.Shape) == 0 {
		return nil, fmt.Errorf("no shape given (a scalar input is not supported)")
	}
	if err := ort.Shape(x.Shape).Validate(); err != nil {
		return nil, fmt.Errorf("shape %v: %w", x.Shape, err)
	}
	n := ort.Shape(x.Shape).FlattenedSize()
	check := func(kind string, have int) error {
		if int64(have) == n {
			return nil
		}
		given := ""
		switch {
		case have == 0 && len(x.Float32) > 0:
			given = " (float32 values given)"
		case have == 0 && len(x.Int64) > 0:
			given = " (int64 values given)"
		case have == 0 && len(x.Int32) > 0:
			given = " (int32 values given)"
		}
		return fmt.Errorf("the model takes %s; shape %v holds %d values, %d %s given%s", kind, x.Shape, n, have, kind, given)
	}
	switch info.DataType {
	case ort.TensorElementDataTypeFloat:
		return tensorOf(x.Shape, x.Float32, check("float32", len(x.Float32)))
	case ort.TensorElementDataTypeInt64:
		return tensorOf(x.Shape, x.Int64, check("int64", len(x.Int64)))
	case ort.TensorElementDataTypeInt32:
		v := x.Int32
		if v == nil {
			v = make([]int32, len(x.Int64))
			for k, id := range x.Int64 {
				v[k] = int32(id)
			}
		}
		return tensorOf(x.Shape, v, check("int32", len(v)))
	}
	return nil, fmt.Errorf("unsupported input type %v", info.DataType)
}

// tensorOf is the tensor of data in shape, unless checked failed: nil
// and an error then (never a typed nil).
func tensorOf[T ort.TensorData](shape []int64, data []T, checked error) (ort.Value, error) {
	if checked != nil {
		return nil, checked
	}
	t, err := ort.NewTensor(ort.Shape(shape), data)
	if err != nil {
		return nil, err
	}
	return t, nil
}

// run feeds in to the session and returns its outputs, which the
// caller destroys.
func (s *Session) run(in []Input) ([]ort.Value, error) {
	byName := make(map[string]*Input, len(in))
	for i := range in {
		byName[in[i].Name] = &in[i]
	}
	values := make([]ort.Value, len(s.inputs))
	defer func() {
		for _, v := range values {
			if v != nil {
				v.Destroy()
			}
		}
	}()
	for i, info := range s.inputs {
		x, ok := byName[info.Name]
		if !ok {
			return nil, fmt.Errorf("run %q: missing input %q", s.path, info.Name)
		}
		v, err := newValue(info, x)
		if err != nil {
			return nil, fmt.Errorf("run %q: input %q: %w", s.path, info.Name, err)
		}
		values[i] = v
	}
	outs := make([]ort.Value, len(s.outputs))
	if err := s.runLocked(values, outs); err != nil {
		destroy(outs)
		return nil, err
	}
	return outs, nil
}

// runLocked runs the session under the shared lock, released however
// the run ends: a panic in the binding left it held, and Close (the
// caller's deferred one, the finalizer's) then waited forever.
func (s *Session) runLocked(values, outs []ort.Value) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	// The finalizer set in NewSession must not run while a call is inside
	// ONNX Runtime.
	defer runtime.KeepAlive(s)
	if s.s == nil {
		return fmt.Errorf("run %q: session closed", s.path)
	}
	if err := s.s.Run(values, outs); err != nil {
		return fmt.Errorf("run %q: %w", s.path, err)
	}
	return nil
}

// Close frees the session. It is safe to call more than once.
func (s *Session) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.s == nil {
		return nil
	}
	err := s.s.Destroy()
	s.s = nil
	return err
}

// IntraOpThreads is the intra-op pool size of each of runs ONNX Runtime
// sessions that can run at once in a process of cores cores (GOMAXPROCS)
// on a machine of all: threads when given (> 0), else the cores shared
// among the runs, at least one thread each. A single run is left ONNX
// Runtime's choice (0: one thread per physical core of the machine)
// unless the process has fewer cores than the machine (GOMAXPROCS set,
// a container's CPU quota, prism up sharing the host among workers):
// then its cores. Each session has a pool of its own and ONNX Runtime's
// choice counts the whole machine, so S sessions given 0 each started a
// pool of every core. Both tiers size their sessions by it.
func IntraOpThreads(threads, runs, cores, all int) int {
	if threads > 0 {
		return threads
	}
	if runs <= 1 {
		if cores < all {
			return max(1, cores)
		}
		return 0
	}
	return max(1, cores/runs)
}
