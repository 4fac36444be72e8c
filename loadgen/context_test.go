package loadgen

import (
	"slices"
	"testing"

	"github.com/prism-serve/prism/api/prismv1"
)

// TestRequestsExpandContext: with ExpandContext the stream is the one
// Context gives, the context inputs sent per candidate, each candidate
// repeating the request's context values.
func TestRequestsExpandContext(t *testing.T) {
	sig := tinySig(t)
	ctxNames := []string{"dense", "cat_0", "cat_2"}
	o := RequestOptions{Model: "m", Sig: sig, Context: ctxNames, Candidates: Uniform{3, 9}, Seed: 4}
	withCtx, err := NewRequests(o)
	if err != nil {
		t.Fatal(err)
	}
	o.ExpandContext = true
	expanded, err := NewRequests(o)
	if err != nil {
		t.Fatal(err)
	}
	byName := func(f *prismv1.Features) map[string]*prismv1.Input {
		m := map[string]*prismv1.Input{}
		for _, in := range f.GetInputs() {
			m[in.Name] = in
		}
		return m
	}
	for range 10 {
		a, err := withCtx.Next()
		if err != nil {
			t.Fatal(err)
		}
		b, err := expanded.Next()
		if err != nil {
			t.Fatal(err)
		}
		n := int(a.NumCandidates)
		if b.NumCandidates != a.NumCandidates || b.Context != nil || len(b.Candidates.Inputs) != len(sig.Inputs) {
			t.Fatalf("expanded: %d candidates (want %d), context %v, %d candidate inputs", b.NumCandidates, n, b.Context, len(b.Candidates.Inputs))
		}
		ac, aCand, bCand := byName(a.Context), byName(a.Candidates), byName(b.Candidates)
		for _, in := range sig.Inputs {
			got := bCand[in.Name]
			if c := ac[in.Name]; c != nil {
				for k := range n {
					if w := len(c.Values); w > 0 && !slices.Equal(got.Values[k*w:(k+1)*w], c.Values) {
						t.Fatalf("%s: candidate %d does not repeat the context", in.Name, k)
					}
					if w := len(c.Ids); w > 0 && !slices.Equal(got.Ids[k*w:(k+1)*w], c.Ids) {
						t.Fatalf("%s: candidate %d does not repeat the context", in.Name, k)
					}
				}
				continue
			}
			if !slices.Equal(got.Values, aCand[in.Name].Values) || !slices.Equal(got.Ids, aCand[in.Name].Ids) {
				t.Fatalf("%s: the candidates differ from the context stream's", in.Name)
			}
		}
	}
}
