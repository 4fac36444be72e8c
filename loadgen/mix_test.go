package loadgen

import (
	"bytes"
	"context"
	"encoding/csv"
	"math"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/models"
)

func TestParseMix(t *testing.T) {
	for _, tc := range []struct {
		args   []string
		names  []string
		shares []float64
		err    string
	}{
		{args: []string{"a"}, names: []string{"a"}, shares: []float64{1}},
		{args: []string{"a=3"}, names: []string{"a"}, shares: []float64{1}},
		{args: []string{"a=0.7,b=0.3"}, names: []string{"a", "b"}, shares: []float64{0.7, 0.3}},
		{args: []string{"a=7", "b=3"}, names: []string{"a", "b"}, shares: []float64{0.7, 0.3}},
		{args: []string{" ctr = 1 , cvr=3"}, names: []string{"ctr", "cvr"}, shares: []float64{0.25, 0.75}},
		{args: []string{"a", "b"}, names: []string{"a", "b"}, shares: []float64{0.5, 0.5}},
		{args: []string{"a,b,c"}, names: []string{"a", "b", "c"}, shares: []float64{1. / 3, 1. / 3, 1. / 3}},
		{args: []string{"a=1e-3,b=1e-3"}, names: []string{"a", "b"}, shares: []float64{0.5, 0.5}},
		{args: []string{"a=0,b=1"}, err: `model a's weight "0": want a positive number`},
		{args: []string{"a=-1,b=1"}, err: `model a's weight "-1": want a positive number`},
		{args: []string{"a=NaN,b=1"}, err: `model a's weight "NaN": want a positive number`},
		{args: []string{"a=Inf,b=1"}, err: `model a's weight "Inf": want a positive number`},
		{args: []string{"a=x"}, err: `model a's weight "x": want a positive number`},
		{args: []string{"a="}, err: `model a's weight "": want a positive number`},
		{args: []string{"a=0"}, err: `model a's weight "0": want a positive number`},
		{args: []string{"a=0.7,a=0.3"}, err: "model a is given twice"},
		{args: []string{"a=7", "a=3"}, err: "model a is given twice"},
		{args: []string{"a", "a"}, err: "model a is given twice"},
		{args: []string{"a,,b"}, err: "an empty model name"},
		{args: []string{"=3,b=1"}, err: "an empty model name"},
		{args: []string{""}, err: "an empty model name"},
		{args: []string{"a=1,"}, err: "an empty model name"},
		{args: []string{"a=0.7,b"}, err: "give every model of the mix a weight (NAME=WEIGHT) or none"},
		{args: nil, err: "--model is required"},
	} {
		m, err := ParseMix(tc.args)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("%q: %v, want an error containing %q", tc.args, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%q: %v", tc.args, err)
			continue
		}
		if !reflect.DeepEqual(m.Names(), tc.names) {
			t.Errorf("%q: models %q, want %q", tc.args, m.Names(), tc.names)
		}
		for i, s := range m.Shares() {
			if math.Abs(s-tc.shares[i]) > 1e-12 {
				t.Errorf("%q: shares %v, want %v", tc.args, m.Shares(), tc.shares)
				break
			}
		}
	}
}

// TestChooser: over many draws each model gets its share (within five
// standard deviations of the binomial count), the same seed draws the
// same models in the same order, and another seed another order.
func TestChooser(t *testing.T) {
	const n = 200000
	for _, shares := range [][]float64{{0.7, 0.3}, {0.5, 0.5}, {0.01, 0.99}, {0.2, 0.3, 0.5}, {1}} {
		draw := func(seed uint64) ([]int, []int) {
			c := NewChooser(shares, seed)
			counts := make([]int, len(shares))
			seq := make([]int, 64)
			for i := range n {
				k := c.Next()
				counts[k]++
				if i < len(seq) {
					seq[i] = k
				}
			}
			return counts, seq
		}
		counts, seq := draw(42)
		for i, p := range shares {
			sd := math.Sqrt(n * p * (1 - p))
			if math.Abs(float64(counts[i])-n*p) > 5*sd+1 {
				t.Errorf("shares %v: model %d drawn %d of %d times, want %.0f ± %.0f", shares, i, counts[i], n, n*p, 5*sd)
			}
		}
		again, seqAgain := draw(42)
		if !reflect.DeepEqual(counts, again) || !reflect.DeepEqual(seq, seqAgain) {
			t.Errorf("shares %v: seed 42 drew %v then %v", shares, counts, again)
		}
		if _, other := draw(43); len(shares) > 1 && reflect.DeepEqual(seq, other) {
			t.Errorf("shares %v: seeds 42 and 43 drew the same first %d models", shares, len(seq))
		}
	}
}

// mixSig is a second small model's inputs: dcnv2-tiny's.
func mixSig(t testing.TB) models.Signature {
	p, err := models.Lookup("dcnv2-tiny")
	if err != nil {
		t.Fatal(err)
	}
	c, err := p.Resolve(models.ScaleOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return c.Signature()
}

// TestMixedRequests: each model's requests in a mix are the requests a
// stream of that model alone builds, in order (ids aside, which carry
// the model's name and stay unique); pooled ones too.
func TestMixedRequests(t *testing.T) {
	for _, pool := range []int{0, 5} {
		opts := func(model string, sig models.Signature) RequestOptions {
			return RequestOptions{Model: model, Sig: sig, Candidates: Uniform{1, 9}, Seed: 3, Stream: 11, Pool: pool, Context: []string{"dense"}}
		}
		mixed, err := NewMixedRequests([]MixedModel{{opts("a", tinySig(t)), 0.25}, {opts("b", mixSig(t)), 0.75}}, 9)
		if err != nil {
			t.Fatal(err)
		}
		if err := mixed.Prepare(); err != nil {
			t.Fatal(err)
		}
		if got := mixed.Models(); !reflect.DeepEqual(got, []ModelShare{{"a", 0.25}, {"b", 0.75}}) {
			t.Fatalf("models %v", got)
		}
		alone := map[string]*Requests{}
		for _, m := range []struct {
			name string
			sig  models.Signature
		}{{"a", tinySig(t)}, {"b", mixSig(t)}} {
			if alone[m.name], err = NewRequests(opts(m.name, m.sig)); err != nil {
				t.Fatal(err)
			}
		}
		ids := map[string]bool{}
		count := map[string]int{}
		for range 400 {
			i, req, _, err := mixed.nextModel()
			if err != nil {
				t.Fatal(err)
			}
			if want := []string{"a", "b"}[i]; req.Model != want {
				t.Fatalf("request of model index %d names model %q", i, req.Model)
			}
			count[req.Model]++
			if ids[req.RequestId] || !strings.HasPrefix(req.RequestId, "lg-"+req.Model+"-") {
				t.Fatalf("request id %q: a repeat, or not of model %s", req.RequestId, req.Model)
			}
			ids[req.RequestId] = true
			want, err := alone[req.Model].Next()
			if err != nil {
				t.Fatal(err)
			}
			got := proto.Clone(req).(*prismv1.RecommendRequest)
			got.RequestId, want.RequestId = "", ""
			if !proto.Equal(got, want) {
				t.Fatalf("pool %d: request %d of model %s differs from the model's own stream's", pool, count[req.Model], req.Model)
			}
		}
		if count["a"] < 60 || count["a"] > 140 {
			t.Fatalf("pool %d: %v of 400 requests, want about 100 of model a", pool, count)
		}
	}
	if _, err := NewMixedRequests([]MixedModel{{RequestOptions{Model: "a", Sig: tinySig(t), Context: []string{"nope"}}, 0.5}, {RequestOptions{Model: "b", Sig: mixSig(t)}, 0.5}}, 1); err == nil || !strings.Contains(err.Error(), "model a: ") {
		t.Fatalf("a context input one model lacks: %v, want an error naming the model", err)
	}
}

// TestRunMix: a run over two models against the in-process fake reports
// each model apart, and each model's counts add up to the totals: the
// requests, the OK answers, the errors by code, and per second in the
// CSV. Model b's every 4th request outlives its deadline, so b alone
// has errors (DeadlineExceeded) and a p99 at the timeout.
func TestRunMix(t *testing.T) {
	var mu sync.Mutex
	seen := map[string]int{}
	f := &Fake{Delay: func(req *prismv1.RecommendRequest) time.Duration {
		mu.Lock()
		seen[req.Model]++
		mu.Unlock()
		if req.Model == "b" {
			if n, _ := strconv.Atoi(strings.TrimPrefix(req.RequestId, "lg-b-")); n%4 == 0 {
				return time.Second
			}
		}
		return 0
	}}
	s := serveBufconn(t, grpc.NewServer(), f)
	reqs, err := NewMixedRequests([]MixedModel{
		{RequestOptions{Model: "a", Sig: tinySig(t), Candidates: Fixed(3), Seed: 1}, 0.6},
		{RequestOptions{Model: "b", Sig: mixSig(t), Candidates: Fixed(5), Seed: 1}, 0.4},
	}, 7)
	if err != nil {
		t.Fatal(err)
	}
	sum, err := Run(context.Background(), Options{Profile: Constant(200), Poisson: true, Seed: 5, Duration: 1500 * time.Millisecond, MaxRequests: 1e6, Timeout: 100 * time.Millisecond, SLO: 50 * time.Millisecond, TraceRatio: 1}, reqs, s)
	if err != nil {
		t.Fatal(err)
	}
	if len(sum.Models) != 2 || sum.Models[0].Model != "a" || sum.Models[1].Model != "b" || sum.Models[0].Share != 0.6 {
		t.Fatalf("models %+v", sum.Models)
	}
	a, b := sum.Models[0], sum.Models[1]
	if a.Sent+b.Sent != sum.Sent || a.OK+b.OK != sum.OK || a.Errors+b.Errors != sum.Errors {
		t.Fatalf("sent %d+%d of %d, ok %d+%d of %d, errors %d+%d of %d: the models do not add up to the totals", a.Sent, b.Sent, sum.Sent, a.OK, b.OK, sum.OK, a.Errors, b.Errors, sum.Errors)
	}
	mu.Lock()
	// Every request answered OK reached the server as its model's; one
	// that timed out may not have (its deadline passed on the way).
	for _, m := range sum.Models {
		if n := int64(seen[m.Model]); n < m.OK || n > m.Sent {
			t.Fatalf("the server saw %d requests of model %s, the report %d sent, %d OK", n, m.Model, m.Sent, m.OK)
		}
	}
	mu.Unlock()
	if sum.Sent < 200 || a.Sent < b.Sent {
		t.Fatalf("sent a %d b %d of %d: want about 300 at 60/40", a.Sent, b.Sent, sum.Sent)
	}
	if a.Errors != 0 || b.ErrorsByCode["DeadlineExceeded"] != b.Errors || b.Errors < b.Sent/8 || sum.ErrorsByCode["DeadlineExceeded"] != b.Errors {
		t.Fatalf("errors: a %v, b %v of %d, totals %v; want b's every 4th DeadlineExceeded", a.ErrorsByCode, b.ErrorsByCode, b.Sent, sum.ErrorsByCode)
	}
	if a.MeanCand != 3 || b.MeanCand != 5 || a.P99 > 50 || b.P99 < 100 || a.SLOAttained < 0.9 || b.SLOAttained > 0.85 {
		t.Fatalf("a: %v candidates, p99 %vms, SLO %v; b: %v candidates, p99 %vms, SLO %v", a.MeanCand, a.P99, a.SLOAttained, b.MeanCand, b.P99, b.SLOAttained)
	}
	if math.Abs(a.SamplesPS+b.SamplesPS-sum.SamplesPS) > 1e-6 {
		t.Fatalf("samples/s %v + %v, totals %v", a.SamplesPS, b.SamplesPS, sum.SamplesPS)
	}
	// The slowest traced requests name their model: b's, timed out.
	if sum.Traced == nil || len(sum.Traced.Slowest) == 0 || sum.Traced.Slowest[0].Model != "b" || sum.Traced.Slowest[0].Code != "DeadlineExceeded" {
		t.Fatalf("traced: %+v, want the slowest of model b", sum.Traced)
	}
	var text bytes.Buffer
	sum.WriteText(&text)
	for _, want := range []string{"model       a  share 60.0%  sent ", "model       b  share 40.0%  sent ", "errors by DeadlineExceeded ", "ms  DeadlineExceeded  b\n"} {
		if !strings.Contains(text.String(), want) {
			t.Fatalf("report lacks %q:\n%s", want, text.String())
		}
	}
	var csvb bytes.Buffer
	if err := sum.WriteCSV(&csvb); err != nil {
		t.Fatal(err)
	}
	rows, err := csv.NewReader(&csvb).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"second", "offered_rps", "completed_rps", "ok", "errors", "samples", "p99_ms", "a_ok", "a_errors", "a_p99_ms", "b_ok", "b_errors", "b_p99_ms"}; !reflect.DeepEqual(rows[0], want) {
		t.Fatalf("CSV header %q, want %q", rows[0], want)
	}
	for _, r := range rows[1:] {
		n := func(i int) int { v, _ := strconv.Atoi(r[i]); return v }
		if n(3) != n(7)+n(10) || n(4) != n(8)+n(11) {
			t.Fatalf("second %s: ok %d = %d + %d, errors %d = %d + %d: the models do not add up", r[0], n(3), n(7), n(10), n(4), n(8), n(11))
		}
	}
}

// TestJudgeMix: a mixed trial passes only when every model passes on
// its own requests, and names the model that failed it: a model whose
// p99 is over the SLO although the totals' is not, and one whose
// failures are within the totals' error budget but not its own.
func TestJudgeMix(t *testing.T) {
	o := FindMaxOptions{SLO: 60 * time.Millisecond, MaxErrors: 0.01, MinAchieved: 0.95}
	model := func(name string, sent, errs int64, p99, rps float64) ModelSummary {
		return ModelSummary{Model: name, Sent: sent, OK: sent - errs, Errors: errs, P99: p99, RPS: rps, OfferedRPS: 100}
	}
	for _, tc := range []struct {
		name      string
		models    []ModelSummary
		pass      bool
		why, bind string
	}{
		{"all within", []ModelSummary{model("a", 990, 0, 10, 99), model("b", 10, 0, 50, 100)}, true, "", ""},
		{"small model slow", []ModelSummary{model("a", 990, 0, 10, 99), model("b", 10, 0, 80, 100)}, false, "p99 over the SLO 60ms: b 80.00ms", "b"},
		{"both slow, the worst named", []ModelSummary{model("a", 500, 0, 90, 99), model("b", 500, 0, 70, 100)}, false, "p99 over the SLO 60ms: a 90.00ms, b 70.00ms", "a"},
		{"small model failing", []ModelSummary{model("a", 990, 0, 10, 99), model("b", 10, 5, 5, 100)}, false, "model b: 5 of 10 requests failed", "b"},
		{"small model behind", []ModelSummary{model("a", 990, 0, 10, 99), model("b", 10, 0, 10, 50)}, false, "model b: answered 50.0 req/s of 100.0 offered", "b"},
	} {
		s := &Summary{Sent: 1000, OK: 1000, RPS: 100, OfferedRPS: 100, P99: 12, Models: tc.models}
		for _, m := range tc.models {
			s.Errors += m.Errors
		}
		s.OK = s.Sent - s.Errors
		pass, why, bound := o.judge(100, s)
		if pass != tc.pass || why != tc.why || bound != tc.bind {
			t.Errorf("%s: pass %v why %q bound %q; want %v %q %q", tc.name, pass, why, bound, tc.pass, tc.why, tc.bind)
		}
	}
	// One model: judged on the totals, as before.
	if pass, why := o.Judge(100, &Summary{Sent: 100, OK: 100, RPS: 100, OfferedRPS: 100, P99: 80}); pass || why != "p99 80.00ms over the SLO 60ms" {
		t.Errorf("one model: %v %q", pass, why)
	}
}

// TestFindMaxMixBound: the search over a mix stops at the rate its
// slower model holds and names it, though the totals' p99 (most
// requests the fast model's) would pass well above it.
func TestFindMaxMixBound(t *testing.T) {
	const slowShare, slowCapacity = 0.2, 100.0 // model b: 100 req/s of its own, 500 in total
	trial := func(_ context.Context, rate float64) (*Summary, error) {
		a := ModelSummary{Model: "a", Sent: 800, OK: 800, P99: 5, RPS: 0.8 * rate, OfferedRPS: 0.8 * rate}
		b := ModelSummary{Model: "b", Sent: 200, OK: 200, P99: 5, RPS: slowShare * rate, OfferedRPS: slowShare * rate}
		if slowShare*rate > slowCapacity {
			b.P99 = 900
		}
		return &Summary{Sent: 1000, OK: 1000, RPS: rate, OfferedRPS: rate, P99: 5, Models: []ModelSummary{a, b}}, nil
	}
	res, err := FindMax(context.Background(), FindMaxOptions{Start: 100, SLO: 60 * time.Millisecond, Tolerance: 0.02, MaxTrials: 30}, trial, nil)
	if err != nil {
		t.Fatal(err)
	}
	if limit := slowCapacity / slowShare; res.MaxRate > limit || res.MaxRate < 0.98*limit || res.BoundBy != "b" {
		t.Fatalf("max rate %.1f bound by %q, want within 2%% under %v bound by b", res.MaxRate, res.BoundBy, limit)
	}
	for _, tr := range res.Trials {
		if !tr.Pass && tr.Bound != "b" {
			t.Fatalf("trial at %.1f failed (%s) bound by %q, want b", tr.Rate, tr.Why, tr.Bound)
		}
	}
}
