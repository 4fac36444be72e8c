package router

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/prism-serve/prism/api/prismv1"
)

// streamFuzzJagged is the jagged layout of the stream fixture's model
// "j": input -> its offsets input.
var streamFuzzJagged = map[string]string{"indices": "offsets", "weights": "offsets"}

// featureCN is an embedding worker double whose score of a sample is a
// function of that sample's features alone, by input name: a candidate
// input's slice of the sample (its bag for a jagged input of model "j"),
// a context input's whole values for every sample, the candidates'
// input winning over the context's of the same name (as the embedding
// tier decodes them). So a request scores the same whichever way the
// router cuts it into micro-batches or fans it out, and with a context
// input as with that input repeated in every candidate. What it is sent
// that a router must never send (a candidate input that does not split
// over the micro-batch, a part of a sharded fan-out without its fields,
// a shard sent inputs it does not read) is kept in bad.
type featureCN struct {
	prismv1.UnimplementedEmbeddingTierServer
	// shard, of 2, when it serves a shard of the sharded models ("s",
	// "sj" with jagged inputs, "sf" of a fixed batch); reads, by model,
	// the inputs that shard reads (none: all).
	shard int
	reads map[string][]string
	mu    sync.Mutex
	bad   []string
}

func (f *featureCN) violation(format string, args ...any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.bad = append(f.bad, fmt.Sprintf(format, args...))
}

func (f *featureCN) violations() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := f.bad
	f.bad = nil
	return out
}

// sharded: the fixture's models whose embedding workers hold shards.
func sharded(model string) bool { return model == "s" || model == "sj" || model == "sf" }

// featureWeight is the score's coefficient for an input's name.
func featureWeight(name string) float64 {
	h := fnv.New32a()
	h.Write([]byte(name))
	return 1 + float64(h.Sum32()%97)/97
}

// featureScore is one sample's term for an input: its ids, values and
// weights, each position weighted (a feature that is not a finite
// number makes a score that is not either, as a model's would).
func featureScore(ids []int64, values, weights []float32) float64 {
	var acc float64
	for k, id := range ids {
		acc += float64(id%1000) * float64(k+1)
	}
	for k, v := range values {
		acc += float64(v) * float64(k+2)
	}
	for k, w := range weights {
		acc += float64(w) * float64(k+3)
	}
	return acc
}

func (f *featureCN) Lookup(_ context.Context, req *prismv1.LookupRequest) (*prismv1.LookupResponse, error) {
	n := int(req.GetNumSamples())
	if n <= 0 {
		f.violation("num_samples %d", n)
		return nil, status.Errorf(codes.InvalidArgument, "num_samples %d", n)
	}
	if sharded(req.GetModel()) {
		// A dense worker takes keys of 1 to 256 bytes (gpuserve/assemble.go).
		if req.GetShards() != 2 || int(req.GetShard()) != f.shard || req.GetFanoutKey() == "" || len(req.GetFanoutKey()) > 256 {
			f.violation("model %q: a part of shard %d of %d, key %q, sent to shard %d", req.GetModel(), req.GetShard(), req.GetShards(), req.GetFanoutKey(), f.shard)
		}
		for _, side := range []*prismv1.Features{req.GetCandidates(), req.GetContext()} {
			for _, in := range side.GetInputs() {
				if need := f.reads[req.GetModel()]; need != nil && !slices.Contains(need, in.GetName()) {
					f.violation("shard %d sent input %q it does not read", f.shard, in.GetName())
				}
			}
		}
		if f.shard != 0 {
			// The one dense answer every shard passes on: shard 0's
			// reads every input, so it alone scores.
			return &prismv1.LookupResponse{Scores: make([]float32, n)}, nil
		}
	} else if req.GetShards() != 0 || req.GetFanoutKey() != "" {
		f.violation("model %q served whole: a lookup of shard %d of %d", req.GetModel(), req.GetShard(), req.GetShards())
	}
	type feature struct {
		ids     []int64
		values  []float32
		weights []float32
	}
	perSample := make([]map[string]feature, n)
	for s := range perSample {
		perSample[s] = map[string]feature{}
	}
	jagged := req.GetModel() == "j" || req.GetModel() == "sj"
	var offsets []int64
	for _, in := range req.GetCandidates().GetInputs() {
		if jagged && in.GetName() == "offsets" {
			offsets = in.GetIds()
		}
	}
	if jagged && offsets != nil {
		// n offsets, rebased to 0 (router/jagged.go), or n+1.
		if len(offsets) == n {
			offsets = append(slices.Clip(offsets), math.MaxInt64)
		}
		if len(offsets) != n+1 || offsets[0] != 0 {
			return nil, status.Errorf(codes.InvalidArgument, "offsets: %d for %d samples, first %v", len(offsets), n, offsets[:min(1, len(offsets))])
		}
	}
	seen := map[string]bool{}
	for _, in := range req.GetCandidates().GetInputs() {
		name := in.GetName()
		if seen[name] {
			return nil, status.Errorf(codes.InvalidArgument, "input %q given twice", name)
		}
		seen[name] = true
		if _, ok := streamFuzzJagged[name]; ok && jagged {
			if offsets == nil {
				return nil, status.Errorf(codes.InvalidArgument, "jagged input %q without its offsets", name)
			}
			vals := max(len(in.GetIds()), len(in.GetValues()))
			for s := range n {
				lo, hi := offsets[s], min(offsets[s+1], int64(vals))
				if lo > hi || hi > int64(vals) {
					return nil, status.Errorf(codes.InvalidArgument, "input %q: bag %d [%d, %d) of %d values", name, s, lo, hi, vals)
				}
				var x feature
				if in.GetIds() != nil {
					x.ids = in.GetIds()[lo:hi]
				}
				if in.GetValues() != nil {
					x.values = in.GetValues()[lo:hi]
				}
				perSample[s][name] = x
			}
			continue
		}
		if jagged && name == "offsets" {
			continue
		}
		if len(in.GetIds())%n != 0 || len(in.GetValues())%n != 0 || len(in.GetWeights())%n != 0 {
			f.violation("candidate input %q: %d ids, %d values, %d weights for %d samples", name, len(in.GetIds()), len(in.GetValues()), len(in.GetWeights()), n)
			return nil, status.Errorf(codes.InvalidArgument, "input %q does not split", name)
		}
		wi, wv, ww := len(in.GetIds())/n, len(in.GetValues())/n, len(in.GetWeights())/n
		for s := range n {
			perSample[s][name] = feature{in.GetIds()[s*wi : (s+1)*wi], in.GetValues()[s*wv : (s+1)*wv], in.GetWeights()[s*ww : (s+1)*ww]}
		}
	}
	ctxSeen := map[string]bool{}
	for _, in := range req.GetContext().GetInputs() {
		name := in.GetName()
		if ctxSeen[name] {
			return nil, status.Errorf(codes.InvalidArgument, "context input %q given twice", name)
		}
		ctxSeen[name] = true
		if _, ok := streamFuzzJagged[name]; jagged && (ok || name == "offsets") {
			return nil, status.Errorf(codes.InvalidArgument, "context input %q is jagged", name)
		}
		if seen[name] {
			continue // the candidates' win
		}
		for s := range n {
			perSample[s][name] = feature{in.GetIds(), in.GetValues(), in.GetWeights()}
		}
	}
	scores := make([]float32, n)
	for s, m := range perSample {
		names := make([]string, 0, len(m))
		for name := range m {
			names = append(names, name)
		}
		slices.Sort(names)
		var acc float64
		for _, name := range names {
			x := m[name]
			acc += featureWeight(name) * featureScore(x.ids, x.values, x.weights)
		}
		scores[s] = float32(acc)
	}
	return &prismv1.LookupResponse{Scores: scores}, nil
}

// streamFuzz is the stream fixture: routers of several stream windows
// over the same workers, each serving RecommendStream in process.
type streamFuzz struct {
	routers []*Router
	clients []prismv1.RecommenderClient
	cns     []*featureCN
}

func newStreamFuzz(tb testing.TB, windows ...int) *streamFuzz {
	tb.Helper()
	whole := &featureCN{}
	s0, s1 := &featureCN{shard: 0}, &featureCN{shard: 1, reads: map[string][]string{"s": {"cat_1"}, "sf": {"cat_1"}, "sj": {"indices", "offsets"}}}
	fx := &streamFuzz{cns: []*featureCN{whole, s0, s1}}
	addr := func(f *featureCN) string {
		return serveInproc(tb, func(s *grpc.Server) { prismv1.RegisterEmbeddingTierServer(s, f) })
	}
	wa, a0, a1 := addr(whole), addr(s0), addr(s1)
	for _, w := range windows {
		r := testRouter(Options{MicroBatch: 3, MaxCandidates: 64, DefaultTimeout: 2 * time.Second, StreamWindow: w})
		tb.Cleanup(r.Close)
		for _, info := range []*prismv1.WorkerInfo{
			{Id: "e", Role: prismv1.Role_ROLE_EMBEDDING, Addr: wa, Models: []string{"m", "j", "f"}, Healthy: true,
				Jagged:     map[string]*prismv1.JaggedInputs{"j": {Inputs: []string{"indices", "weights"}, Offsets: []string{"offsets", "offsets"}}},
				FixedBatch: map[string]int64{"f": 4}},
			{Id: "s0", Role: prismv1.Role_ROLE_EMBEDDING, Addr: a0, Models: []string{"s", "sj", "sf"}, Healthy: true,
				Shards:     map[string]*prismv1.ShardRef{"s": {Shard: 0, Shards: 2}, "sj": {Shard: 0, Shards: 2}, "sf": {Shard: 0, Shards: 2}},
				Jagged:     map[string]*prismv1.JaggedInputs{"sj": {Inputs: []string{"indices", "weights"}, Offsets: []string{"offsets", "offsets"}}},
				FixedBatch: map[string]int64{"sf": 4}},
			{Id: "s1", Role: prismv1.Role_ROLE_EMBEDDING, Addr: a1, Models: []string{"s", "sj", "sf"}, Healthy: true,
				Shards: map[string]*prismv1.ShardRef{"s": {Shard: 1, Shards: 2, Inputs: s1.reads["s"]}, "sj": {Shard: 1, Shards: 2, Inputs: s1.reads["sj"]},
					"sf": {Shard: 1, Shards: 2, Inputs: s1.reads["sf"]}},
				Jagged:     map[string]*prismv1.JaggedInputs{"sj": {Inputs: []string{"indices", "weights"}, Offsets: []string{"offsets", "offsets"}}},
				FixedBatch: map[string]int64{"sf": 4}},
			{Id: "d", Role: prismv1.Role_ROLE_DENSE, Addr: "dense:a", Models: []string{"m", "j", "f", "s", "sj", "sf"}, Healthy: true},
		} {
			if _, err := r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: info}); err != nil {
				tb.Fatal(err)
			}
		}
		srv := serveInproc(tb, func(s *grpc.Server) { prismv1.RegisterRecommenderServer(s, r) })
		conn, err := grpc.NewClient(srv, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithContextDialer(dialInproc))
		if err != nil {
			tb.Fatal(err)
		}
		tb.Cleanup(func() { conn.Close() })
		fx.routers = append(fx.routers, r)
		fx.clients = append(fx.clients, prismv1.NewRecommenderClient(conn))
	}
	return fx
}

// streamFuzzSeeds are requests of the stream fixture's models, valid
// (the context-once path among them) and malformed.
func streamFuzzSeeds() []*prismv1.RecommendRequest {
	ids := func(v ...int64) []int64 { return v }
	in := func(name string, ids []int64, vals []float32) *prismv1.Input {
		return &prismv1.Input{Name: name, Ids: ids, Values: vals}
	}
	cands := func(n int) *prismv1.Features {
		c0, c1, d := make([]int64, n), make([]int64, n), make([]float32, 2*n)
		for i := range n {
			c0[i], c1[i], d[2*i], d[2*i+1] = int64(i), int64(7*i+1), float32(i)/2, -float32(i)
		}
		return &prismv1.Features{Inputs: []*prismv1.Input{in("cat_0", c0, nil), in("cat_1", c1, nil), in("dense", nil, d)}}
	}
	user := &prismv1.Features{Inputs: []*prismv1.Input{in("user", ids(9, 4), nil), in("age", nil, []float32{0.25})}}
	return []*prismv1.RecommendRequest{
		{Model: "m", NumCandidates: 7, RequestId: "a", Candidates: cands(7)},
		{Model: "m", NumCandidates: 5, RequestId: "ctx", Context: user, Candidates: cands(5)},
		{Model: "s", NumCandidates: 7, RequestId: "sharded", Candidates: cands(7)},
		{Model: "s", NumCandidates: 2, RequestId: strings.Repeat("é", 200), Candidates: cands(2)}, // cut to a key
		{Model: "sf", NumCandidates: 6, RequestId: "sharded-fixed", Context: user, Candidates: cands(6)},
		{Model: "sj", NumCandidates: 4, RequestId: "sharded-jagged", Context: user, Candidates: &prismv1.Features{Inputs: []*prismv1.Input{
			in("offsets", ids(0, 2, 2, 5), nil), in("indices", ids(1, 2, 3, 4, 5, 6), nil), in("weights", nil, []float32{1, 0.5, 1, 2, 1, 1}), in("cat_0", ids(1, 2, 3, 4), nil),
		}}},
		{Model: "s", NumCandidates: 4, RequestId: "sharded-ctx", Context: &prismv1.Features{Inputs: []*prismv1.Input{in("cat_1", ids(3), nil), in("user", ids(1), nil)}},
			Candidates: &prismv1.Features{Inputs: []*prismv1.Input{in("cat_0", ids(1, 2, 3, 4), nil)}}},
		{Model: "f", NumCandidates: 5, RequestId: "fixed", Context: user, Candidates: cands(5)},
		{Model: "j", NumCandidates: 4, RequestId: "jagged", Context: user, Candidates: &prismv1.Features{Inputs: []*prismv1.Input{
			in("offsets", ids(0, 2, 2, 5), nil), in("indices", ids(1, 2, 3, 4, 5, 6), nil), in("weights", nil, []float32{1, 0.5, 1, 2, 1, 1}),
		}}},
		// A context input the candidates also send (theirs win); one sent
		// twice; a jagged input in the context.
		{Model: "m", NumCandidates: 3, RequestId: "shadow", Context: &prismv1.Features{Inputs: []*prismv1.Input{in("cat_0", ids(99), nil)}}, Candidates: cands(3)},
		{Model: "m", NumCandidates: 3, RequestId: "twice", Context: &prismv1.Features{Inputs: []*prismv1.Input{in("user", ids(1), nil), in("user", ids(2), nil)}}, Candidates: cands(3)},
		{Model: "j", NumCandidates: 2, RequestId: "jagged-ctx", Context: &prismv1.Features{Inputs: []*prismv1.Input{in("offsets", ids(0), nil), in("indices", ids(1), nil)}},
			Candidates: &prismv1.Features{Inputs: []*prismv1.Input{in("offsets", ids(0, 1), nil), in("indices", ids(1, 2), nil)}}},
		// A feature that is not a finite number: in the context, in a
		// candidate's jagged bag, in a sharded model's context.
		{Model: "m", NumCandidates: 4, RequestId: "nan-ctx", Context: &prismv1.Features{Inputs: []*prismv1.Input{in("age", nil, []float32{float32(math.NaN())})}}, Candidates: cands(4)},
		{Model: "j", NumCandidates: 3, RequestId: "nan-bag", Candidates: &prismv1.Features{Inputs: []*prismv1.Input{
			in("offsets", ids(0, 1, 3), nil), in("indices", ids(1, 2, 3, 4), nil), in("weights", nil, []float32{1, float32(math.Inf(1)), 1, 1}),
		}}},
		{Model: "s", NumCandidates: 5, RequestId: "nan-sharded", Context: &prismv1.Features{Inputs: []*prismv1.Input{in("cat_1", ids(2), nil), in("age", nil, []float32{float32(math.Inf(-1))})}}, Candidates: cands(5)},
		// Malformed: no model, no candidates, a model not served, an input
		// that does not split, offsets past the values, too many.
		{NumCandidates: 3, Candidates: cands(3)},
		{Model: "m", RequestId: "empty"},
		{Model: "nope", NumCandidates: 1, Candidates: cands(1)},
		{Model: "m", NumCandidates: 4, Candidates: cands(3)},
		{Model: "j", NumCandidates: 2, Candidates: &prismv1.Features{Inputs: []*prismv1.Input{in("offsets", ids(0, 9), nil), in("indices", ids(1, 2), nil)}}},
		{Model: "m", NumCandidates: 65, Candidates: cands(65)},
		{Model: "m", NumCandidates: 2, Version: -1, Candidates: cands(2)},
	}
}

// streamOf is the stream a fuzz input makes: its messages that
// decode (a client's stub cannot send one that does not), reps times
// over.
func streamOf(reps int, msgs ...[]byte) []*prismv1.RecommendRequest {
	var one []*prismv1.RecommendRequest
	for _, b := range msgs {
		req := &prismv1.RecommendRequest{}
		if proto.Unmarshal(b, req) == nil {
			one = append(one, req)
		}
	}
	var out []*prismv1.RecommendRequest
	for range reps {
		for _, req := range one {
			out = append(out, proto.Clone(req).(*prismv1.RecommendRequest))
		}
	}
	return out
}

// tileContextRequest is req with its context moved into the candidates,
// each context input repeated for every candidate (one the candidates
// also send is dropped: theirs win).
func tileContextRequest(req *prismv1.RecommendRequest) *prismv1.RecommendRequest {
	out := proto.Clone(req).(*prismv1.RecommendRequest)
	out.Context = nil
	if out.Candidates == nil {
		out.Candidates = &prismv1.Features{}
	}
	n := int(req.GetNumCandidates())
	rep := func(v []int64) []int64 {
		if v == nil {
			return nil
		}
		o := make([]int64, 0, len(v)*n)
		for range n {
			o = append(o, v...)
		}
		return o
	}
	repf := func(v []float32) []float32 {
		if v == nil {
			return nil
		}
		o := make([]float32, 0, len(v)*n)
		for range n {
			o = append(o, v...)
		}
		return o
	}
	for _, in := range req.GetContext().GetInputs() {
		if slices.ContainsFunc(req.GetCandidates().GetInputs(), func(c *prismv1.Input) bool { return c.GetName() == in.GetName() }) {
			continue
		}
		out.Candidates.Inputs = append(out.Candidates.Inputs, &prismv1.Input{Name: in.GetName(), Ids: rep(in.GetIds()), Values: repf(in.GetValues()), Weights: repf(in.GetWeights())})
	}
	return out
}

// sameScores: bit for bit, NaN matching NaN (the double's sums may
// overflow into one).
func sameScores(a, b []float32) bool {
	return slices.EqualFunc(a, b, func(x, y float32) bool { return x == y || x != x && y != y })
}

// clientCode says whether c is a status a client is told to expect
// (README: Errors); Internal or Unknown means a bug.
func clientCode(c codes.Code) bool {
	switch c {
	case codes.OK, codes.InvalidArgument, codes.NotFound, codes.ResourceExhausted, codes.Unimplemented, codes.Unavailable, codes.FailedPrecondition:
		return true
	}
	return false
}

// loadCode: an answer the router's load may give one request and not
// its twin.
func loadCode(c codes.Code) bool { return c == codes.ResourceExhausted || c == codes.Unavailable }

// FuzzRecommendStream sends a RecommendStream of requests built from
// arbitrary bytes (three messages, repeated up to three times) to routers
// of stream windows 1, 2 and 5 over a whole model ("m"), one with a
// jagged input ("j"), one of a fixed batch ("f") and models sharded in
// two (plain "s", jagged "sj", fixed "sf"), every embedding worker
// scoring a sample from its features alone (featureCN). The stream answers every request, in order, with its request
// id: scores, one a candidate, the same as a unary Recommend's, or the
// documented status Recommend answers; it never hangs or ends in error,
// and every sample it was charged is given back, also when the client
// cancels it midway (stop). A request with a context scores as the same
// request with the context in every candidate.
func FuzzRecommendStream(f *testing.F) {
	windows := []int{1, 2, 5}
	fx := newStreamFuzz(f, windows...)
	var seeds [][]byte
	for _, r := range streamFuzzSeeds() {
		b, err := proto.Marshal(r)
		if err != nil {
			f.Fatal(err)
		}
		seeds = append(seeds, b)
	}
	// Streams of three requests (of every window, once or repeated):
	// valid and malformed ones interleaved.
	for i := range seeds {
		f.Add(uint8(i), uint8(0), seeds[i], seeds[(i+1)%len(seeds)], seeds[(i+5)%len(seeds)])
	}
	// Streams the client gives up on: before any answer, after one.
	f.Add(uint8(4), uint8(1), seeds[0], seeds[1], seeds[2])
	f.Add(uint8(1), uint8(2), seeds[3], seeds[4], seeds[5])
	f.Fuzz(func(t *testing.T, which, stop uint8, a, b, c []byte) {
		// which: the window (low bits) and how many times the three go.
		k := int(which) % len(windows)
		reqs := streamOf(1+int(which/4)%3, a, b, c)
		r, client := fx.routers[k], fx.clients[k]
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		st, err := client.RecommendStream(ctx)
		if err != nil {
			t.Fatal(err)
		}
		sent := make(chan error, 1)
		go func() {
			for _, req := range reqs {
				if err := st.Send(req); err != nil {
					sent <- err
					return
				}
			}
			sent <- st.CloseSend()
		}()
		var got []*prismv1.RecommendResponse
		for {
			if stop > 0 && len(got) == int(stop)-1 {
				// stop > 0: the client cancels the stream after stop-1
				// answers. Its handler ends, and gives back every sample
				// its requests were charged, in a moment.
				cancel()
				<-sent
				for {
					if _, err := st.Recv(); err != nil {
						break
					}
				}
				deadline := time.Now().Add(5 * time.Second)
				for r.streams.Load() != 0 || r.inflight.Load() != 0 || r.inflightBytes.Load() != 0 {
					if time.Now().After(deadline) {
						t.Fatalf("window %d: 5 s after the client cancelled the stream: %d streams open, %d samples and %d bytes still charged", windows[k], r.streams.Load(), r.inflight.Load(), r.inflightBytes.Load())
					}
					time.Sleep(time.Millisecond)
				}
				return
			}
			resp, err := st.Recv()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("window %d: the stream ended after %d of %d answers: %v", windows[k], len(got), len(reqs), err)
			}
			got = append(got, resp)
		}
		if err := <-sent; err != nil {
			t.Fatalf("sending: %v", err)
		}
		if len(got) != len(reqs) {
			t.Fatalf("window %d: %d answers for %d requests", windows[k], len(got), len(reqs))
		}
		for i, req := range reqs {
			resp := got[i]
			if resp.GetRequestId() != req.GetRequestId() || resp.GetModel() != req.GetModel() {
				t.Fatalf("answer %d names request %q of model %q, want %q of %q", i, resp.GetRequestId(), resp.GetModel(), req.GetRequestId(), req.GetModel())
			}
			code := codes.OK
			if e := resp.GetError(); e != nil {
				code = codes.Code(e.GetCode())
				if code == codes.OK || e.GetMessage() == "" {
					t.Fatalf("answer %d: error %v without a code or message", i, e)
				}
			}
			if !clientCode(code) {
				t.Fatalf("answer %d: %v %q (not a status a client is told to expect)", i, code, resp.GetError().GetMessage())
			}
			if code == codes.OK && len(resp.GetScores()) != int(req.GetNumCandidates()) {
				t.Fatalf("answer %d: %d scores for %d candidates", i, len(resp.GetScores()), req.GetNumCandidates())
			}
			// The unary answer to the same request.
			one, err := r.Recommend(ctx, proto.Clone(req).(*prismv1.RecommendRequest))
			uc := status.Code(err)
			switch {
			case uc != code && !loadCode(uc) && !loadCode(code):
				t.Fatalf("request %d: streamed %v %q, unary %v", i, code, resp.GetError().GetMessage(), err)
			case uc == codes.OK && code == codes.OK && !sameScores(one.GetScores(), resp.GetScores()):
				t.Fatalf("request %d: streamed scores %v, unary %v", i, resp.GetScores(), one.GetScores())
			}
			if uc != codes.OK || len(req.GetContext().GetInputs()) == 0 {
				continue
			}
			tiled, err := r.Recommend(ctx, tileContextRequest(req))
			switch c := status.Code(err); {
			case c != codes.OK && !loadCode(c):
				t.Fatalf("request %d took its context; the context in every candidate: %v", i, err)
			case c == codes.OK && !sameScores(tiled.GetScores(), one.GetScores()):
				t.Fatalf("request %d: scores %v with the context, %v with it in every candidate", i, one.GetScores(), tiled.GetScores())
			}
		}
		for _, cn := range fx.cns {
			if bad := cn.violations(); len(bad) > 0 {
				t.Fatalf("the router sent an embedding worker what it must not: %v", bad)
			}
		}
		if n, b := r.inflight.Load(), r.inflightBytes.Load(); n != 0 || b != 0 {
			t.Fatalf("after the stream: %d samples and %d bytes still charged", n, b)
		}
	})
}
