package gpuserve

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/internal/arrowframe"
	"github.com/prism-serve/prism/plan"
)

// A sharded model (plan.json sharding) reaches the dense worker in
// parts: the router sends one micro-batch to one embedding worker of
// every shard, each looks up its own tables and sends its columns here
// marked with the micro-batch's fan-out key, its shard and the shard
// count (ScoreRequest.fanout_key, shard, shards). The assembler waits
// for every part of a key, scores the assembled frame once and answers
// every part's Score call with the scores. A part missing when a waiting
// part's deadline passes fails every part of the key: no partial score.

// maxFanoutKey bounds a fan-out key's bytes.
const maxFanoutKey = 256

// assembler holds one model's fan-outs in assembly.
type assembler struct {
	mu      sync.Mutex
	pending map[string]*fanout
	// samples are the pending fan-outs' samples, bounded by max (the
	// batcher's queue bound): parts waiting for their siblings hold
	// memory as queued work does.
	samples, max int
}

// fanout is one key's parts so far.
type fanout struct {
	key    string
	shards int
	n      int
	got    []bool      // per shard: its part arrived
	count  int         // parts arrived
	inputs [][]float32 // per cut tensor, in dense.onnx order
	from   []int       // per cut tensor, the shard that sent it
	done   chan struct{}
	// scores and err are set before done is closed.
	scores []float32
	err    error
}

func newAssembler(max int) *assembler {
	return &assembler{pending: map[string]*fanout{}, max: max}
}

// finish settles f with err (nil: scores), at most once; a.mu held.
func (a *assembler) finish(f *fanout, scores []float32, err error) {
	select {
	case <-f.done:
		return
	default:
	}
	if a.pending[f.key] == f {
		delete(a.pending, f.key)
		a.samples -= f.n
	}
	f.scores, f.err = scores, err
	close(f.done)
}

// missing lists the shards whose parts have not arrived; a.mu held.
func (f *fanout) missing() []int {
	var out []int
	for i, ok := range f.got {
		if !ok {
			out = append(out, i)
		}
	}
	return out
}

// partTensor is one decoded column of a part.
type partTensor struct {
	index int
	data  []float32
}

// scorePart takes one part of a sharded fan-out: it joins the part to
// its key's others and waits for the scores of the whole.
func (s *Server) scorePart(ctx context.Context, m *model, req *prismv1.ScoreRequest, start time.Time) (*prismv1.ScoreResponse, error) {
	n, shard, shards, key := int(req.GetNumSamples()), int(req.GetShard()), int(req.GetShards()), req.GetFanoutKey()
	switch {
	case key == "" || len(key) > maxFanoutKey:
		return nil, s.invalid(m, "model %q: a part of a sharded frame (shards %d) needs a fan-out key of 1 to %d bytes, got %d", m.name, shards, maxFanoutKey, len(key))
	case shards < 1 || shards > plan.MaxShards:
		return nil, s.invalid(m, "model %q: fan-out %q: shards %d, want 1 to %d", m.name, key, shards, plan.MaxShards)
	case shard < 0 || shard >= shards:
		return nil, s.invalid(m, "model %q: fan-out %q: shard %d of %d", m.name, key, shard, shards)
	case n <= 0:
		return nil, s.invalid(m, "model %q: num_samples is %d; want at least 1", m.name, n)
	case n > s.opts.MaxSamples:
		return nil, s.invalid(m, "model %q: %d samples in one request; this dense worker takes at most %d (split the request)", m.name, n, s.opts.MaxSamples)
	}
	parts, err := decodePart(m, req.GetTensors(), n)
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
	a := m.assembly
	a.mu.Lock()
	f := a.pending[key]
	if f == nil {
		if a.samples+n > a.max {
			a.mu.Unlock()
			s.metrics.reject(m.name, "overloaded")
			return nil, status.Errorf(codes.ResourceExhausted, "model %q: %d samples of sharded fan-outs wait for their parts, limit %d", m.name, a.samples, a.max)
		}
		f = &fanout{key: key, shards: shards, n: n, got: make([]bool, shards), inputs: make([][]float32, len(m.spec)), from: make([]int, len(m.spec)), done: make(chan struct{})}
		a.pending[key] = f
		a.samples += n
	}
	if f.shards != shards || f.n != n {
		err := status.Errorf(codes.InvalidArgument, "model %q: fan-out %q: parts disagree: shard %d says %d shards and %d samples, an earlier part %d shards and %d samples", m.name, key, shard, shards, n, f.shards, f.n)
		a.finish(f, nil, err)
		a.mu.Unlock()
		s.metrics.reject(m.name, "invalid")
		return nil, err
	}
	if f.got[shard] {
		a.mu.Unlock()
		// The first part stands; this one is refused alone.
		return nil, s.invalid(m, "model %q: fan-out %q: shard %d sent its part twice", m.name, key, shard)
	}
	for _, p := range parts {
		if f.inputs[p.index] != nil {
			err := status.Errorf(codes.InvalidArgument, "model %q: fan-out %q: tensor %q sent by shards %d and %d", m.name, key, m.spec[p.index].Name, f.from[p.index], shard)
			a.finish(f, nil, err)
			a.mu.Unlock()
			s.metrics.reject(m.name, "invalid")
			return nil, err
		}
	}
	for _, p := range parts {
		f.inputs[p.index], f.from[p.index] = p.data, shard
	}
	f.got[shard] = true
	f.count++
	if f.count < f.shards {
		a.mu.Unlock()
		return s.awaitFanout(ctx, m, f, start)
	}
	// The last part: the frame is whole (or a tensor is nobody's).
	delete(a.pending, key)
	a.samples -= n
	a.mu.Unlock()
	var missing []string
	for i, in := range f.inputs {
		if in == nil {
			missing = append(missing, m.spec[i].Name)
		}
	}
	var scores []float32
	if len(missing) > 0 {
		err = status.Errorf(codes.InvalidArgument, "model %q: fan-out %q: no shard sent tensors %s", m.name, key, strings.Join(missing, ", "))
		s.metrics.reject(m.name, "invalid")
	} else {
		var outs [][]float32
		outs, err = m.batcher.Submit(ctx, Request{N: n, Inputs: f.inputs})
		switch {
		case err != nil:
			err = s.submitError(m, err)
		case len(outs[0]) != n:
			err = status.Errorf(codes.Internal, "model %q: first output has %d values for %d samples", m.name, len(outs[0]), n)
		default:
			scores = outs[0]
		}
	}
	a.mu.Lock()
	a.finish(f, scores, err)
	a.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return &prismv1.ScoreResponse{Scores: scores, DenseUs: time.Since(start).Microseconds()}, nil
}

// awaitFanout waits for f's scores; at ctx's end it fails every part of
// f still waiting (a shard missing at the deadline).
func (s *Server) awaitFanout(ctx context.Context, m *model, f *fanout, start time.Time) (*prismv1.ScoreResponse, error) {
	select {
	case <-f.done:
	case <-ctx.Done():
		a := m.assembly
		a.mu.Lock()
		select {
		case <-f.done: // settled meanwhile
		default:
			code := codes.DeadlineExceeded
			if errors.Is(ctx.Err(), context.Canceled) {
				code = codes.Canceled
			}
			missing := f.missing()
			a.finish(f, nil, status.Errorf(code, "model %q: fan-out %q: shard(s) %v of %d did not send their part in time", m.name, f.key, missing, f.shards))
			s.metrics.reject(m.name, "deadline")
		}
		a.mu.Unlock()
	}
	if f.err != nil {
		return nil, f.err
	}
	return &prismv1.ScoreResponse{Scores: f.scores, DenseUs: time.Since(start).Microseconds()}, nil
}

func (s *Server) invalid(m *model, format string, args ...any) error {
	s.metrics.reject(m.name, "invalid")
	return status.Errorf(codes.InvalidArgument, format, args...)
}

// decodePart checks one part's frame: cut tensors of the plan, each
// once, of the plan's width, n samples.
func decodePart(m *model, tensors []byte, n int) ([]partTensor, error) {
	got, ts, err := arrowframe.Decode(tensors)
	if err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "model %q: tensors: %v", m.name, err)
	}
	if got != n && len(ts) > 0 {
		return nil, status.Errorf(codes.InvalidArgument, "model %q: tensors hold %d samples, num_samples says %d", m.name, got, n)
	}
	out := make([]partTensor, 0, len(ts))
	for _, t := range ts {
		i, ok := m.index[t.Name]
		switch {
		case !ok:
			return nil, status.Errorf(codes.InvalidArgument, "model %q: tensor %q is not a cut tensor of the plan (want %s)", m.name, t.Name, m.cutNames())
		case slices.ContainsFunc(out, func(p partTensor) bool { return p.index == i }):
			return nil, status.Errorf(codes.InvalidArgument, "model %q: tensor %q appears twice", m.name, t.Name)
		case t.Width != m.spec[i].Width:
			return nil, status.Errorf(codes.InvalidArgument, "model %q: tensor %q has width %d; the plan says %d (shape %v)", m.name, t.Name, t.Width, m.spec[i].Width, m.spec[i].Shape)
		}
		out = append(out, partTensor{index: i, data: t.Data})
	}
	return out, nil
}

// String describes a fan-out for logs.
func (f *fanout) String() string {
	return fmt.Sprintf("fan-out %q (%d of %d parts, %d samples)", f.key, f.count, f.shards, f.n)
}
