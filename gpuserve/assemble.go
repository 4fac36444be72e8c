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
//
// A row-wise table's lookup output comes in parts: every shard holding
// part of the table sends its partial pools of the output as column
// arrowframe.PartialName(output) and, for the sum_count and max_count
// combines, its per-sample id counts as arrowframe.CountName(output)
// (width 1). Once every part is in, the assembler combines each such
// output by the plan's rule (plan.Combine; combinePartial) into the cut
// tensor, then scores.

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
	// partials: the plan's lookup outputs that arrive in parts, by
	// output name (partialSpecs); set at load, read-only after.
	partials map[string]*partialSpec
	// sharding is the fingerprint of the plan's sharding ("" for none),
	// set at load: partial parts of another sharding are refused.
	sharding string
	// closed: the server is closing (closeAll); parts are refused.
	closed bool
	// failed remembers the last maxFailedKeys fan-outs that failed (or
	// whose part was refused before any sibling came), oldest first in
	// failedKeys: a missing part of one, arriving after it failed, is
	// refused at once with the cause, where it started a fan-out of its
	// own and waited for siblings that had already been answered until
	// its deadline. (Prism's routers make keys unique per micro-batch
	// attempt; a part of another shard count, or of a shard that came,
	// is taken as a new fan-out.)
	failed     map[string]failedFanout
	failedKeys []string
}

// failedFanout is a failed fan-out's cause, its shard count and the
// shards whose parts had come.
type failedFanout struct {
	err    error
	shards int
	got    []bool
}

// maxFailedKeys bounds the failed fan-outs an assembler remembers, and
// maxShardsRemembered the shard count of one refused before any of its
// parts joined (its parts are not checked yet).
const (
	maxFailedKeys       = 4096
	maxShardsRemembered = 1024
)

// remember records that fan-out key of shards shards failed with err,
// the parts of the shards in got having come; a.mu held.
func (a *assembler) remember(key string, shards int, got []bool, err error) {
	if a.failed == nil {
		a.failed = map[string]failedFanout{}
	}
	if _, ok := a.failed[key]; !ok {
		if len(a.failedKeys) >= maxFailedKeys {
			delete(a.failed, a.failedKeys[0])
			a.failedKeys = a.failedKeys[1:]
		}
		a.failedKeys = append(a.failedKeys, key)
	}
	a.failed[key] = failedFanout{err: err, shards: shards, got: slices.Clone(got)}
}

// failedBefore is the cause of fan-out key's failure when the part of
// shard (of shards) is one it was missing; a.mu held.
func (a *assembler) failedBefore(key string, shard, shards int) (error, bool) {
	f, ok := a.failed[key]
	if !ok || f.shards != shards || shard < 0 || shard >= len(f.got) || f.got[shard] {
		return nil, false
	}
	return f.err, true
}

// closeAll answers every part waiting for its siblings with err, and
// every part coming after with Unavailable: on shutdown the missing
// parts would never be scored here, and their callers can go to another
// worker at once rather than at their deadlines. It returns how many
// fan-outs it failed.
func (a *assembler) closeAll(err error) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.closed = true
	n := 0
	for _, f := range a.pending {
		a.finish(f, nil, err)
		n++
	}
	return n
}

// partialSpec is a cut tensor that row-wise shards send in parts.
type partialSpec struct {
	index   int          // the cut tensor's position
	combine plan.Combine // how its parts combine
	shards  []int        // the shards that send a part, ascending
	counts  bool         // the parts carry per-sample counts
}

// partialSpecs reads the plan's sharding: which cut tensors come in
// parts, from which shards, combined how. A plan without sharding, or
// served whole, never sends a partial column.
func partialSpecs(m *model) (map[string]*partialSpec, error) {
	sh := m.plan.Sharding
	if sh == nil {
		return nil, nil
	}
	out := map[string]*partialSpec{}
	for _, info := range sh.Shard {
		for _, po := range info.Partial {
			i, ok := m.index[po.Output]
			if !ok {
				// An input of cpu.onnx: such a sharding cannot be served
				// (the embedding workers refuse it), while the plan can
				// still be served whole.
				continue
			}
			switch po.Combine {
			case plan.CombineSum, plan.CombineSumCount, plan.CombineMaxCount:
			default:
				return nil, fmt.Errorf("sharding: shard %d: output %q: combine %q, want sum, sum_count or max_count", info.Shard, po.Output, po.Combine)
			}
			ps := out[po.Output]
			if ps == nil {
				ps = &partialSpec{index: i, combine: po.Combine, counts: po.Combine != plan.CombineSum}
				out[po.Output] = ps
			} else if ps.combine != po.Combine {
				return nil, fmt.Errorf("sharding: output %q combined both by %s and %s", po.Output, ps.combine, po.Combine)
			}
			ps.shards = append(ps.shards, info.Shard)
		}
	}
	for _, ps := range out {
		slices.Sort(ps.shards)
	}
	return out, nil
}

// combinePartial writes into out (n samples of width floats) the
// combination of the shards' parts of one output (parts[k], counts[k]:
// the k-th shard's, counts nil for CombineSum): sum adds the parts;
// sum_count divides the summed parts by the summed counts; max_count
// takes the elementwise max over the parts whose count is not 0; a
// sample whose counts are 0 everywhere gets zeros.
func combinePartial(c plan.Combine, out []float32, parts, counts [][]float32, n, width int) {
	clear(out)
	switch c {
	case plan.CombineSum:
		for _, p := range parts {
			for i, x := range p[:len(out)] {
				out[i] += x
			}
		}
	case plan.CombineSumCount:
		for s := range n {
			o := out[s*width : (s+1)*width]
			var total float32
			for k, p := range parts {
				total += counts[k][s]
				for i, x := range p[s*width : (s+1)*width] {
					o[i] += x
				}
			}
			if total == 0 {
				clear(o)
				continue
			}
			for i := range o {
				o[i] /= total
			}
		}
	case plan.CombineMaxCount:
		for s := range n {
			o := out[s*width : (s+1)*width]
			first := true
			for k, p := range parts {
				if counts[k][s] == 0 {
					continue
				}
				src := p[s*width : (s+1)*width]
				if first {
					copy(o, src)
					first = false
					continue
				}
				for i, x := range src {
					o[i] = max(o[i], x)
				}
			}
		}
	}
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
	// ctx: per cut tensor, a context column (one row for all samples;
	// nil until a part sends one).
	ctx []bool
	// index: per cut tensor, a dictionary column's indices (its rows in
	// inputs; nil until a part sends one): the batcher gathers the rows
	// into the batch, as for a whole frame's (Request.Index).
	index [][]int32
	// parts and counts: per cut tensor sent in parts (partialSpec), per
	// shard, its part and its counts (nil until some part arrives).
	parts, counts [][][]float32
	done          chan struct{}
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
	if err != nil {
		a.remember(f.key, f.shards, f.got, err)
	}
	f.scores, f.err = scores, err
	close(f.done)
}

// refuse fails the parts of fan-out key waiting for their siblings, if
// any, with err: shard's part (of shards) was refused before it could
// join them. A fan-out that holds that shard's part already (this one
// came twice) stands.
func (a *assembler) refuse(key string, shard, shards int, err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	f := a.pending[key]
	if f == nil {
		// No sibling has come yet: those that do are refused at once.
		if shards >= 1 && shards <= maxShardsRemembered && shard >= 0 && shard < shards {
			got := make([]bool, shards)
			got[shard] = true
			a.remember(key, shards, got, err)
		}
		return
	}
	if f.shards == shards && shard >= 0 && shard < len(f.got) && f.got[shard] {
		return
	}
	a.finish(f, nil, err)
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

// otherSharding refuses a part of a fan-out from an embedding worker
// whose store holds sharding fp, this worker's plan own, saying why.
func otherSharding(model, key string, shard int, fp, own, why string) error {
	return status.Errorf(codes.FailedPrecondition, "model %q: fan-out %q: shard %d's embedding worker holds sharding %s, this dense worker's plan sharding %s: %s", model, key, shard, fp, own, why)
}

// partTensor is one decoded column of a part.
type partTensor struct {
	index int
	data  []float32
	// partial: a shard's part of a row-wise output (count: its counts).
	partial, count bool
	// context: data is one row, shared by every sample (never for a
	// partial column: decodePart expands those).
	context bool
	// dict: a dictionary-encoded whole column, left unexpanded: data
	// holds its distinct rows and dict each sample's row among them
	// (Request.Index; never for a partial column).
	dict []int32
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
	case m.fixed > 0 && n != m.fixed:
		return nil, s.invalid(m, "model %q: fan-out %q: %d samples: dense.onnx was exported with a fixed batch of %d (plan.json fixed_batch), so it runs batches of exactly %d", m.name, key, n, m.fixed, m.fixed)
	}
	parts, err := decodePart(m, req.GetTensors(), n)
	if err != nil {
		s.metrics.reject(m.name, "invalid")
		if fp, own := req.GetSharding(), m.assembly.sharding; fp != "" && fp != own {
			// Most likely why: parts of the sender's sharding that this
			// plan's does not send (a table row-wise in one, whole in the
			// other, or a plan from before prism shard).
			if own == "" {
				own = "none (a plan without sharding)"
			}
			err = otherSharding(m.name, key, shard, fp, own, status.Convert(err).Message())
		}
		// Without this part the fan-out is never whole: its waiting
		// parts are failed now, saying why, as by a part refused once
		// it has joined them, not at their deadline as a part that
		// never came.
		m.assembly.refuse(key, shard, shards, status.Errorf(status.Code(err), "model %q: fan-out %q: shard %d's part was refused: %s", m.name, key, shard, status.Convert(err).Message()))
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
	if a.closed {
		// Close came after the check above.
		a.mu.Unlock()
		s.metrics.reject(m.name, "closed")
		return nil, status.Error(codes.Unavailable, ErrClosed.Error())
	}
	f := a.pending[key]
	if f == nil {
		if cause, ok := a.failedBefore(key, shard, shards); ok {
			// A sibling's failure came first: the fan-out is answered.
			a.mu.Unlock()
			reason := "invalid"
			if status.Code(cause) == codes.DeadlineExceeded {
				reason = "deadline"
			}
			s.metrics.reject(m.name, reason)
			return nil, status.Errorf(status.Code(cause), "model %q: fan-out %q failed before shard %d's part came: %s", m.name, key, shard, status.Convert(cause).Message())
		}
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
	if fp := req.GetSharding(); fp != "" && a.sharding != "" && fp != a.sharding && slices.ContainsFunc(parts, func(p partTensor) bool { return p.partial }) {
		// Parts of a row-wise table's rows are combined by this worker's
		// plan: from a store of another sharding they may hold other rows
		// (wrong scores, no error). Whole tensors are the same in every
		// sharding, and a part naming none comes from a worker of an
		// earlier release.
		err := otherSharding(m.name, key, shard, fp, a.sharding, "the parts of row-wise tables cannot be combined; serve both from one plan (prism shard)")
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
		var err error
		switch {
		case f.inputs[p.index] != nil:
			err = status.Errorf(codes.InvalidArgument, "model %q: fan-out %q: tensor %q sent by shards %d and %d", m.name, key, m.spec[p.index].Name, f.from[p.index], shard)
		case !p.partial && f.parts != nil && (f.parts[p.index] != nil || f.counts[p.index] != nil):
			err = status.Errorf(codes.InvalidArgument, "model %q: fan-out %q: tensor %q sent whole by shard %d and in parts by others", m.name, key, m.spec[p.index].Name, shard)
		case p.partial && !slices.Contains(a.partials[m.spec[p.index].Name].shards, shard):
			err = status.Errorf(codes.InvalidArgument, "model %q: fan-out %q: shard %d sent a part of %q, which the plan's sharding gives to shards %v", m.name, key, shard, m.spec[p.index].Name, a.partials[m.spec[p.index].Name].shards)
		}
		if err != nil {
			a.finish(f, nil, err)
			a.mu.Unlock()
			s.metrics.reject(m.name, "invalid")
			return nil, err
		}
	}
	for _, p := range parts {
		if !p.partial {
			f.inputs[p.index], f.from[p.index] = p.data, shard
			if p.dict != nil {
				if f.index == nil {
					f.index = make([][]int32, len(m.spec))
				}
				f.index[p.index] = p.dict
			}
			if p.context {
				if f.ctx == nil {
					f.ctx = make([]bool, len(m.spec))
				}
				f.ctx[p.index] = true
			}
			continue
		}
		if f.parts == nil {
			f.parts, f.counts = make([][][]float32, len(m.spec)), make([][][]float32, len(m.spec))
		}
		dst := &f.parts
		if p.count {
			dst = &f.counts
		}
		if (*dst)[p.index] == nil {
			(*dst)[p.index] = make([][]float32, shards)
		}
		(*dst)[p.index][shard] = p.data
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
	err = combineParts(m, f)
	var missing []string
	for i, in := range f.inputs {
		if in == nil {
			missing = append(missing, m.spec[i].Name)
		}
	}
	var scores []float32
	if err != nil {
		s.metrics.reject(m.name, "invalid")
	} else if len(missing) > 0 {
		err = status.Errorf(codes.InvalidArgument, "model %q: fan-out %q: no shard sent tensors %s", m.name, key, strings.Join(missing, ", "))
		s.metrics.reject(m.name, "invalid")
	} else {
		var outs [][]float32
		outs, err = m.batcher.Submit(ctx, Request{N: n, Inputs: f.inputs, Context: f.ctx, Index: f.index})
		if err != nil {
			err = s.submitError(m, err)
		} else {
			scores, err = m.scores(outs, n)
		}
	}
	a.mu.Lock()
	a.finish(f, scores, err)
	a.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return &prismv1.ScoreResponse{Scores: scores, DenseUs: time.Since(start).Microseconds(), Tasks: m.wireTasks(), TaskNames: m.taskNames}, nil
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
			err := status.Errorf(code, "model %q: fan-out %q: shard(s) %v of %d did not send their part in time", m.name, f.key, f.missing(), f.shards)
			if f.count == f.shards {
				// Every part came: the frame was being scored.
				err = status.Errorf(code, "model %q: fan-out %q: all %d parts came, but the deadline passed while the frame was queued or scored", m.name, f.key, f.shards)
			}
			a.finish(f, nil, err)
			s.metrics.reject(m.name, "deadline")
		}
		a.mu.Unlock()
	}
	if f.err != nil {
		return nil, f.err
	}
	return &prismv1.ScoreResponse{Scores: f.scores, DenseUs: time.Since(start).Microseconds(), Tasks: m.wireTasks(), TaskNames: m.taskNames}, nil
}

// combineParts combines the parts of every output f received in parts
// into its cut tensor; every shard of the output must have sent its part
// (and its counts where the combine takes them).
func combineParts(m *model, f *fanout) error {
	if f.parts == nil {
		return nil
	}
	for i, got := range f.parts {
		if got == nil && f.counts[i] == nil {
			continue
		}
		name := m.spec[i].Name
		ps := m.assembly.partials[name]
		parts := make([][]float32, 0, len(ps.shards))
		var counts [][]float32
		var lacking []int
		for _, sh := range ps.shards {
			var p, c []float32
			if sh < len(got) {
				p = got[sh]
			}
			if f.counts[i] != nil && sh < len(f.counts[i]) {
				c = f.counts[i][sh]
			}
			if p == nil || ps.counts != (c != nil) {
				lacking = append(lacking, sh)
				continue
			}
			parts = append(parts, p)
			if ps.counts {
				counts = append(counts, c)
			}
		}
		if len(lacking) > 0 {
			return status.Errorf(codes.InvalidArgument, "model %q: fan-out %q: output %q (combine %s) comes in parts from shards %v; shard(s) %v sent none or an incomplete one", m.name, f.key, name, ps.combine, ps.shards, lacking)
		}
		out := make([]float32, f.n*m.spec[i].Width)
		combinePartial(ps.combine, out, parts, counts, f.n, m.spec[i].Width)
		f.inputs[i], f.from[i] = out, ps.shards[0]
	}
	return nil
}

func (s *Server) invalid(m *model, format string, args ...any) error {
	s.metrics.reject(m.name, "invalid")
	return status.Errorf(codes.InvalidArgument, format, args...)
}

// decodePart checks one part's frame: cut tensors of the plan, each
// once, of the plan's width, n samples.
func decodePart(m *model, tensors []byte, n int) ([]partTensor, error) {
	// As decode: samples and columns checked before any expansion. A
	// cut tensor comes whole or in parts (a part and its counts: the
	// slots after the cut's).
	seen := make([]bool, 3*len(m.spec))
	cols := 0
	want := arrowframe.Want{Rows: n, Column: func(name string, width int) error {
		cols++
		output, count, ok := arrowframe.ParsePartial(name)
		if !ok {
			i, ok := m.index[name]
			if !ok {
				return status.Errorf(codes.InvalidArgument, "model %q: tensor %q is not a cut tensor of the plan (want %s)", m.name, name, m.cutNames())
			}
			return m.checkColumn(seen, i, name, width, m.spec[i].Width)
		}
		ps := m.assembly.partials[output]
		switch {
		case ps == nil:
			return status.Errorf(codes.InvalidArgument, "model %q: tensor %q: %q is not an output the plan's sharding sends in parts", m.name, name, output)
		case count && !ps.counts:
			return status.Errorf(codes.InvalidArgument, "model %q: tensor %q: output %q combines by %s, without counts", m.name, name, output, ps.combine)
		case count && width != 1:
			return status.Errorf(codes.InvalidArgument, "model %q: tensor %q has width %d; counts have width 1", m.name, name, width)
		case count:
			if seen[2*len(m.spec)+ps.index] {
				return status.Errorf(codes.InvalidArgument, "model %q: tensor %q appears twice", m.name, name)
			}
			seen[2*len(m.spec)+ps.index] = true
			return nil
		}
		return m.checkColumn(seen[len(m.spec):], ps.index, name, width, m.spec[ps.index].Width)
	}}
	// Dictionary columns come back unexpanded (DecodeIndexedWant): a
	// whole column's rows and indices go to the batcher, which gathers
	// them into the batch it writes anyway.
	got, ts, err := arrowframe.DecodeIndexedWant(tensors, want)
	if rows := (*arrowframe.RowsError)(nil); errors.As(err, &rows) && cols == 0 {
		// A frame without columns has nothing to expand, whatever its
		// rows: a part sending no tensors is judged with the others.
		got, ts, err = arrowframe.Decode(tensors)
	}
	if err != nil {
		return nil, m.decodeError(err, n)
	}
	if got != n && len(ts) > 0 {
		return nil, status.Errorf(codes.InvalidArgument, "model %q: tensors hold %d samples, num_samples says %d", m.name, got, n)
	}
	out := make([]partTensor, 0, len(ts))
	for _, t := range ts {
		if output, count, ok := arrowframe.ParsePartial(t.Name); ok {
			ps := m.assembly.partials[output]
			switch {
			case ps == nil:
				return nil, status.Errorf(codes.InvalidArgument, "model %q: tensor %q: %q is not an output the plan's sharding sends in parts", m.name, t.Name, output)
			case count && !ps.counts:
				return nil, status.Errorf(codes.InvalidArgument, "model %q: tensor %q: output %q combines by %s, without counts", m.name, t.Name, output, ps.combine)
			case slices.ContainsFunc(out, func(p partTensor) bool { return p.index == ps.index && (!p.partial || p.count == count) }):
				return nil, status.Errorf(codes.InvalidArgument, "model %q: tensor %q appears twice", m.name, t.Name)
			case count && t.Width != 1:
				return nil, status.Errorf(codes.InvalidArgument, "model %q: tensor %q has width %d; counts have width 1", m.name, t.Name, t.Width)
			case !count && t.Width != m.spec[ps.index].Width:
				return nil, status.Errorf(codes.InvalidArgument, "model %q: tensor %q has width %d; the plan says %d (shape %v)", m.name, t.Name, t.Width, m.spec[ps.index].Width, m.spec[ps.index].Shape)
			}
			data := t.Data
			if t.Context || t.Index != nil {
				// The combine reads every sample's part: expanded here
				// (the embedding tier sends partial columns expanded).
				data = make([]float32, n*t.Width)
				t.Expand(data, n)
			}
			out = append(out, partTensor{index: ps.index, data: data, partial: true, count: count})
			continue
		}
		i, ok := m.index[t.Name]
		switch {
		case !ok:
			return nil, status.Errorf(codes.InvalidArgument, "model %q: tensor %q is not a cut tensor of the plan (want %s)", m.name, t.Name, m.cutNames())
		case slices.ContainsFunc(out, func(p partTensor) bool { return p.index == i }):
			return nil, status.Errorf(codes.InvalidArgument, "model %q: tensor %q appears twice", m.name, t.Name)
		case t.Width != m.spec[i].Width:
			return nil, status.Errorf(codes.InvalidArgument, "model %q: tensor %q has width %d; the plan says %d (shape %v)", m.name, t.Name, t.Width, m.spec[i].Width, m.spec[i].Shape)
		}
		out = append(out, partTensor{index: i, data: t.Data, context: t.Context, dict: t.Index})
	}
	return out, nil
}

// String describes a fan-out for logs.
func (f *fanout) String() string {
	return fmt.Sprintf("fan-out %q (%d of %d parts, %d samples)", f.key, f.count, f.shards, f.n)
}
