package cli

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/loadgen"
)

// TestLoadgenCLIMix: --model a=3 --model b=1 sends one run's requests
// to both models, about 3 to 1, each with its own inputs (and the
// context inputs of each), and reports each model beside the totals,
// in the text and in summary.json, the models adding up to the totals.
func TestLoadgenCLIMix(t *testing.T) {
	var mu sync.Mutex
	seen := map[string]int{}
	inputs := map[string]int{}
	addr, stop, err := loadgen.ServeFake("127.0.0.1:0", &loadgen.Fake{Delay: func(req *prismv1.RecommendRequest) time.Duration {
		mu.Lock()
		defer mu.Unlock()
		seen[req.Model]++
		inputs[req.Model] = len(req.Candidates.Inputs) + 100*len(req.GetContext().GetInputs())
		return 0
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	dir := t.TempDir()
	out, err := runCLI(t, "--target", addr, "--insecure", "--model", "dlrm-tiny=3", "--model", "dcnv2-tiny=1", "--rate", "300",
		"--duration", "1500ms", "--candidates", "4", "--context-inputs", "dense", "--out", dir, "--quiet")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, want := range []string{"models dlrm-tiny 75.0% (27 inputs), dcnv2-tiny 25.0% (27 inputs), 1 inputs in the context",
		"model       dlrm-tiny   share 75.0%  sent ", "model       dcnv2-tiny  share 25.0%  sent "} {
		if !strings.Contains(out, want) {
			t.Fatalf("output lacks %q:\n%s", want, out)
		}
	}
	sum := readSummary(t, dir)
	if len(sum.Models) != 2 {
		t.Fatalf("summary.json models: %+v", sum.Models)
	}
	a, b := sum.Models[0], sum.Models[1]
	if a.Model != "dlrm-tiny" || b.Model != "dcnv2-tiny" || a.Sent+b.Sent != sum.Sent || a.OK+b.OK != sum.OK || sum.OK != sum.Sent || sum.Sent < 300 {
		t.Fatalf("summary: sent %d ok %d; models %+v", sum.Sent, sum.OK, sum.Models)
	}
	if r := float64(a.Sent) / float64(sum.Sent); r < 0.65 || r > 0.85 {
		t.Fatalf("dlrm-tiny sent %d of %d, want about 75%%", a.Sent, sum.Sent)
	}
	mu.Lock()
	if int64(seen["dlrm-tiny"]) != a.Sent || int64(seen["dcnv2-tiny"]) != b.Sent {
		t.Fatalf("the server saw %v; the report %d and %d", seen, a.Sent, b.Sent)
	}
	// 26 sparse inputs per candidate and the dense one in the context.
	if inputs["dlrm-tiny"] != 126 || inputs["dcnv2-tiny"] != 126 {
		t.Fatalf("inputs per request (candidates + 100 x context): %v", inputs)
	}
	mu.Unlock()
	head, err := os.ReadFile(filepath.Join(dir, "timeseries.csv"))
	if err != nil || !strings.HasPrefix(string(head), "second,offered_rps,completed_rps,ok,errors,samples,p99_ms,dlrm-tiny_ok,dlrm-tiny_errors,dlrm-tiny_p99_ms,dcnv2-tiny_ok,") {
		t.Fatalf("timeseries.csv: %v\n%.200s", err, head)
	}

	// Closed loop over the mix: the cap counts every model's requests.
	out, err = runCLI(t, "--target", addr, "--insecure", "--model", "dlrm-tiny,dcnv2-tiny", "--clients", "2", "--max-requests", "60",
		"--duration", "10s", "--candidates", "4", "--quiet")
	if err != nil || !strings.Contains(out, "sent 60  ok 60  errors 0") || !regexp.MustCompile(`dlrm-tiny   share 50.0%  sent \d+`).MatchString(out) {
		t.Fatalf("closed loop over a mix: %v\n%s", err, out)
	}
}

// TestLoadgenCLIMixModelNotServed: a model of the mix that nobody
// serves (every request refused) fails the run, named, though the
// other model's answers make the totals look like a measurement.
func TestLoadgenCLIMixModelNotServed(t *testing.T) {
	addr, stop, err := loadgen.ServeFake("127.0.0.1:0", &loadgen.Fake{Delay: func(req *prismv1.RecommendRequest) time.Duration {
		if req.Model == "dcnv2-tiny" {
			return time.Minute // past every deadline: DeadlineExceeded
		}
		return 0
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	out, err := runCLI(t, "--target", addr, "--insecure", "--model", "dlrm-tiny=1,dcnv2-tiny=1", "--rate", "100", "--duration", "500ms", "--timeout", "100ms", "--candidates", "4", "--quiet")
	if err == nil || !strings.Contains(err.Error(), "model dcnv2-tiny: none of ") || !strings.Contains(err.Error(), "the first DeadlineExceeded") || strings.Contains(err.Error(), "model dlrm-tiny") {
		t.Fatalf("a model whose every request failed: %v\n%s", err, out)
	}
}

// TestLoadgenCLIMixFindMax: --find-max over a mix in which one model's
// server holds 50 requests a second (dcnv2-tiny, 20 ms a request, one
// at a time) and the other many more: the search finds a total rate
// below the slow model's limit at its share (100 req/s at half), names
// it as the bound, and says so in findmax.json. The SLO is wide (100
// ms) so that a busy machine's stalls do not fail the fast model.
func TestLoadgenCLIMixFindMax(t *testing.T) {
	addr, stop, err := loadgen.ServeFake("127.0.0.1:0", &loadgen.Fake{Delay: loadgen.ServiceTimes(map[string]time.Duration{"dcnv2-tiny": 20 * time.Millisecond})})
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	dir := t.TempDir()
	out, err := runCLI(t, "--target", addr, "--insecure", "--model", "dlrm-tiny=1,dcnv2-tiny=1", "--find-max", "--rate", "20",
		"--find-max-trial", "1s", "--find-max-trials", "5", "--find-max-warmup", "500ms", "--candidates", "2", "--slo", "100ms", "--out", dir, "--quiet")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	t.Logf("%s", out)
	m := regexp.MustCompile(`find-max: ([0-9.]+) req/s in total is the highest rate at the mix dlrm-tiny=0.50,dcnv2-tiny=0.50 with every model's p99 under 100ms \(5 trials of 1s\)\nfind-max: bound by model dcnv2-tiny: at [0-9.]+ req/s, p99 over the SLO 100ms: (dlrm-tiny [0-9.]+ms, )?dcnv2-tiny `).FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("want the highest total rate, bound by dcnv2-tiny:\n%s", out)
	}
	// Under dcnv2-tiny's limit, always; not bounded below: on a machine
	// busy enough to stall the first trial (20 req/s) past the SLO the
	// search rightly goes lower (it found 12.7 req/s once in CI's suite).
	if rate, _ := strconv.ParseFloat(m[1], 64); rate <= 0 || rate >= 100 {
		t.Fatalf("found %v req/s in total: want a rate under dcnv2-tiny's limit, 100 at half the requests\n%s", rate, out)
	}
	if !strings.Contains(out, "model       dcnv2-tiny  share 50.0%") {
		t.Fatalf("the best trial's report lacks the models:\n%s", out)
	}
	var res loadgen.FindMaxResult
	b, err := os.ReadFile(filepath.Join(dir, "findmax.json"))
	if err != nil || json.Unmarshal(b, &res) != nil || res.BoundBy != "dcnv2-tiny" || len(res.Trials) != 5 || len(res.Trials[0].Summary.Models) != 2 {
		t.Fatalf("findmax.json: %v: bound by %q, %d trials\n%s", err, res.BoundBy, len(res.Trials), b)
	}
}

// TestLoadgenCLIMixPrintRequest: --print-request over a mix prints the
// mix's requests, each of the model drawn, with that model's inputs
// (hc's from its --plan, dlrm-tiny's from the zoo); the same command
// prints the same ones.
func TestLoadgenCLIMixPrintRequest(t *testing.T) {
	dir, _ := keysPlan(t)
	args := []string{"--model", "hc=1,dlrm-tiny=1", "--plan", dir, "--print-request", "40", "--candidates", "3"}
	out, err := runCLI(t, args...)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	var raw []json.RawMessage
	if err := json.Unmarshal([]byte(out), &raw); err != nil || len(raw) != 40 {
		t.Fatalf("want a JSON array of 40: %v\n%s", err, out)
	}
	count := map[string]int{}
	var order []string
	for i, line := range raw {
		var req prismv1.RecommendRequest
		if err := protojson.Unmarshal(line, &req); err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
		want := map[string]int{"hc": 2, "dlrm-tiny": 27}[req.Model]
		if n := len(req.GetCandidates().GetInputs()); n != want {
			t.Fatalf("request %d of model %q: %d inputs, want %d", i, req.Model, n, want)
		}
		count[req.Model]++
		order = append(order, req.Model)
	}
	if count["hc"] < 8 || count["dlrm-tiny"] < 8 {
		t.Fatalf("models of 40 requests at half each: %v", count)
	}
	again, err := runCLI(t, args...)
	if err != nil {
		t.Fatal(err)
	}
	var raw2 []json.RawMessage
	_ = json.Unmarshal([]byte(again), &raw2)
	for i := range raw {
		var x, y prismv1.RecommendRequest
		_ = protojson.Unmarshal(raw[i], &x)
		_ = protojson.Unmarshal(raw2[i], &y)
		if x.Model != y.Model || x.RequestId != y.RequestId {
			t.Fatalf("request %d: %s %s, then %s %s: the same command drew other models", i, x.Model, x.RequestId, y.Model, y.RequestId)
		}
	}
}

// TestLoadgenCLIMixErrors: a mix's flags that cannot apply, and mixes
// that cannot be read, are refused before anything is sent, saying why.
func TestLoadgenCLIMixErrors(t *testing.T) {
	dir, _ := keysPlan(t)
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--fake", "--model", "dlrm-tiny=0.7,dcnv2-tiny=0"}, `model dcnv2-tiny's weight "0": want a positive number`},
		{[]string{"--fake", "--model", "dlrm-tiny=-1,dcnv2-tiny=1"}, `model dlrm-tiny's weight "-1": want a positive number`},
		{[]string{"--fake", "--model", "dlrm-tiny=NaN,dcnv2-tiny=1"}, `model dlrm-tiny's weight "NaN": want a positive number`},
		{[]string{"--fake", "--model", "dlrm-tiny=1", "--model", "dlrm-tiny=2"}, "model dlrm-tiny is given twice"},
		{[]string{"--fake", "--model", "dlrm-tiny=1,,dcnv2-tiny=1"}, "an empty model name"},
		{[]string{"--fake", "--model", "dlrm-tiny=0.7,dcnv2-tiny"}, "give every model of the mix a weight"},
		{[]string{"--fake", "--model", "dlrm-tiny,dcnv2-tiny", "--onnx", "m.onnx"}, "--onnx gives one model's inputs; with a mix of models (--model dlrm-tiny=0.50,dcnv2-tiny=0.50)"},
		{[]string{"--fake", "--model", "dlrm-tiny,dcnv2-tiny", "--model-preset", "dlrm-tiny"}, "--model-preset gives one model's inputs"},
		{[]string{"--fake", "--model", "hc,dlrm-tiny", "--plan", dir, "--update-rate", "10"}, "--update-rate: the update stream writes one model's tables"},
		{[]string{"--fake", "--model", "hc,dlrm-tiny", "--plan", dir, "--update-only"}, "--update-only: the update stream writes one model's tables"},
		{[]string{"--fake", "--model", "dlrm-tiny,nope"}, "model nope's inputs: give --plan DIR (its plan folder) or name a zoo preset"},
		{[]string{"--fake", "--model", "dlrm-tiny,dcnv2-tiny", "--plan", dir}, "--plan " + dir + " is model hc's, which the mix (--model dlrm-tiny=0.50,dcnv2-tiny=0.50) does not have"},
		{[]string{"--fake", "--model", "hc,dlrm-tiny", "--plan", dir, "--plan", dir}, "are both model hc's: give one plan per model"},
		{[]string{"--fake", "--model", "hc", "--plan", dir, "--plan", dir}, "--plan is given 2 times for one model"},
		{[]string{"--fake", "--model", "hc,dlrm-tiny", "--plan", dir, "--context-inputs", "cat_0", "--duration", "1s"}, "model hc: requests: context input \"cat_0\""},
	} {
		out, err := runCLI(t, append(c.args, "--quiet")...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: error %v, want %q\n%s", c.args, err, c.want, out)
		}
	}
}
