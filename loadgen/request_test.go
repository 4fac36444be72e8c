package loadgen

import (
	"math"
	"math/rand/v2"
	"os"
	"testing"

	"github.com/prism-serve/prism/internal/shareddata/sharedtest"
	"github.com/prism-serve/prism/models"
)

func TestCandidates(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	d := NewDLRMv2()
	const n = 200000
	sum, lo, hi := 0.0, math.MaxInt, 0
	below300 := 0
	for range n {
		k := d.Draw(r)
		sum += float64(k)
		lo, hi = min(lo, k), max(hi, k)
		if k < 300 {
			below300++
		}
	}
	if m := sum / n; math.Abs(m-270) > 2 {
		t.Fatalf("dlrmv2 mean %.1f, want 270", m)
	}
	if lo < 100 || hi > 700 || lo > 110 || hi < 600 {
		t.Fatalf("dlrmv2 range [%d, %d], want within and spanning [100, 700]", lo, hi)
	}
	if f := float64(below300) / n; f < 0.5 {
		t.Fatalf("dlrmv2: %.2f under 300, want skewed to the small end", f)
	}
	for _, c := range []struct {
		in     string
		lo, hi int
		bad    bool
	}{{"270", 270, 270, false}, {"uniform:10-20", 10, 20, false}, {"dlrmv2", 100, 700, false},
		{"0", 0, 0, true}, {"uniform:5-2", 0, 0, true}, {"x", 0, 0, true}} {
		cd, err := ParseCandidates(c.in)
		if (err != nil) != c.bad {
			t.Fatalf("%q: err %v", c.in, err)
		}
		for range 1000 {
			if c.bad {
				break
			}
			if k := cd.Draw(r); k < c.lo || k > c.hi {
				t.Fatalf("%q drew %d", c.in, k)
			}
		}
	}
}

func tinySig(t testing.TB) models.Signature {
	p, err := models.Lookup("dlrm-tiny")
	if err != nil {
		t.Fatal(err)
	}
	c, err := p.Resolve(models.ScaleOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return c.Signature()
}

func TestRequestsLayout(t *testing.T) {
	sig := tinySig(t)
	q, err := NewRequests(RequestOptions{Model: "m", Sig: sig, Context: []string{"dense", "cat_0"}, Candidates: Uniform{5, 9}, Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	for range 20 {
		req, err := q.Next()
		if err != nil {
			t.Fatal(err)
		}
		n := int(req.NumCandidates)
		if n < 5 || n > 9 || len(req.Context.Inputs) != 2 || len(req.Candidates.Inputs) != len(sig.Inputs)-2 {
			t.Fatalf("n %d, %d context and %d candidate inputs", n, len(req.Context.Inputs), len(req.Candidates.Inputs))
		}
		if len(req.Context.Inputs[0].Values) != 13 || len(req.Context.Inputs[1].Ids) != 1 {
			t.Fatalf("context: %d dense values, %d ids", len(req.Context.Inputs[0].Values), len(req.Context.Inputs[1].Ids))
		}
		for _, in := range req.Candidates.Inputs {
			if len(in.Ids) != n {
				t.Fatalf("candidate input %s: %d ids for %d candidates", in.Name, len(in.Ids), n)
			}
		}
	}
	if _, err := NewRequests(RequestOptions{Sig: sig, Context: []string{"nope"}}); err == nil {
		t.Fatal("an unknown context input was accepted")
	}
	// Same seed, same stream.
	a, _ := NewRequests(RequestOptions{Sig: sig, Seed: 9})
	b, _ := NewRequests(RequestOptions{Sig: sig, Seed: 9})
	ra, _ := a.Next()
	rb, _ := b.Next()
	if ra.NumCandidates != rb.NumCandidates || ra.Candidates.Inputs[5].Ids[0] != rb.Candidates.Inputs[5].Ids[0] {
		t.Fatal("same seed gave different requests")
	}
}

func TestRequestsZipfSkew(t *testing.T) {
	sig := models.Signature{Inputs: []models.InputSpec{{Name: "ids", Kind: models.SparseKind, Width: 1, Rows: 100000}}}
	freq := func(s float64) float64 {
		q, err := NewRequests(RequestOptions{Sig: sig, Candidates: Fixed(1000), Seed: 1, ZipfS: s})
		if err != nil {
			t.Fatal(err)
		}
		seen := map[int64]int{}
		for range 50 {
			req, _ := q.Next()
			for _, id := range req.Candidates.Inputs[0].Ids {
				seen[id]++
			}
		}
		top := 0
		for _, c := range seen {
			top = max(top, c)
		}
		return float64(top) / 50000
	}
	// The hottest id's share: about 1/H(n,s); s=1.2 is far more skewed than 0.5.
	if hi, lo := freq(1.2), freq(0.5); hi < 0.1 || lo > 0.01 {
		t.Fatalf("hottest id share %.3f at s=1.2, %.4f at s=0.5", hi, lo)
	}
}

func TestRequestsCriteoReplay(t *testing.T) {
	f, err := os.Open(sharedtest.Path(t, "criteo/criteo_sample.txt"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sig := tinySig(t)
	q, err := NewRequests(RequestOptions{Sig: sig, Candidates: Fixed(150), Criteo: f, CriteoName: "criteo_sample.txt"})
	if err != nil {
		t.Fatal(err)
	}
	// 200 rows, 150 per request: the second request wraps around.
	var first int64
	for i := range 3 {
		req, err := q.Next()
		if err != nil {
			t.Fatal(err)
		}
		for j, in := range req.Candidates.Inputs[1:] {
			for _, id := range in.Ids {
				if id < 0 || id >= sig.Inputs[j+1].Rows {
					t.Fatalf("request %d input %s: id %d outside %d rows", i, in.Name, id, sig.Inputs[j+1].Rows)
				}
			}
		}
		if i == 0 {
			first = req.Candidates.Inputs[1].Ids[0]
		}
		if i == 1 && req.Candidates.Inputs[1].Ids[50] != first {
			t.Fatal("the replay did not wrap to the first row")
		}
	}
}
