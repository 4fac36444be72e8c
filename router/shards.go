package router

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
)

// Sharded models (plan.json sharding, issue 16). An embedding worker
// whose store holds one shard of a model announces it
// (WorkerInfo.shards). A micro-batch of such a model goes to one live
// replica of every shard, least outstanding first as any pick, each
// sent the same ids and the same dense worker under one fan-out key;
// each sends the dense worker its part and the dense worker scores the
// assembled frame once (gpuserve/assemble.go). The scores come from the
// answer of shard 0's worker; the others must have succeeded. A shard
// without a live replica fails the micro-batch at once with Unavailable
// naming it: never a partial score.

// maxShards bounds the shard count a worker may announce (plan.MaxShards).
const maxShards = 1 << 12

// fanoutNonce makes this router's fan-out keys its own: several routers
// share the dense workers.
var fanoutNonce = rand.Uint64()

// fanoutSeq numbers this router's fan-outs.
var fanoutSeq atomic.Uint64

// fanoutKey names micro-batch mb of a request, one attempt of it: a
// retry is a new fan-out.
// It keeps at most the first 64 bytes of the request id, cut at a
// character's start (a proto string is UTF-8): a key stays well inside
// the dense worker's bound (gpuserve maxFanoutKey, 256 bytes) whatever
// the id's characters.
func fanoutKey(requestID string, mb int) string {
	if len(requestID) > maxKeyID {
		cut := maxKeyID
		for cut > 0 && !utf8.RuneStart(requestID[cut]) {
			cut--
		}
		requestID = requestID[:cut]
	}
	return fmt.Sprintf("%s/%d/%x.%d", requestID, mb, fanoutNonce, fanoutSeq.Add(1))
}

// maxKeyID is the most bytes of a request id a fan-out key keeps.
const maxKeyID = 64

// ShardMissingError says which shards of a model have no live worker.
type ShardMissingError struct {
	Model   string
	Shards  int
	Missing []int
	// Lagging counts the workers of the missing shards left out for
	// lacking acknowledged updates.
	Lagging int
}

func (e *ShardMissingError) Error() string {
	s := fmt.Sprintf("model %q: shard(s) %v of %d have no live embedding worker", e.Model, e.Missing, e.Shards)
	if e.Lagging > 0 {
		s += fmt.Sprintf(" (%d lack acknowledged embedding updates)", e.Lagging)
	}
	return s
}

// PickShards chooses for every shard 0..shards-1 of model the healthy,
// eligible embedding worker holding it with the least outstanding work
// (preferring those not in avoid), and charges each n samples; release
// undoes the charges. A shard without one is a *ShardMissingError.
//
// The workers of one fan-out hold one sharding: replicas of two
// shardings with the same shard count (a reshard rolling out, before
// the model's first update binds its layout) would have the dense
// worker combine one layout's rows with another's, wrong scores with
// no error. While the live workers announce more than one sharding,
// each is tried (with the workers that name none, of earlier releases)
// and the one that has every shard at the least load is taken.
func (r *Registry) PickShards(model string, shards int, n int64, avoid []string) ([]*prismv1.WorkerInfo, func(), error) {
	return r.pickShards(model, shards, n, avoid, nil, EmbeddingWant{})
}

// pickShards is PickShards for a retry: avoid holds every worker of the
// request's failed attempts, dead those of them whose attempt failed as
// if they were unreachable (retry.dead). A shard's replica in avoid is
// taken only when the shard has none outside it, and one in dead only
// when it has none outside dead: a retry under overload goes back to
// the replica that refused (ResourceExhausted) rather than to the one
// that is down. want narrows the workers as it does PickEmbedding's: a
// worker of another content than the one pinned, or of a content no
// healthy dense worker serves, holds no shard for the fan-out (a
// retrained model rolling out tier by tier has its new plan's shard
// workers complete, and idle, before a dense worker scores for them).
// A fan-out missing shards for content alone fails as contentMissing
// says.
func (r *Registry) pickShards(model string, shards int, n int64, avoid, dead []string, want EmbeddingWant) ([]*prismv1.WorkerInfo, func(), error) {
	if shards < 1 || shards > maxShards {
		return nil, nil, fmt.Errorf("model %q: %d shards", model, shards)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	var set []*worker
	if s := r.byModel[roleModel{prismv1.Role_ROLE_EMBEDDING, model}]; s != nil {
		set = s.ws
	}
	best := make([]*worker, shards)
	loads := make([]int64, shards)
	avoided := make([]int, shards) // best[i]'s avoidRank
	lagging := make([]int, shards)
	// The content filters, as best applies them: only while some
	// worker would fail them. unpaired counts a shard's workers they
	// left out.
	keep := r.embeddingFilter(model, want)
	unpaired := make([]int, shards)
	// pick fills best with each shard's choice among the workers of
	// sharding fp and tables content (ShardRef.content) and those that
	// name none ("": any), and returns how many shards it left without a
	// worker; with g zero it says whether the workers named more than
	// one sharding, or more than one content (a version rolling out
	// shard by shard: a fan-out mixing them would pool one version's
	// rows with another's), or more than one model content
	// (WorkerInfo.content: a model retrained in its ONNX parts only
	// keeps its tables' content, and a dense worker of one refuses the
	// other's parts).
	type group struct{ fp, content, model string }
	pick := func(g group) (missing int, mixed bool) {
		fp := g.fp
		clear(best)
		var first, firstContent, firstModel string
		for _, e := range set {
			ref := e.info.GetShards()[model]
			if ref == nil || int(ref.GetShards()) != shards || ref.GetShard() < 0 || int(ref.GetShard()) >= shards || !e.info.GetHealthy() {
				continue
			}
			i := int(ref.GetShard())
			c := e.info.GetContent()[model]
			if !keep.keeps(c, e.info.GetVersion()[model]) {
				if fp == "" {
					unpaired[i]++
				}
				continue
			}
			if r.eligible != nil && !r.eligible(e.info, model) {
				if fp == "" {
					lagging[i]++
				}
				continue
			}
			if wfp := ref.GetSharding(); wfp != "" {
				switch {
				case fp != "" && wfp != fp:
					continue
				case first == "":
					first = wfp
				case wfp != first:
					mixed = true
				}
			}
			if wc := ref.GetContent(); wc != "" {
				switch {
				case g.content != "" && wc != g.content:
					continue
				case firstContent == "":
					firstContent = wc
				case wc != firstContent:
					mixed = true
				}
			}
			if c != "" {
				switch {
				case g.model != "" && c != g.model:
					continue
				case firstModel == "":
					firstModel = c
				case c != firstModel:
					mixed = true
				}
			}
			av := avoidRank(e.info.GetId(), avoid, dead)
			if e.unreachable {
				// Unreachable by this router (Registry.Unreachable): last,
				// taken only while its shard has no other.
				av = 3
			}
			load := e.info.GetOutstanding() + e.inflight
			switch {
			case best[i] == nil,
				av < avoided[i],
				av == avoided[i] && (load < loads[i] || (load == loads[i] && e.info.GetAddr() < best[i].info.GetAddr())):
				best[i], loads[i], avoided[i] = e, load, av
			}
		}
		for _, e := range best {
			if e == nil {
				missing++
			}
		}
		return missing, mixed
	}
	missing, mixed := pick(group{})
	if mixed {
		// Workers of several shardings (rare: a reshard rolling out):
		// the complete one; then, if its parts are row-wise, one with a
		// live dense worker of its own (a dense worker of another
		// refuses them), not avoided by a retry; then the one with the
		// fewest workers to avoid, then at the least load, then the least
		// fingerprint so that picks do not flap; or, for the error, the
		// one missing the fewest shards.
		var groups []group
		for _, e := range set {
			ref := e.info.GetShards()[model]
			if g := (group{ref.GetSharding(), ref.GetContent(), e.info.GetContent()[model]}); int(ref.GetShards()) == shards && g != (group{}) && !slices.Contains(groups, g) {
				groups = append(groups, g)
			}
		}
		slices.SortFunc(groups, func(a, b group) int {
			if c := strings.Compare(a.fp, b.fp); c != 0 {
				return c
			}
			if c := strings.Compare(a.content, b.content); c != 0 {
				return c
			}
			return strings.Compare(a.model, b.model)
		})
		type rank struct {
			missing int
			// For row-wise parts, which only a dense worker of the
			// sharding (or naming none) takes: none is live; none the
			// sender was told of yet (refused until its next heartbeat,
			// retried); each told one a retry's avoided one.
			noDense, denseUntold, denseAvoided bool
			// A retry's failed workers: those that seemed down, and
			// all.
			dead, avoided int
			load          int64
		}
		less := func(a, b rank) bool {
			switch {
			case a.missing != b.missing:
				return a.missing < b.missing
			case a.noDense != b.noDense:
				return !a.noDense
			case a.denseUntold != b.denseUntold:
				return !a.denseUntold
			case a.denseAvoided != b.denseAvoided:
				return !a.denseAvoided
			case a.dead != b.dead:
				return a.dead < b.dead
			case a.avoided != b.avoided:
				return a.avoided < b.avoided
			}
			return a.load < b.load
		}
		var chosen group
		var chosenRank rank
		for k, g := range groups {
			fp := g.fp
			miss, _ := pick(g)
			rk := rank{missing: miss}
			rows := false
			for i, e := range best {
				if e != nil {
					rk.load += loads[i]
					if avoided[i] > 0 {
						rk.avoided++
					}
					if avoided[i] > 1 {
						rk.dead++
					}
					rows = rows || rowWiseRef(e.info.GetShards()[model])
				}
			}
			if rows {
				// Told as shard 0's worker, the fan-out's sender
				// (microBatchSharded).
				var told uint64
				if best[0] != nil {
					told = best[0].told
				}
				// Of its content too, as the fan-out's dense pick is
				// (contentOf, Router.pickDense).
				var content string
				for _, e := range best {
					if e != nil && content == "" {
						content = e.info.GetContent()[model]
					}
				}
				has, hasTold, toldUnavoided := r.hasDense(model, fp, content, avoid, told)
				rk.noDense, rk.denseUntold, rk.denseAvoided = !has, has && !hasTold, hasTold && !toldUnavoided
			}
			if k == 0 || less(rk, chosenRank) {
				chosen, chosenRank = g, rk
			}
		}
		missing, _ = pick(chosen)
	}
	if missing > 0 {
		miss := &ShardMissingError{Model: model, Shards: shards}
		byContent := true
		for i, e := range best {
			if e == nil {
				miss.Missing = append(miss.Missing, i)
				miss.Lagging += lagging[i]
				byContent = byContent && unpaired[i] > 0
			}
		}
		if byContent {
			if err := r.contentMissing(prismv1.Role_ROLE_EMBEDDING, model, nil, pickWant{embedding: want}); err != nil {
				return nil, nil, err
			}
		}
		return nil, nil, miss
	}
	out := make([]*prismv1.WorkerInfo, shards)
	for i, e := range best {
		e.inflight += n
		out[i] = e.info
	}
	var once sync.Once
	return out, func() {
		once.Do(func() {
			r.mu.Lock()
			for _, e := range best {
				e.inflight -= n
			}
			r.mu.Unlock()
		})
	}, nil
}

// embeddingLayouts lists the layouts of model's healthy, eligible
// embedding workers: the shard counts they announce (ascending), whether
// some hold the whole model; and the ids of every worker announcing a
// shard of it (a pick of the whole model's workers leaves them out).
func (r *Registry) embeddingLayouts(model string) (counts []int, whole bool, sharded []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	var set []*worker
	if s := r.byModel[roleModel{prismv1.Role_ROLE_EMBEDDING, model}]; s != nil {
		set = s.ws
	}
	for _, e := range set {
		ref := e.info.GetShards()[model]
		if ref != nil {
			sharded = append(sharded, e.info.GetId())
		}
		if !e.info.GetHealthy() || (r.eligible != nil && !r.eligible(e.info, model)) {
			continue
		}
		if ref == nil {
			whole = true
			continue
		}
		if k := int(ref.GetShards()); k >= 1 && k <= maxShards && !slices.Contains(counts, k) {
			counts = append(counts, k)
		}
	}
	slices.Sort(counts)
	return counts, whole, sharded
}

// shardsComplete says whether every shard of model's sharding into
// shards has a live, eligible embedding worker (of one sharding) that
// want keeps.
func (r *Registry) shardsComplete(model string, shards int, want EmbeddingWant) bool {
	_, release, err := r.pickShards(model, shards, 0, nil, nil, want)
	if err != nil {
		return false
	}
	release()
	return true
}

// avoidRank orders a retry's choice among a shard's replicas: 0 for
// one no attempt failed on, 1 for one in avoid, 2 for one in dead
// (pickShards ranks a replica marked unreachable 3).
func avoidRank(id string, avoid, dead []string) int {
	switch {
	case slices.Contains(dead, id):
		return 2
	case slices.Contains(avoid, id):
		return 1
	}
	return 0
}

// microBatchSharded is microBatch for a model sharded into shards:
// one fan-out to a replica of every shard, retried on others up to
// shardAttempts times in all: a fan-out touches a worker of every shard,
// so one attempt can blame a sibling cancelled by the failing one and
// the next still meet the dead replica (seen as 3 of 1,030 requests
// failing with one retry when a replica was killed under load).
const shardAttempts = 3

func (r *Router) microBatchSharded(ctx context.Context, req *prismv1.RecommendRequest, cands *prismv1.Features, n, mb, shards int) ([]float32, answer, error) {
	model := req.GetModel()
	// As microBatch's pick: shard workers a dense worker scores for, of
	// the content pinned if one is.
	want := EmbeddingWant{Content: req.GetContent(), Version: numberPin(req), Paired: true}
	var tried retry
	var last error
	for attempt := range shardAttempts {
		cns, releaseCN, err := r.Reg.pickShards(model, shards, int64(n), tried.avoid, tried.dead, want)
		if err != nil {
			// A shard of this shard count has no live worker; another
			// layout of the model may be complete (otherLayout).
			switch k, whole := r.otherLayout(model, shards, want); {
			case whole:
				return nil, answer{}, errWholeLayout
			case k != shards:
				shards = k
				cns, releaseCN, err = r.Reg.pickShards(model, shards, int64(n), tried.avoid, tried.dead, want)
			}
		}
		if err != nil {
			r.m.microBatches.WithLabelValues("shard_missing").Inc()
			if _, ok := status.FromError(err); ok {
				return nil, answer{}, untoldRetry(firstErr(last, err)) // a status of its own (NotFound: a content pinned that none serves)
			}
			return nil, answer{}, untoldRetry(firstErr(last, status.Errorf(codes.Unavailable, "%v; retry", err)))
		}
		hn, releaseHN, err := r.pickDense(model, n, tried, cns[0].GetId(), shardingOf(cns, model), rowWise(cns, model), contentOf(cns, model))
		if err != nil {
			releaseCN()
			return nil, answer{}, untoldRetry(r.failedMicroBatch(firstErr(last, err)))
		}
		if attempt > 0 {
			r.m.retries.Inc() // counted once it goes: a retry finding no worker is none
		}
		called := time.Now()
		resps, failed, err := r.fanOut(ctx, req, cands, n, shards, cns, hn.GetAddr(), fanoutKey(req.GetRequestId(), mb))
		releaseCN()
		releaseHN()
		if err == nil {
			now := time.Now()
			r.m.microBatches.WithLabelValues("ok").Inc()
			r.preds.get(req.GetModel()).answered(now, int64(n))
			r.observe(lastPart(resps), now.Sub(called))
			return resps[0].GetScores(), answer{version: resps[0].GetVersion(), content: resps[0].GetContent(), tasks: resps[0].GetTasks(), taskNames: namesOf(resps[0].GetTaskNames())}, nil
		}
		last = err
		if !retryable(ctx, err) || attempt == shardAttempts-1 {
			break
		}
		// Every attempt's failed workers stay avoided, not only the
		// last's: the third attempt went back to a dead replica
		// avoided by the first when the second met an overloaded one.
		tried.failed(ctx, err, failed, hn.GetId())
		r.floods.Warn(model+" "+failed+" "+hn.GetAddr(), "sharded micro-batch failed; retrying where replicas are live", "model", model, "embedding", failed, "dense", hn.GetAddr(), "err", err)
	}
	return nil, answer{}, untoldRetry(r.failedMicroBatch(last))
}

// lastPart is the stages of a sharded micro-batch's critical path: the
// shard whose part reached the dense worker last. Every shard's answer
// times its own lookup, encoding and transfer, and its dense stage runs
// from its part's arrival to the scores, so a part that came early
// counts its wait for the others as dense time: shard 0's times (taken
// before) showed a starved sibling shard as a slow dense tier. The last
// part's dense stage is the frame's assembly and scoring alone, and the
// stages before it are the slowest shard's (nearly: a shard may start
// later and still arrive last). Nil when no answer has times.
func lastPart(resps []*prismv1.LookupResponse) *prismv1.StageTimes {
	var last *prismv1.StageTimes
	for _, resp := range resps {
		if t := resp.GetTimes(); t != nil && (last == nil || t.GetDenseUs() < last.GetDenseUs()) {
			last = t
		}
	}
	return last
}

// errWholeLayout says a micro-batch picked for a shard count that lacks
// a shard goes to the model's workers of the whole model (otherLayout).
var errWholeLayout = errors.New("router: a sharding missing a shard; the whole model's workers serve the micro-batch")

// otherLayout is the layout a micro-batch of model takes when shards,
// the shard count of the least loaded embedding worker, has a shard
// without a live worker. While a model's workers move to another layout
// (served whole, then sharded; or sharded again into another shard
// count) the new layout's first workers are idle, so the least loaded:
// the micro-batch goes to a complete layout instead, the workers of the
// whole model (whole), else another shard count with a live worker for
// every shard (k). With none, k is shards (the fan-out fails fast,
// naming the shards missing).
func (r *Router) otherLayout(model string, shards int, want EmbeddingWant) (k int, whole bool) {
	counts, whole, _ := r.Reg.embeddingLayouts(model)
	if whole {
		return 0, true
	}
	for _, c := range counts {
		if c != shards && r.Reg.shardsComplete(model, c, want) {
			return c, false
		}
	}
	return shards, false
}

// pickWhole is pick among model's embedding workers that hold the whole
// model (otherLayout said they are live).
func (r *Router) pickWhole(model string, n int, tried retry, want pickWant) (*prismv1.WorkerInfo, func(), error) {
	_, _, sharded := r.Reg.embeddingLayouts(model)
	err := fmt.Errorf("no embedding worker holds the whole model %q", model)
	for _, ex := range tried.tiers() {
		w, release, perr := r.Reg.pickFor(prismv1.Role_ROLE_EMBEDDING, model, int64(n), append(slices.Clone(ex), sharded...), "", want)
		if perr != nil {
			err = perr
			continue
		}
		if w.GetShards()[model] != nil {
			// It announced a shard since embeddingLayouts.
			release()
			continue
		}
		return w, release, nil
	}
	return nil, nil, status.Error(codes.Unavailable, err.Error())
}

// shardingOf is the sharding the fan-out's workers hold ("": none of
// them names one; PickShards takes them of one sharding).
func shardingOf(cns []*prismv1.WorkerInfo, model string) string {
	for _, cn := range cns {
		if fp := cn.GetShards()[model].GetSharding(); fp != "" {
			return fp
		}
	}
	return ""
}

// rowWise says whether a fan-out's parts may hold row-wise tables'
// partial pools: a worker announces their row splits, or (of an earlier
// release) may not announce them.
func rowWise(cns []*prismv1.WorkerInfo, model string) bool {
	for _, cn := range cns {
		if rowWiseRef(cn.GetShards()[model]) {
			return true
		}
	}
	return false
}

// rowWiseRef is rowWise of one worker's shard.
func rowWiseRef(ref *prismv1.ShardRef) bool {
	return len(ref.GetRowSplits()) > 0 || !ref.GetRowSplitsComplete()
}

// fanOut sends one Lookup to each shard's worker at once. The first
// failure cancels the others (their parts would wait at the dense
// worker for one that never comes); it is returned with the id of the
// worker that failed.
func (r *Router) fanOut(ctx context.Context, req *prismv1.RecommendRequest, cands *prismv1.Features, n, shards int, cns []*prismv1.WorkerInfo, dense, key string) ([]*prismv1.LookupResponse, string, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	resps := make([]*prismv1.LookupResponse, shards)
	errs := make([]error, shards)
	var wg sync.WaitGroup
	for i, cn := range cns {
		wg.Go(func() {
			// Each shard gets only the inputs it reads (ShardRef.inputs).
			need := cn.GetShards()[req.GetModel()].GetInputs()
			lr := lookupRequest(req, onlyInputs(cands, need), n, dense)
			lr.Context = onlyInputs(req.GetContext(), need)
			lr.FanoutKey, lr.Shard, lr.Shards = key, int32(i), int32(shards)
			resps[i], errs[i] = r.call(ctx, cn.GetId(), cn.GetAddr(), lr)
			if errs[i] != nil {
				cancel()
			}
		})
	}
	wg.Wait()
	// The cause is the first failure that is not the cancellation of a
	// sibling.
	first := -1
	for i, err := range errs {
		if err != nil && (first < 0 || status.Code(errs[first]) == codes.Canceled) {
			first = i
		}
	}
	if first >= 0 {
		return nil, cns[first].GetId(), errs[first]
	}
	for i, resp := range resps {
		// Every shard passes on the one dense answer: k values a sample
		// for a model of k tasks.
		if k := max(int(resp.GetTasks()), 1); len(resp.GetScores()) != n*k || k != max(int(resps[0].GetTasks()), 1) {
			return nil, cns[i].GetId(), status.Errorf(codes.Internal, "embedding worker %s (shard %d of %d) answered %d scores for %d samples of %d tasks", cns[i].GetAddr(), i, shards, len(resp.GetScores()), n, k)
		}
	}
	return resps, "", nil
}

// onlyInputs is f with only the inputs named in need (f itself when
// need is empty: the worker reads every input). A shard of a model
// sharded table-wise reads a third of the ids; sending it the rest
// cost it their decoding and everyone the bytes (BENCHMARKS.md).
func onlyInputs(f *prismv1.Features, need []string) *prismv1.Features {
	if len(need) == 0 || f == nil {
		return f
	}
	out := &prismv1.Features{Inputs: make([]*prismv1.Input, 0, len(need))}
	for _, in := range f.GetInputs() {
		if slices.Contains(need, in.GetName()) {
			out.Inputs = append(out.Inputs, in)
		}
	}
	return out
}

// contentOf is the content of the model a fan-out's shard workers
// serve (WorkerInfo.content): "" when none announces it.
func contentOf(cns []*prismv1.WorkerInfo, model string) string {
	for _, cn := range cns {
		if c := cn.GetContent()[model]; c != "" {
			return c
		}
	}
	return ""
}
