package server_test

import (
	"context"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/models"
)

// tileContext is req with its context moved into the candidates, each
// context input repeated for every sample: what the request means. A
// context input the candidates also send is dropped (theirs win).
func tileContext(req *prismv1.LookupRequest) *prismv1.LookupRequest {
	out := proto.Clone(req).(*prismv1.LookupRequest)
	out.Context = nil
	if out.Candidates == nil {
		out.Candidates = &prismv1.Features{}
	}
	n := int(req.GetNumSamples())
	for _, in := range req.GetContext().GetInputs() {
		if slices.ContainsFunc(req.GetCandidates().GetInputs(), func(c *prismv1.Input) bool { return c.GetName() == in.GetName() }) {
			continue
		}
		x := &prismv1.Input{Name: in.GetName()}
		for range n {
			x.Ids = append(x.Ids, in.GetIds()...)
			x.Values = append(x.Values, in.GetValues()...)
			x.Weights = append(x.Weights, in.GetWeights()...)
		}
		out.Candidates.Inputs = append(out.Candidates.Inputs, x)
	}
	return out
}

// FuzzLookupContext sends Lookups with context features (issue 18's
// context-once path: the context's lookups run once, a cut tensor
// computed from the context alone crosses as one row) built from
// arbitrary bytes to the fixture's embedding tier, every model of which
// (pooled and unpooled lookups, cpu.onnx, pre-lookup ops, pre.onnx, a
// fixed batch, int32 ids) the dense double scores with its dense.onnx:
// a documented status or n scores, never a panic; a request taken
// scores the same with dictionary frames (Options.DictionaryFrames); and
// one taken with its context scores as the same request with the
// context in every candidate.
func FuzzLookupContext(f *testing.F) {
	fx := setup(f)
	for i, name := range slices.Sorted(func(yield func(string) bool) {
		for name := range fx.sigs {
			if !yield(name) {
				return
			}
		}
	}) {
		sig := fx.sigs[name]
		src, err := models.NewSynthetic(sig, models.SyntheticOptions{Seed: uint64(i + 1), Uniform: true})
		if err != nil {
			f.Fatal(err)
		}
		n := 3
		if fb := fixedBatchOf(fx, name); fb > 0 {
			n = fb
		}
		b, err := src.Next(n)
		if err != nil {
			f.Fatal(err)
		}
		var names []string
		for _, in := range sig.Inputs {
			names = append(names, in.Name)
		}
		// The first input, every other one, all of them in the context;
		// the context and the candidates both sending one (theirs win);
		// a context of two samples' worth.
		for _, ctx := range [][]string{names[:1], everyOther(names), names} {
			req := fx.request(name, b, ctx...)
			if p, err := proto.Marshal(req); err == nil {
				f.Add(p)
			}
		}
		both := fx.request(name, b)
		both.Context = proto.Clone(fx.request(name, b, names[0]).Context).(*prismv1.Features)
		two := fx.request(name, b, names[0])
		in := two.Context.Inputs[0]
		in.Ids, in.Values = append(in.Ids, in.Ids...), append(in.Values, in.Values...)
		for _, r := range []*prismv1.LookupRequest{both, two} {
			p, err := proto.Marshal(r)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(p)
		}
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var req prismv1.LookupRequest
		if proto.Unmarshal(b, &req) != nil {
			t.Skip()
		}
		req.DenseAddr = fx.addr
		req.FanoutKey, req.Shard, req.Shards = "", 0, 0
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		resp, err := fx.srv.Lookup(ctx, &req)
		if c := status.Code(err); !documented(c) {
			t.Fatalf("status %v: %v", c, err)
		}
		if err != nil {
			return
		}
		if len(resp.GetScores()) != int(req.GetNumSamples()) {
			t.Fatalf("%d scores for %d samples", len(resp.GetScores()), req.GetNumSamples())
		}
		// The same request, its frame's repeated rows dictionary-encoded.
		dict, err := fx.dictClient.Lookup(ctx, &req)
		if err != nil {
			t.Fatalf("taken with plain frames, refused with dictionary frames: %v", err)
		}
		if err := sameScores(dict.GetScores(), resp.GetScores()); err != nil {
			t.Fatalf("dictionary frames, against plain ones: %v", err)
		}
		if len(req.GetContext().GetInputs()) == 0 {
			return
		}
		tiled, err := fx.srv.Lookup(ctx, tileContext(&req))
		if err != nil {
			t.Fatalf("the request took its context, the same features in every candidate were refused: %v", err)
		}
		if err := sameScores(resp.GetScores(), tiled.GetScores()); err != nil {
			t.Fatalf("with the context, against it in every candidate: %v", err)
		}
	})
}

// sameScores compares got with want within float32 rounding (NaN
// matches NaN).
func sameScores(got, want []float32) error {
	if len(got) != len(want) {
		return fmt.Errorf("%d scores, want %d", len(got), len(want))
	}
	for i, w := range want {
		g := got[i]
		if g == w || math.IsNaN(float64(g)) && math.IsNaN(float64(w)) {
			continue
		}
		if d := math.Abs(float64(g - w)); !(d <= 1e-5*(1+math.Abs(float64(w)))) {
			return fmt.Errorf("sample %d: %v, want %v", i, g, w)
		}
	}
	return nil
}

func everyOther(names []string) []string {
	var out []string
	for i := 0; i < len(names); i += 2 {
		out = append(out, names[i])
	}
	return out
}

// fixedBatchOf is the fixed batch the fixture's model was exported with
// (0: none).
func fixedBatchOf(fx *fixture, model string) int {
	return int(fx.srv.WorkerInfo("", "").GetFixedBatch()[model])
}
