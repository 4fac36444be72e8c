package main

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/models"
)

// TestNonFiniteFeatures sends dlrm-tiny requests with a dense feature
// that is NaN or infinite, in the candidates, in the context and on the
// RecommendStream, through prism up's real processes. The whole model
// scores such a candidate NaN; the stack answered that NaN under OK, a
// score the client could not tell from a real one's failure. Each is
// InvalidArgument naming the input and the candidate; the stack then
// still scores as the monolith does.
func TestNonFiniteFeatures(t *testing.T) {
	t.Parallel()
	rec, mono, cfg := tinyUp(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	batch := func() *models.Batch {
		src, _ := models.NewSynthetic(cfg.Signature(), models.SyntheticOptions{Seed: 3})
		b, _ := src.Next(5)
		return b
	}
	nan, inf := float32(math.NaN()), float32(math.Inf(1))
	for _, tc := range []struct {
		name    string
		context map[string]bool
		at      int // value of the dense input made non-finite
		v       float32
		want    string
	}{
		{"candidate NaN", nil, 2*13 + 4, nan, `candidate 2 scored NaN: candidate input "dense": values[30] is NaN`},
		{"candidate +Inf", nil, 4*13 + 12, inf, `candidate 4 scored NaN: candidate input "dense": values[64] is +Inf`},
		{"candidate -Inf", nil, 0, -inf, `candidate 0 scored NaN: candidate input "dense": values[0] is -Inf`},
		{"context NaN", map[string]bool{models.DenseInput: true}, 7, nan, `context input "dense": values[7] is NaN`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := toRequest(cfg.Name, batch(), tc.context)
			ins := req.GetCandidates().GetInputs()
			if tc.context != nil {
				ins = req.GetContext().GetInputs()
			}
			for _, in := range ins {
				if in.GetName() == models.DenseInput {
					in.Values[tc.at] = tc.v
				}
			}
			resp, err := rec.Recommend(ctx, req)
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), tc.want) {
				t.Fatalf("Recommend: scores %v, err %v; want InvalidArgument saying %q", resp.GetScores(), err, tc.want)
			}
			stream, err := rec.RecommendStream(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if err := stream.Send(req); err != nil {
				t.Fatal(err)
			}
			stream.CloseSend()
			sresp, err := stream.Recv()
			if err != nil {
				t.Fatal(err)
			}
			if e := sresp.GetError(); codes.Code(e.GetCode()) != codes.InvalidArgument || !strings.Contains(e.GetMessage(), tc.want) || len(sresp.GetScores()) != 0 {
				t.Fatalf("RecommendStream: scores %v, error %v; want InvalidArgument saying %q", sresp.GetScores(), e, tc.want)
			}
		})
	}
	matchMonolith(t, ctx, rec, mono, cfg, batch(), nil, "after the non-finite features")
}
