package tune

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// fakeTrialer scores a configuration by a known function of its flags.
type fakeTrialer struct {
	space Space
	f     func(Point) float64
	calls int
}

func (t *fakeTrialer) Trial(_ context.Context, n int, c Config, start float64) (Result, error) {
	t.calls++
	p, ok := t.space.Index(c)
	if !ok {
		return Result{Error: "not in space"}, nil
	}
	s := t.f(p)
	return Result{MaxRPS: s / 270, SamplesPerS: s, P99Ms: 50, Steps: 6}, nil
}

func TestRunGridThenSearchWithPrior(t *testing.T) {
	dir := t.TempDir()
	space := testSpace()
	clock := time.Unix(0, 0)
	now := func() time.Time { clock = clock.Add(time.Minute); return clock }
	priorFile := filepath.Join(dir, "prior.jsonl")

	// A grid on model A fills the prior.
	fa := &fakeTrialer{space: space, f: bowl(space, Point{3, 0, 2, 1}, 4e4)}
	var progress strings.Builder
	rep, err := Run(context.Background(), Options{Model: "a", Features: Features{DenseParamBytes: 1e6, DenseFLOPs: 1e6, TableBytes: 1e9, CutBytes: 1700, Candidates: 270},
		Space: space, Grid: true, Prior: priorFile, Out: filepath.Join(dir, "a"), Trialer: fa, Progress: &progress, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Trials) != space.Size() || fa.calls != space.Size() || rep.Stop != StopExhausted {
		t.Fatalf("grid: %d trials, %d calls, stop %s", len(rep.Trials), fa.calls, rep.Stop)
	}
	if got := rep.Best.Config; got["micro-batch"] != "512" || got["max-batch"] != "256" || got["max-delay"] != "4ms" || got["threads"] != "2" {
		t.Errorf("grid best %v", got)
	}
	if lines := strings.Count(progress.String(), "\ntrial "); lines != space.Size() {
		t.Errorf("%d progress lines:\n%s", lines, progress.String())
	}
	recs, err := ReadPrior(priorFile)
	if err != nil || len(recs) != space.Size() {
		t.Fatalf("prior: %d records, %v", len(recs), err)
	}

	// A search on a similar model B starts at A's best and stops soon.
	fb := &fakeTrialer{space: space, f: bowl(space, Point{3, 0, 2, 1}, 9e4)}
	rep, err = Run(context.Background(), Options{Model: "b", Features: Features{DenseParamBytes: 2e6, DenseFLOPs: 2e6, TableBytes: 2e9, CutBytes: 1700, Candidates: 270},
		Space: space, Start: space.Config(Point{1, 1, 1, 0}), Prior: priorFile, Out: filepath.Join(dir, "b"), Trialer: fb, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	if rep.PriorPts != space.Size() {
		t.Errorf("prior points %d", rep.PriorPts)
	}
	if key(mustIndex(t, space, rep.Trials[0].Config)) != key(Point{3, 0, 2, 1}) {
		t.Errorf("first trial %v, want the prior's best", rep.Trials[0].Config)
	}
	if len(rep.Trials) > space.Size()/10 {
		t.Errorf("search took %d trials of a %d grid", len(rep.Trials), space.Size())
	}
	// tune.json is what prism up --config takes.
	cfg, err := ReadConfig(filepath.Join(dir, "b", File))
	if err != nil {
		t.Fatal(err)
	}
	if cfg["micro-batch"] != "512" || cfg["threads"] != "2" || len(cfg) != len(space.Dims) {
		t.Errorf("config from tune.json: %v", cfg)
	}
	recs, _ = ReadPrior(priorFile)
	if len(recs) != space.Size()+len(rep.Trials) {
		t.Errorf("prior after the search: %d records", len(recs))
	}

	// A search on model A again starts from B's records only: A's own
	// grid is not a prior of A (the search would start at its answer).
	bTrials := len(rep.Trials)
	rep, err = Run(context.Background(), Options{Model: "a", Features: Features{DenseParamBytes: 1e6, DenseFLOPs: 1e6, TableBytes: 1e9, CutBytes: 1700, Candidates: 270},
		Space: space, Prior: priorFile, Out: filepath.Join(dir, "a2"), Trialer: fa, Now: now})
	if err != nil {
		t.Fatal(err)
	}
	if rep.PriorPts != bTrials {
		t.Errorf("a search of model a after its grid: %d prior points, want model b's %d", rep.PriorPts, bTrials)
	}
}

func mustIndex(t *testing.T, s Space, c Config) Point {
	t.Helper()
	p, ok := s.Index(c)
	if !ok {
		t.Fatalf("%v not in space", c)
	}
	return p
}

func TestReadConfig(t *testing.T) {
	dir := t.TempDir()
	for i, tc := range []struct {
		file    string
		want    Config
		wantErr string
	}{
		{file: `{"micro-batch": 256, "max-delay": "4ms", "fixed-admission": true}`, want: Config{"micro-batch": "256", "max-delay": "4ms", "fixed-admission": "true"}},
		{file: `{"mode": "search", "best": {"n": 3, "config": {"threads": "2"}}, "trials": []}`, want: Config{"threads": "2"}},
		{file: `{"best": null, "trials": []}`, wantErr: "without a best configuration"},
		{file: `{"threads": [1, 2]}`, wantErr: "want a string, number or boolean"},
		{file: `not json`, wantErr: "invalid character"},
	} {
		path := filepath.Join(dir, strconv.Itoa(i)+".json")
		if err := os.WriteFile(path, []byte(tc.file), 0o644); err != nil {
			t.Fatal(err)
		}
		got, err := ReadConfig(path)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%s: error %v, want %q", tc.file, err, tc.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", tc.file, err)
			continue
		}
		if len(got) != len(tc.want) {
			t.Errorf("%s: %v, want %v", tc.file, got, tc.want)
		}
		for k, v := range tc.want {
			if got[k] != v {
				t.Errorf("%s: %s = %q, want %q", tc.file, k, got[k], v)
			}
		}
	}
}

func TestSimilarity(t *testing.T) {
	a := Features{DenseParamBytes: 2e6, DenseFLOPs: 1e6, TableBytes: 2e9, CutBytes: 1716, Candidates: 270}
	if s := Similarity(a, a); s != 1 {
		t.Errorf("self similarity %v", s)
	}
	b := a
	b.TableBytes = 2e7 // two decades smaller tables
	c := a
	c.TableBytes = 2e8
	if !(Similarity(a, b) < Similarity(a, c) && Similarity(a, c) < 1) {
		t.Errorf("similarity not decreasing with distance: %v %v", Similarity(a, b), Similarity(a, c))
	}
}

// stoppingTrialer is fakeTrialer until its stop-th trial, which fails as
// a Ctrl-C does.
type stoppingTrialer struct {
	fakeTrialer
	stop int
}

func (t *stoppingTrialer) Trial(ctx context.Context, n int, c Config, start float64) (Result, error) {
	if n == t.stop {
		return Result{}, context.Canceled
	}
	return t.fakeTrialer.Trial(ctx, n, c, start)
}

// TestRunStoppedKeepsPrior: a run stopped at its third trial returns the
// stop and still appends its two measured trials to the prior, scored
// against the best of them.
func TestRunStoppedKeepsPrior(t *testing.T) {
	dir := t.TempDir()
	space := testSpace()
	priorFile := filepath.Join(dir, "prior.jsonl")
	tr := &stoppingTrialer{fakeTrialer: fakeTrialer{space: space, f: bowl(space, Point{3, 0, 2, 1}, 4e4)}, stop: 3}
	rep, err := Run(context.Background(), Options{Model: "a", Space: space, Grid: true, Prior: priorFile, Out: filepath.Join(dir, "a"), Trialer: tr})
	if !errors.Is(err, context.Canceled) || len(rep.Trials) != 2 {
		t.Fatalf("stopped at trial 3: %v, %d trials", err, len(rep.Trials))
	}
	recs, err := ReadPrior(priorFile)
	if err != nil || len(recs) != 2 {
		t.Fatalf("prior after a stopped run: %d records, %v; want the 2 measured", len(recs), err)
	}
	if best := max(recs[0].Score, recs[1].Score); best != 1 {
		t.Fatalf("prior scores %v and %v: want the best of the run at 1", recs[0].Score, recs[1].Score)
	}
}

// notStartingTrialer's prism up never starts, for the reason why.
type notStartingTrialer struct{ why string }

func (t notStartingTrialer) Trial(context.Context, int, Config, float64) (Result, error) {
	return Result{NotStarted: true, Error: t.why}, nil
}

// TestRunStopsWhenFirstTrialDoesNotStart: a trial whose prism up does
// not start for a reason no configuration changes (its store in use,
// say) ends the search with the reason, not after every configuration
// failed alike as "no configuration met the SLO"; nothing goes to the
// prior. One that fails for its configuration (out of memory) is that
// configuration's: the search goes on.
func TestRunStopsWhenFirstTrialDoesNotStart(t *testing.T) {
	dir := t.TempDir()
	space := testSpace()
	priorFile := filepath.Join(dir, "prior.jsonl")
	why := `prism up: up exited before it was ready: [router] prism: open update log "db-router-log": in use by another process`
	rep, err := Run(context.Background(), Options{Model: "a", Space: space, Grid: true, Prior: priorFile, Out: dir, Trialer: notStartingTrialer{why}})
	if err == nil || !strings.Contains(err.Error(), "trial 1 did not start, for a reason no configuration changes") || !strings.Contains(err.Error(), "in use by another process") {
		t.Fatalf("Run: %v", err)
	}
	if len(rep.Trials) != 1 || !rep.Trials[0].Result.NotStarted {
		t.Fatalf("trials %+v, want the one that did not start", rep.Trials)
	}
	if _, err := os.Stat(priorFile); !os.IsNotExist(err) {
		t.Fatalf("prior written from a run that measured nothing: %v", err)
	}
}

// TestRunPriorNotWritable: a prior that could not be appended to after
// the trials fails the run before the first trial, not after them all.
func TestRunPriorNotWritable(t *testing.T) {
	// A folder nobody can make, root included: reading finds no prior
	// there (a first run), writing fails.
	const unmakeable = "/proc/prism-no-such/prior.jsonl"
	if _, err := os.Stat("/proc/self"); err != nil {
		t.Skip("no /proc here: no folder that cannot be made for the test")
	}
	dir := t.TempDir()
	_, err := Run(context.Background(), Options{Model: "a", Space: testSpace(), Grid: true, Prior: unmakeable, Out: dir, Trialer: notStartingTrialer{"not reached"}})
	if err == nil || !strings.Contains(err.Error(), "appended to at the end, and it cannot be") {
		t.Fatalf("Run: %v", err)
	}
}

// TestTunedFor: a tune.json names the model it was tuned for; a plain
// object of flags, or a file that is not one, names none.
func TestTunedFor(t *testing.T) {
	dir := t.TempDir()
	for body, want := range map[string]string{
		`{"model": "dlrm-kaggle", "mode": "grid", "best": {"config": {"threads": "1"}}}`: "dlrm-kaggle",
		`{"model": "x", "mode": "grid"}`:                                                 "",
		`{"threads": "2"}`:                                                               "",
		`not json`:                                                                       "",
	} {
		p := filepath.Join(dir, "c.json")
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		if got := TunedFor(p); got != want {
			t.Errorf("TunedFor(%s) = %q, want %q", body, got, want)
		}
	}
	if got := TunedFor(filepath.Join(dir, "none.json")); got != "" {
		t.Errorf("a missing file: %q", got)
	}
}

type oneBadConfig struct{}

func (oneBadConfig) Trial(_ context.Context, _ int, c Config, _ float64) (Result, error) {
	if c["micro-batch"] == "64" {
		return Result{NotStarted: true, Error: "prism up: up exited before it was ready: [dense-0] prism: out of memory"}, nil
	}
	return Result{MaxRPS: 100, SamplesPerS: 1000, Steps: 3}, nil
}

// TestRunGoesOnPastOneConfigThatDoesNotStart: 96ae673 ends the whole search when
// the first trial's prism up does not start, on the ground that "every
// other would fail alike". ProcessTrialer marks every start failure
// NotStarted, including ones that depend on the configuration; the
// search then measures nothing although 95 of 96 configurations serve.
func TestRunGoesOnPastOneConfigThatDoesNotStart(t *testing.T) {
	dir := t.TempDir()
	rep, err := Run(context.Background(), Options{Model: "a", Space: testSpace(), Grid: true, MaxTrials: 4, Out: dir, Prior: dir + "/prior.jsonl", Trialer: oneBadConfig{}})
	if err != nil {
		t.Fatalf("Run: %v (after %d trials)", err, len(rep.Trials))
	}
}

// TestRunStopsWhenEveryTrialFailsAlike: trials that all fail to start
// for one reason environmentCauses does not list (ONNX Runtime not
// found) end the search at the third: after two, a configuration that
// shares no setting with the first is tried, and it fails alike.
func TestRunStopsWhenEveryTrialFailsAlike(t *testing.T) {
	dir := t.TempDir()
	why := "prism up: up exited before it was ready: [dense0] prism: ONNX Runtime library not found at ORT_LIB=/nonexistent/libonnxruntime.so"
	tr := notStartingTrialer{why}
	rep, err := Run(context.Background(), Options{Model: "a", Space: testSpace(), Grid: true, Out: dir, Trialer: tr})
	if err == nil || !strings.Contains(err.Error(), "trial 3 did not start, as none before it did, for the same reason") || len(rep.Trials) != 3 {
		t.Fatalf("Run: %v after %d trials", err, len(rep.Trials))
	}
	first, third := rep.Trials[0].Config, rep.Trials[2].Config
	for k, v := range first {
		if third[k] == v {
			t.Errorf("the third trial shares %s=%s with the first: %v, %v", k, v, first, third)
		}
	}
}

// TestRunPriorCutShort: an append to the prior cut short (a full disk,
// a crash mid-write) leaves a record without its end. The next run
// reads the whole records, says it skipped the cut one, and appends its
// own on a line of their own; it failed with "unexpected end of JSON
// input", and so did every later run on the default prior.
func TestRunPriorCutShort(t *testing.T) {
	dir := t.TempDir()
	space := testSpace()
	priorFile := filepath.Join(dir, "prior.jsonl")
	fa := &fakeTrialer{space: space, f: bowl(space, Point{3, 0, 2, 1}, 4e4)}
	if _, err := Run(context.Background(), Options{Model: "a", Space: space, Grid: true, MaxTrials: 3, Prior: priorFile, Out: filepath.Join(dir, "a"), Trialer: fa}); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(priorFile)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(priorFile, st.Size()-20); err != nil { // the third record cut
		t.Fatal(err)
	}
	var progress strings.Builder
	fb := &fakeTrialer{space: space, f: bowl(space, Point{3, 0, 2, 1}, 9e4)}
	rep, err := Run(context.Background(), Options{Model: "b", Space: space, Grid: true, MaxTrials: 2, Prior: priorFile, Out: filepath.Join(dir, "b"), Trialer: fb, Progress: &progress})
	if err != nil {
		t.Fatalf("Run on a prior cut short: %v", err)
	}
	if !strings.Contains(progress.String(), "skipped 1 record(s)") {
		t.Errorf("progress does not tell of the cut record:\n%s", progress.String())
	}
	recs, err := ReadPrior(priorFile)
	if err != nil || len(recs) != 2+len(rep.Trials) {
		t.Fatalf("prior after the next run: %d records, %v; want a's 2 whole and b's %d", len(recs), err, len(rep.Trials))
	}
	if recs[2].Model != "b" || recs[3].Model != "b" {
		t.Errorf("records %v, %v after a's two: want b's", recs[2].Model, recs[3].Model)
	}
	// A file that is not a prior is still refused.
	if err := os.WriteFile(priorFile, []byte("{\"model\": \"a\", \"config\": {\"threads\": \"1\"}}\nnot a record\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadPrior(priorFile); err == nil || !strings.Contains(err.Error(), "line 2") {
		t.Errorf("ReadPrior of a line that is no record: %v", err)
	}
}

// recordingNotStarter's prism up never starts, for one reason that no
// environmentCauses names; it records the configurations tried.
type recordingNotStarter struct{ tried []Config }

func (r *recordingNotStarter) Trial(_ context.Context, _ int, c Config, _ float64) (Result, error) {
	r.tried = append(r.tried, c)
	return Result{NotStarted: true, Error: "prism up: up exited before it was ready: [dense0] prism: ONNX Runtime library not found"}, nil
}

// TestRunProbeNotRepeated: after two trials that did not start for one
// reason, the probe (the configuration sharing no setting with the
// first) is not run again when the second trial already was it: the
// search ends at the second trial, no configuration tried twice. (It
// ran the second's configuration again as a third trial: a 2-point
// space, or a 3 x 2 one whose second trial was the first's opposite.)
func TestRunProbeNotRepeated(t *testing.T) {
	for _, space := range []Space{
		{Dims: []Dim{{Flag: "micro-batch", Values: []string{"256", "512"}}}},
		{Dims: []Dim{{Flag: "micro-batch", Values: []string{"128", "256", "512"}}, {Flag: "threads", Values: []string{"1", "2"}}}},
	} {
		for _, grid := range []bool{false, true} {
			tr := &recordingNotStarter{}
			rep, err := Run(context.Background(), Options{Model: "a", Space: space, Grid: grid, Out: t.TempDir(), Trialer: tr})
			seen := map[string]bool{}
			for _, c := range tr.tried {
				k := space.String(mustIndex(t, space, c))
				if seen[k] {
					t.Errorf("%s (grid %v): %s tried twice: %v", spaceString(space), grid, k, tr.tried)
				}
				seen[k] = true
			}
			if err == nil || !strings.Contains(err.Error(), "as none before it did, for the same reason") {
				t.Errorf("%s (grid %v): Run: %v after %d trials", spaceString(space), grid, err, len(rep.Trials))
			}
		}
	}
}

// laterNotStarting measures its first trials, then its prism up does
// not start for a reason no configuration changes.
type laterNotStarting struct {
	fakeTrialer
	from int
}

func (t *laterNotStarting) Trial(ctx context.Context, n int, c Config, start float64) (Result, error) {
	if n >= t.from {
		return Result{NotStarted: true, Error: "prism up: up exited before it was ready: [embedding0] prism: open store: in use by another process"}, nil
	}
	return t.fakeTrialer.Trial(ctx, n, c, start)
}

// TestRunStoppedByEnvironmentKeepsPrior: a search ended at its third
// trial because prism up no longer starts (another prism up took the
// store) still appends its two measured trials to the prior, as a run
// stopped by Ctrl-C does; they were lost.
func TestRunStoppedByEnvironmentKeepsPrior(t *testing.T) {
	dir := t.TempDir()
	space := testSpace()
	priorFile := filepath.Join(dir, "prior.jsonl")
	tr := &laterNotStarting{fakeTrialer: fakeTrialer{space: space, f: bowl(space, Point{3, 0, 2, 1}, 4e4)}, from: 3}
	rep, err := Run(context.Background(), Options{Model: "a", Space: space, Prior: priorFile, Out: filepath.Join(dir, "a"), Trialer: tr})
	if err == nil || !strings.Contains(err.Error(), "trial 3 did not start") || len(rep.Trials) != 3 {
		t.Fatalf("Run: %v after %d trials", err, len(rep.Trials))
	}
	recs, err := ReadPrior(priorFile)
	if err != nil || len(recs) != 2 {
		t.Fatalf("prior after a run stopped at trial 3: %d records, %v; want the 2 measured", len(recs), err)
	}
}

// TestRunSortsValues: values given out of order (--micro-batch
// 512,128,256) are searched in increasing order, so that neighbours are
// adjacent values and another model's configuration is placed between
// the values around it. Unsorted, another model's best micro-batch 240
// was placed at the list's first value, 512 (with its 32, and 2048 at
// 256), and the first trial was 128 instead of 256. Two spellings of one value are refused: they are
// one configuration tried twice.
func TestRunSortsValues(t *testing.T) {
	dir := t.TempDir()
	priorFile := filepath.Join(dir, "prior.jsonl")
	f := Features{DenseParamBytes: 1e6, DenseFLOPs: 1e6, TableBytes: 1e9, CutBytes: 1700, Candidates: 270}
	if err := AppendPrior(priorFile, []PriorRecord{
		{Model: "x", Features: f, Config: Config{"micro-batch": "240", "max-delay": "2ms"}, Score: 1},
		{Model: "x", Features: f, Config: Config{"micro-batch": "2048", "max-delay": "2ms"}, Score: 0.2},
		{Model: "x", Features: f, Config: Config{"micro-batch": "32", "max-delay": "2ms"}, Score: 0.2},
	}); err != nil {
		t.Fatal(err)
	}
	space := Space{Dims: []Dim{{Flag: "micro-batch", Values: []string{"512", "128", "256"}}, {Flag: "max-delay", Values: []string{"4ms", "1ms", "2ms"}}}}
	tr := &fakeTrialer{space: space, f: func(Point) float64 { return 1000 }}
	rep, err := Run(context.Background(), Options{Model: "y", Features: f, Space: space, Prior: priorFile, MaxTrials: 1, Out: filepath.Join(dir, "y"), Trialer: tr})
	if err != nil {
		t.Fatal(err)
	}
	if got := rep.Space.String(Point{0, 0}) + " .. " + rep.Space.String(Point{2, 2}); got != "micro-batch=128 max-delay=1ms .. micro-batch=512 max-delay=4ms" {
		t.Errorf("space searched %s", got)
	}
	if mb := rep.Trials[0].Config["micro-batch"]; mb != "256" {
		t.Errorf("first trial micro-batch %s, want 256 (the prior's best, 240, lies between 128 and 256)", mb)
	}
	for _, vals := range [][]string{{"1ms", "1000us"}, {"256", "0256"}} {
		s := Space{Dims: []Dim{{Flag: "x", Values: vals}}}
		if err := s.Validate(); err == nil || !strings.Contains(err.Error(), "the same value") {
			t.Errorf("Validate %v: %v", vals, err)
		}
	}
	if got := (Space{Dims: []Dim{{Flag: "hot-bytes", Values: []string{"auto", "512MiB", "128MiB"}}}}).Sorted().Dims[0].Values; !slices.Equal(got, []string{"auto", "512MiB", "128MiB"}) {
		t.Errorf("a dimension with a value that is no number was reordered: %v", got)
	}
}

// TestRunGridCutShortStop: a grid cut short by --max-trials stops for
// max-trials, not as exhausted ("best of 4 trials (exhausted)" of a
// 96-configuration grid).
func TestRunGridCutShortStop(t *testing.T) {
	space := testSpace()
	for _, tc := range []struct {
		max  int
		want string
	}{{4, StopMaxTrials}, {0, StopExhausted}, {space.Size(), StopExhausted}} {
		tr := &fakeTrialer{space: space, f: bowl(space, Point{3, 0, 2, 1}, 4e4)}
		rep, err := Run(context.Background(), Options{Model: "a", Space: space, Grid: true, MaxTrials: tc.max, Out: t.TempDir(), Trialer: tr})
		if err != nil {
			t.Fatal(err)
		}
		if rep.Stop != tc.want {
			t.Errorf("grid with --max-trials %d: stop %s after %d trials, want %s", tc.max, rep.Stop, len(rep.Trials), tc.want)
		}
	}
}

// TestRunRefusesForeignPrior: a --prior that is another JSON file (a
// prism up --config object of flags, given as the prior by mistake) is
// refused before any trial and left as it was; it was read as a prior
// of one record with no model and no configuration, and the run's
// records were appended to it, which prism up --config then refused.
func TestRunRefusesForeignPrior(t *testing.T) {
	dir := t.TempDir()
	for _, body := range []string{`{"threads": "2", "micro-batch": "256"}` + "\n", "{}\n"} {
		foreign := filepath.Join(dir, "up-config.json")
		if err := os.WriteFile(foreign, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		space := testSpace()
		tr := &fakeTrialer{space: space, f: bowl(space, Point{3, 0, 2, 1}, 4e4)}
		_, err := Run(context.Background(), Options{Model: "a", Space: space, Grid: true, MaxTrials: 2, Prior: foreign, Out: filepath.Join(dir, "out"), Trialer: tr})
		if err == nil || !strings.Contains(err.Error(), "not a prior record") {
			t.Errorf("prior %s: Run: %v", body, err)
		}
		if b, _ := os.ReadFile(foreign); string(b) != body || tr.calls != 0 {
			t.Errorf("prior %s: %d trials, and the file is now:\n%s", body, tr.calls, b)
		}
	}
}

// failingTrialer is fakeTrialer until its fail-th trial, which returns
// err after calling cancel (a Ctrl-C) when set.
type failingTrialer struct {
	fakeTrialer
	fail   int
	err    error
	cancel context.CancelFunc
}

func (t *failingTrialer) Trial(ctx context.Context, n int, c Config, start float64) (Result, error) {
	if n == t.fail {
		if t.cancel != nil {
			t.cancel()
		}
		return Result{}, t.err
	}
	return t.fakeTrialer.Trial(ctx, n, c, start)
}

// TestRunStoppedReport: a run stopped in a trial (Ctrl-C) or ended by a
// trial that could not be run says so in tune.json's stop, which keeps
// the trials and the best so far (its stop was "", as of a run still
// going); each trial is announced before it runs.
func TestRunStoppedReport(t *testing.T) {
	for _, tc := range []struct {
		name     string
		err      error
		ctrlC    bool
		wantStop string
	}{
		{"Ctrl-C", context.Canceled, true, StopInterrupted},
		{"trial error", errors.New("read find-max result: no such file"), false, StopFailed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			space := testSpace()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			tr := &failingTrialer{fakeTrialer: fakeTrialer{space: space, f: bowl(space, Point{3, 0, 2, 1}, 4e4)}, fail: 3, err: tc.err}
			if tc.ctrlC {
				tr.cancel = cancel
			}
			var progress strings.Builder
			rep, err := Run(ctx, Options{Model: "a", Space: space, Grid: true, Out: dir, Trialer: tr, Progress: &progress})
			if !errors.Is(err, tc.err) || rep.Stop != tc.wantStop {
				t.Fatalf("Run: %v, stop %q; want %v, stop %q", err, rep.Stop, tc.err, tc.wantStop)
			}
			var onDisk Report
			if b, err := os.ReadFile(filepath.Join(dir, File)); err != nil || json.Unmarshal(b, &onDisk) != nil {
				t.Fatalf("tune.json: %v", err)
			}
			if onDisk.Stop != tc.wantStop || len(onDisk.Trials) != 2 || onDisk.Best == nil {
				t.Errorf("tune.json: stop %q, %d trials, best %v; want stop %q, the 2 measured, a best", onDisk.Stop, len(onDisk.Trials), onDisk.Best, tc.wantStop)
			}
			for n := 1; n <= 3; n++ {
				if want := fmt.Sprintf("tune: trial %d/%d running: ", n, space.Size()); !strings.Contains(progress.String(), want) {
					t.Errorf("progress lacks %q:\n%s", want, progress.String())
				}
			}
		})
	}
}

// TestReadPriorLines: what a prior file may hold. A record cut short is
// skipped and the run says on which line; blank lines are skipped; a
// line that is no record is an error naming its line (a line over the
// scanner's limit named none; a blank line with spaces was an error).
func TestReadPriorLines(t *testing.T) {
	rec := `{"model":"a","features":{},"config":{"threads":"1"},"score":1,"samples_per_s":10}`
	for _, tc := range []struct {
		name, body string
		recs       int
		note       string // in the run's progress
		err        string // in ReadPrior's error
	}{
		{name: "empty", body: ""},
		{name: "one record", body: rec + "\n", recs: 1},
		{name: "cut at the end", body: rec + "\n" + rec[:30], recs: 1, note: "skipped 1 record(s) an earlier append left cut short (line 2)"},
		{name: "cut in the middle", body: rec + "\n" + rec[:30] + "\n" + rec + "\n", recs: 2, note: "(line 2)"},
		{name: "cut four times", body: strings.Repeat(rec[:20]+"\n", 4) + rec + "\n", recs: 1, note: "(line 1, 2, 3 and 1 more)"},
		{name: "blank lines", body: rec + "\n\n   \n\t\n" + rec + "\r\n", recs: 2},
		{name: "not JSON", body: rec + "\nnot a record\n", err: "line 2"},
		{name: "a wrong type", body: strings.Replace(rec, `"score":1`, `"score":"high"`, 1) + "\n", err: "line 1"},
		{name: "a pretty-printed tune.json", body: "{\n  \"model\": \"a\",\n  \"best\": null\n}\n", err: "line 2"},
		{name: "a line over 1 MiB", body: rec + "\n" + rec + "\n{\"model\":\"" + strings.Repeat("x", 1<<20) + "\"}\n", err: "line 3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "prior.jsonl")
			if err := os.WriteFile(path, []byte(tc.body), 0o644); err != nil {
				t.Fatal(err)
			}
			recs, err := ReadPrior(path)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("ReadPrior: %v; want an error naming %q", err, tc.err)
				}
				return
			}
			if err != nil || len(recs) != tc.recs {
				t.Fatalf("ReadPrior: %d records, %v; want %d", len(recs), err, tc.recs)
			}
			var progress strings.Builder
			space := Space{Dims: []Dim{{Flag: "threads", Values: []string{"1", "2"}}}}
			if _, err := Run(context.Background(), Options{Model: "b", Space: space, Grid: true, Prior: path, Out: dir,
				Trialer: &fakeTrialer{space: space, f: func(Point) float64 { return 100 }}, Progress: &progress}); err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(progress.String(), tc.note) || tc.note == "" && strings.Contains(progress.String(), "cut short") {
				t.Errorf("progress does not say %q:\n%s", tc.note, progress.String())
			}
		})
	}
}

// TestRunPriorOtherMachine: a prior's records measured on another
// machine shape are left out, with a note (a 64-core host's best
// --dense-workers 128 was placed at the top of a 2-core host's
// 1,2,4); those of this shape, and an older release's that recorded
// none, are the prior; the run's records carry its machine.
func TestRunPriorOtherMachine(t *testing.T) {
	space := Space{Dims: []Dim{{Flag: "dense-workers", Values: []string{"1", "2", "4"}}, {Flag: "threads", Values: []string{"1", "2"}}}}
	here := &Machine{CPUs: 2}
	for _, tc := range []struct {
		name    string
		machine *Machine // of the prior's records
		points  int
		note    string
	}{
		{"this machine", &Machine{CPUs: 2}, space.Size(), ""},
		{"no machine recorded", nil, space.Size(), ""},
		{"more CPUs", &Machine{CPUs: 64}, 0, "left out 6 record(s) measured on another machine (64 CPUs; this one: 2 CPUs)"},
		{"a GPU host", &Machine{CPUs: 2, Devices: 8, Device: "NVIDIA H200"}, 0, "(2 CPUs, 8 x NVIDIA H200; this one: 2 CPUs)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, "prior.jsonl")
			var recs []PriorRecord
			for _, p := range space.All() {
				recs = append(recs, PriorRecord{Model: "a", Machine: tc.machine, Config: space.Config(p), Score: 0.5, SamplesPerS: 50})
			}
			if err := AppendPrior(path, recs); err != nil {
				t.Fatal(err)
			}
			var progress strings.Builder
			rep, err := Run(context.Background(), Options{Model: "b", Machine: here, Space: space, Grid: true, Prior: path, Out: dir,
				Trialer: &fakeTrialer{space: space, f: func(Point) float64 { return 100 }}, Progress: &progress})
			if err != nil {
				t.Fatal(err)
			}
			// A grid's report counts no prior points: the search's would.
			kept, _ := OnMachine(recs, here)
			if got := len(PriorPoints(kept, space, Features{}, "b", 0.01)); got != tc.points {
				t.Errorf("%d prior points, want %d", got, tc.points)
			}
			if tc.note != "" && !strings.Contains(progress.String(), tc.note) || tc.note == "" && strings.Contains(progress.String(), "another machine") {
				t.Errorf("progress, want %q:\n%s", tc.note, progress.String())
			}
			all, err := ReadPrior(path)
			if err != nil || len(all) != 2*space.Size() || all[len(all)-1].Machine == nil || *all[len(all)-1].Machine != *here {
				t.Fatalf("prior after the run: %d records, %v; want the run's %d on %v", len(all), err, space.Size(), here)
			}
			if rep.Machine == nil || *rep.Machine != *here {
				t.Errorf("tune.json machine %v, want %v", rep.Machine, here)
			}
		})
	}
}

// TestRunKeepsEarlierReport: a run into a folder holding an earlier
// run's tune.json keeps that one under its time (the second run wrote
// over it at its first trial, and with it the best a prism up --config
// may serve with), and says so.
func TestRunKeepsEarlierReport(t *testing.T) {
	dir := t.TempDir()
	space := testSpace()
	tr := &fakeTrialer{space: space, f: bowl(space, Point{3, 0, 2, 1}, 4e4)}
	var reports []*Report
	for run := range 3 {
		var progress strings.Builder
		rep, err := Run(context.Background(), Options{Model: "a", Space: space, Grid: true, MaxTrials: 1 + run, Out: dir, Trialer: tr, Progress: &progress})
		if err != nil {
			t.Fatal(err)
		}
		reports = append(reports, rep)
		if said := strings.Contains(progress.String(), "held an earlier run's report: kept as "); said != (run > 0) {
			t.Errorf("run %d: said it kept the earlier report: %v\n%s", run+1, said, progress.String())
		}
	}
	kept, _ := filepath.Glob(filepath.Join(dir, "tune-*.json"))
	if len(kept) != 2 {
		t.Fatalf("kept reports %v, want the first two runs'", kept)
	}
	trials := map[int]bool{}
	for _, k := range append(kept, filepath.Join(dir, File)) {
		var r Report
		if b, err := os.ReadFile(k); err != nil || json.Unmarshal(b, &r) != nil {
			t.Fatalf("%s: %v", k, err)
		}
		trials[len(r.Trials)] = true
	}
	if !trials[1] || !trials[2] || !trials[3] {
		t.Errorf("reports of %v trials, want each run's (1, 2 and 3)", trials)
	}
}

// TestRunOutInUse: a run refuses a --out another run holds, naming it,
// before any trial; once that run is over the folder is free again.
func TestRunOutInUse(t *testing.T) {
	dir := t.TempDir()
	space := testSpace()
	tr := &fakeTrialer{space: space, f: bowl(space, Point{3, 0, 2, 1}, 4e4)}
	unlock, err := lockOut(dir) // another run, holding it
	if err != nil {
		t.Fatal(err)
	}
	_, err = Run(context.Background(), Options{Model: "a", Space: space, Grid: true, MaxTrials: 1, Out: dir, Trialer: tr, Progress: io.Discard})
	if err == nil || !strings.Contains(err.Error(), "is in use by another prism tune") {
		t.Fatalf("a run in a folder another holds: %v, want it refused", err)
	}
	if _, serr := os.Stat(filepath.Join(dir, File)); serr == nil {
		t.Error("the refused run wrote a report")
	}
	unlock()
	if _, err := Run(context.Background(), Options{Model: "a", Space: space, Grid: true, MaxTrials: 1, Out: dir, Trialer: tr, Progress: io.Discard}); err != nil {
		t.Fatalf("after the other run: %v", err)
	}
}

// loggingTrialer writes a trial's log and find-max folder as
// ProcessTrialer names them (trial-NN.log, trial-NN/), each saying which
// run wrote it.
type loggingTrialer struct {
	fakeTrialer
	dir string
	run int
}

func (t *loggingTrialer) Trial(ctx context.Context, n int, c Config, start float64) (Result, error) {
	say := []byte(fmt.Sprintf("run %d trial %d\n", t.run, n))
	if err := os.WriteFile(filepath.Join(t.dir, fmt.Sprintf("trial-%02d.log", n)), say, 0o644); err != nil {
		return Result{}, err
	}
	fm := filepath.Join(t.dir, fmt.Sprintf("trial-%02d", n))
	if err := os.MkdirAll(fm, 0o755); err != nil {
		return Result{}, err
	}
	if err := os.WriteFile(filepath.Join(fm, "findmax.json"), say, 0o644); err != nil {
		return Result{}, err
	}
	return t.fakeTrialer.Trial(ctx, n, c, start)
}

// TestRunKeepsEarlierLogs: a run into a folder holding an earlier run's
// trial logs (trial-NN.log, trial-NN/) moves them into a folder named as
// that run's kept report (tune-TIME/ beside tune-TIME.json) before its
// first trial (it wrote over them, and a user comparing two runs lost the
// first's), and says so; the new run's logs are where they were; logs an
// earlier run left without a report (it stopped in its first trial) are
// kept too; other files in the folder are left alone.
func TestRunKeepsEarlierLogs(t *testing.T) {
	dir := t.TempDir()
	space := testSpace()
	if err := os.WriteFile(filepath.Join(dir, "notes.txt"), []byte("mine\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	read := func(p string) string {
		t.Helper()
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	// Run 0: an earlier run that left a trial's outputs and no report.
	if _, err := (&loggingTrialer{fakeTrialer: fakeTrialer{space: space, f: bowl(space, Point{3, 0, 2, 1}, 4e4)}, dir: dir}).Trial(context.Background(), 1, Config{}, 1); err != nil {
		t.Fatal(err)
	}
	for run := 1; run <= 3; run++ {
		tr := &loggingTrialer{fakeTrialer: fakeTrialer{space: space, f: bowl(space, Point{3, 0, 2, 1}, 4e4)}, dir: dir, run: run}
		var progress strings.Builder
		if _, err := Run(context.Background(), Options{Model: "a", Space: space, Grid: true, MaxTrials: 4 - run, Out: dir, Trialer: tr, Progress: &progress}); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(progress.String(), "held an earlier run's trial logs: moved to ") {
			t.Errorf("run %d: did not say it moved the earlier logs:\n%s", run, progress.String())
		}
	}
	// The last run's logs, where ProcessTrialer and the README put them.
	if got, want := read(filepath.Join(dir, "trial-01.log")), "run 3 trial 1\n"; got != want {
		t.Errorf("trial-01.log: %q, want %q", got, want)
	}
	if _, err := os.Stat(filepath.Join(dir, "trial-02.log")); err == nil {
		t.Error("trial-02.log of an earlier run left beside the last run's")
	}
	if got := read(filepath.Join(dir, "notes.txt")); got != "mine\n" {
		t.Errorf("notes.txt: %q", got)
	}
	// Each earlier run's logs in one folder, beside its report of the
	// same name where it had one.
	kept, _ := filepath.Glob(filepath.Join(dir, "tune-*"))
	runs := map[int]bool{}
	for _, k := range kept {
		if filepath.Ext(k) == ".json" {
			if _, err := os.Stat(strings.TrimSuffix(k, ".json")); err != nil {
				t.Errorf("report %s without its run's logs: %v", k, err)
			}
			continue
		}
		var run, trials int
		for n := 1; ; n++ {
			p := filepath.Join(k, fmt.Sprintf("trial-%02d.log", n))
			if _, err := os.Stat(p); err != nil {
				break
			}
			if _, err := fmt.Sscanf(read(p), "run %d trial", &run); err != nil {
				t.Fatalf("%s: %v", p, err)
			}
			if fm := read(filepath.Join(k, fmt.Sprintf("trial-%02d", n), "findmax.json")); fm != read(p) {
				t.Errorf("%s: find-max %q beside log %q", k, fm, read(p))
			}
			trials++
		}
		want := 4 - run // runs 1 to 3 ran 3 to 1 trials
		if run == 0 {
			want = 1
		}
		if trials != want {
			t.Errorf("%s: run %d's %d trial logs, want %d", k, run, trials, want)
		}
		if _, err := os.Stat(k + ".json"); (err == nil) != (run > 0) {
			t.Errorf("%s: run %d: report beside it: %v", k, run, err == nil)
		}
		runs[run] = true
	}
	if len(runs) != 3 || !runs[0] || !runs[1] || !runs[2] {
		t.Errorf("kept logs of runs %v (%v), want 0, 1 and 2", runs, kept)
	}
}
