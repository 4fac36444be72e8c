package loadgen

import (
	"testing"

	"github.com/prism-serve/prism/models"
)

// TestPoolCycles: a pool of N requests repeats every N sends with fresh
// request ids, and matches what the stream would have drawn.
func TestPoolCycles(t *testing.T) {
	p, _ := models.Lookup("dlrm-tiny")
	sig := p.Config.Signature()
	mk := func(pool int) *Requests {
		q, err := NewRequests(RequestOptions{Model: "m", Sig: sig, Candidates: Fixed(5), Seed: 3, Pool: pool})
		if err != nil {
			t.Fatal(err)
		}
		if err := q.Prepare(); err != nil {
			t.Fatal(err)
		}
		return q
	}
	pooled, plain := mk(3), mk(0)
	var first []int64
	ids := map[string]bool{}
	for i := range 7 {
		a, _ := pooled.Next()
		b, _ := plain.Next()
		if ids[a.RequestId] {
			t.Fatalf("request id %q repeated", a.RequestId)
		}
		ids[a.RequestId] = true
		got := a.Candidates.Inputs[1].Ids
		if i < 3 && got[0] != b.Candidates.Inputs[1].Ids[0] {
			t.Fatalf("pooled request %d differs from the stream's", i)
		}
		if i == 0 {
			first = got
		}
		if i == 3 && &got[0] != &first[0] {
			t.Fatal("the pool did not cycle after 3 requests")
		}
	}
}
