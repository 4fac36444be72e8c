package tune

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Options configure a tuning run.
type Options struct {
	// Model is the model's name; Features its features for the prior.
	Model    string
	Features Features
	// Machine is this host's shape, recorded with every trial in the
	// prior; records of another shape are not this run's prior (nil:
	// unknown, none recorded or left out).
	Machine *Machine
	Space   Space
	// Start is the configuration tried first without a prior (prism
	// up's defaults); its values must be in Space.
	Start Config
	// Grid runs every point of Space in order instead of searching.
	Grid bool
	// Threshold and MaxTrials end the search (see SearcherOptions).
	Threshold float64
	MaxTrials int
	// Prior is the prior file read at the start and appended to at the
	// end ("" : none).
	Prior string
	// StartRPS is the first find-max rate of the first trial; later
	// trials start at StartFraction of the best rate so far.
	StartRPS      float64
	StartFraction float64
	// Out is the folder for tune.json and the trials' logs.
	Out     string
	Trialer Trialer
	// Progress gets one line per trial (default io.Discard).
	Progress io.Writer
	// Now is the clock for the ETA and the prior's time stamps (default
	// time.Now).
	Now func() time.Time
}

// EnsureDefaults fills unset fields.
func (o *Options) EnsureDefaults() {
	if o.Threshold == 0 {
		o.Threshold = 0.02
	}
	if o.StartRPS == 0 {
		o.StartRPS = 100
	}
	if o.StartFraction == 0 {
		o.StartFraction = 0.6
	}
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	if o.Now == nil {
		o.Now = time.Now
	}
}

// Validate checks the options.
func (o *Options) Validate() error {
	if o.Model == "" {
		return errors.New("tune: no model name")
	}
	if err := o.Space.Validate(); err != nil {
		return fmt.Errorf("tune: %w", err)
	}
	if o.Out == "" {
		return errors.New("tune: no output folder")
	}
	if o.Trialer == nil {
		return errors.New("tune: no trialer")
	}
	if o.MaxTrials < 0 || !(o.Threshold > 0) || !(o.StartRPS > 0) || !(o.StartFraction > 0) {
		return fmt.Errorf("tune: max trials %d, threshold %v, start rate %v, start fraction %v: want >= 0 and positive", o.MaxTrials, o.Threshold, o.StartRPS, o.StartFraction)
	}
	if o.Start != nil {
		if _, ok := o.Space.Index(o.Start); !ok {
			return fmt.Errorf("tune: the start configuration %v is not in the search space", o.Start)
		}
	}
	return nil
}

// TrialRecord is one trial in tune.json.
type TrialRecord struct {
	N      int     `json:"n"`
	Config Config  `json:"config"`
	Result Result  `json:"result"`
	Secs   float64 `json:"seconds"`
	// Predicted and EI are the searcher's expectations before the trial
	// (fractions of the best so far; absent in a grid run).
	Predicted float64 `json:"predicted,omitempty"`
	EI        float64 `json:"expected_improvement,omitempty"`
}

// Report is tune.json.
type Report struct {
	Model     string        `json:"model"`
	Features  Features      `json:"features"`
	Machine   *Machine      `json:"machine,omitempty"`
	Mode      string        `json:"mode"` // "search" or "grid"
	Space     Space         `json:"space"`
	GridSize  int           `json:"grid_size"`
	Threshold float64       `json:"threshold,omitempty"`
	PriorFile string        `json:"prior_file,omitempty"`
	PriorPts  int           `json:"prior_points"`
	Stop      string        `json:"stop"`
	Trials    []TrialRecord `json:"trials"`
	// Best is the best trial; its Config is what prism up --config
	// takes.
	Best *TrialRecord `json:"best"`
}

// File is the name of the report in the output folder.
const File = "tune.json"

// Run tunes: it proposes (or, for a grid, enumerates) configurations,
// measures each with the trialer, writes tune.json after every trial
// and appends the run's trials to the prior file at the end.
func Run(ctx context.Context, o Options) (*Report, error) {
	o.EnsureDefaults()
	o.Space = o.Space.Sorted()
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(o.Out, 0o755); err != nil {
		return nil, fmt.Errorf("tune: %w", err)
	}
	// One run a folder: two writing one folder overwrote each other's
	// trial logs and reports (a shared --db is refused before this; two
	// tunes on one machine spoil each other's measurements anyway).
	unlock, err := lockOut(o.Out)
	if err != nil {
		return nil, err
	}
	defer unlock()
	// An earlier run's report in the folder (the default --out is the
	// same for every run) is kept, not written over at the first trial:
	// it may be what a prism up --config serves with, from hours of
	// trials. Its trials' logs are kept beside it, for comparing runs.
	if kept, logs, err := keepEarlier(o.Out); err != nil {
		return nil, err
	} else {
		if kept != "" {
			fmt.Fprintf(o.Progress, "tune: %s held an earlier run's report: kept as %s\n", filepath.Join(o.Out, File), kept)
		}
		if logs != "" {
			fmt.Fprintf(o.Progress, "tune: %s held an earlier run's trial logs: moved to %s\n", o.Out, logs)
		}
	}
	rep := &Report{Model: o.Model, Features: o.Features, Machine: o.Machine, Mode: "search", Space: o.Space, GridSize: o.Space.Size(), PriorFile: o.Prior}
	var prior []PriorPoint
	if o.Prior != "" {
		recs, torn, err := readPrior(o.Prior)
		if err != nil {
			return nil, fmt.Errorf("tune: %w", err)
		}
		if len(torn) > 0 {
			fmt.Fprintf(o.Progress, "tune: prior %s: skipped %d record(s) an earlier append left cut short (line %s)\n", o.Prior, len(torn), lineList(torn))
		}
		// Other models' runs only: the prior is what the search knows
		// before measuring this model, so a search after a grid of the
		// same model (the comparison tune's report makes) does not start
		// from the grid's answer.
		recs, elsewhere := OnMachine(recs, o.Machine)
		if len(elsewhere) > 0 {
			fmt.Fprintf(o.Progress, "tune: prior %s: left out %d record(s) measured on another machine (%s; this one: %s)\n", o.Prior, len(elsewhere), elsewhere[0].Machine, o.Machine)
		}
		prior = PriorPoints(recs, o.Space, o.Features, o.Model, 0.01)
		rep.PriorPts = len(prior)
		if err := checkPriorWritable(o.Prior); err != nil {
			return nil, fmt.Errorf("tune: %w", err)
		}
	}
	so := SearcherOptions{Space: o.Space, Prior: prior, Threshold: o.Threshold, MaxTrials: o.MaxTrials}
	if o.Start != nil {
		so.Start, _ = o.Space.Index(o.Start)
	}
	s, err := NewSearcher(so)
	if err != nil {
		return nil, fmt.Errorf("tune: %w", err)
	}
	limit := o.MaxTrials
	if limit == 0 || limit > o.Space.Size() {
		limit = o.Space.Size()
	}
	var grid []Point
	if o.Grid {
		rep.Mode, rep.PriorPts = "grid", 0
		grid = o.Space.All()
		if o.MaxTrials > 0 && o.MaxTrials < len(grid) {
			grid = grid[:o.MaxTrials]
		}
		limit = len(grid)
	} else {
		rep.Threshold = o.Threshold
	}
	fmt.Fprintf(o.Progress, "tune: %s, %s over %d configurations (%s), up to %d trials, %d prior points\n",
		o.Model, rep.Mode, o.Space.Size(), spaceString(o.Space), limit, rep.PriorPts)
	began := o.Now()
	bestRPS := 0.0
	// probe, when set, is the next trial: a configuration sharing no
	// setting with the first, after the first two did not start for
	// one reason (see startFailures); probed says it has run.
	var probe Point
	probed := false
	gridNext := 0
	tried := map[string]bool{}
	for {
		var prop Proposal
		switch {
		case probe != nil:
			prop, probe, probed = Proposal{Point: probe}, nil, true
		case o.Grid:
			for gridNext < len(grid) && tried[fmt.Sprint(grid[gridNext])] {
				gridNext++
			}
			if gridNext >= len(grid) || len(rep.Trials) >= limit {
				rep.Stop = StopExhausted
				if len(grid) < o.Space.Size() {
					rep.Stop = StopMaxTrials // the grid cut short
				}
			} else {
				prop = Proposal{Point: grid[gridNext]}
				gridNext++
			}
		default:
			if prop = s.Next(); prop.Stop != "" {
				rep.Stop = prop.Stop
				if prop.Stop == StopThreshold {
					fmt.Fprintf(o.Progress, "tune: stop: the next trial's expected improvement is %.1f%%, under --threshold %.1f%%\n", 100*prop.EI, 100*o.Threshold)
				}
			}
		}
		if rep.Stop != "" {
			break
		}
		tried[fmt.Sprint(prop.Point)] = true
		n := len(rep.Trials) + 1
		cfg := o.Space.Config(prop.Point)
		start := o.StartRPS
		if bestRPS > 0 {
			start = o.StartFraction * bestRPS
		}
		// A trial takes a while (prism up's start, then every find-max
		// step): say which one runs before it does, not only after.
		fmt.Fprintf(o.Progress, "tune: trial %d/%d running: %s (find-max from %.1f req/s)\n", n, limit, cfg.flags(o.Space.Flags()), start)
		t0 := o.Now()
		res, err := o.Trialer.Trial(ctx, n, cfg, start)
		if err != nil {
			// Stopped (Ctrl-C) or failed: what was measured still
			// goes to the prior, as the trials in the report, which
			// says why it ends there (its stop was empty, as if the
			// run were still going).
			rep.Stop = StopFailed
			if ctx.Err() != nil {
				rep.Stop = StopInterrupted
			}
			err = fmt.Errorf("tune: trial %d: %w", n, err)
			if werr := writeReport(o.Out, rep); werr != nil {
				err = errors.Join(err, werr)
			}
			if perr := savePrior(o, rep); perr != nil {
				err = errors.Join(err, perr)
			}
			return rep, err
		}
		alike := res.NotStarted && startFailures(rep.Trials, res)
		if alike && len(rep.Trials) == 1 && !probed && key(prop.Point) == key(opposite(o.Space, rep.Trials[0].Config)) {
			// The second trial already shares no setting with the
			// first: it is the probe, not to be run again.
			probed = true
		}
		if res.NotStarted && (environmental(res.Error) || alike && probed) {
			// prism up did not start for a reason no configuration
			// changes (its store in use by another prism up, a folder it
			// cannot write, ONNX Runtime missing): every other trial
			// would fail alike, and the search would end in "no
			// configuration met the SLO". (One that fails for its
			// configuration, out of memory say, is recorded and the
			// search goes on.)
			rep.Trials = append(rep.Trials, TrialRecord{N: n, Config: cfg, Result: res, Secs: o.Now().Sub(t0).Seconds()})
			if err := writeReport(o.Out, rep); err != nil {
				return rep, err
			}
			why := "for a reason no configuration changes"
			if !environmental(res.Error) {
				why = "as none before it did, for the same reason, one of them sharing no setting with this one"
			}
			err := fmt.Errorf("tune: trial %d did not start, %s: %s", n, why, res.Error)
			// The trials measured before it still teach the next run.
			if perr := savePrior(o, rep); perr != nil {
				err = errors.Join(err, perr)
			}
			return rep, err
		}
		if alike && len(rep.Trials) == 1 && !probed {
			// Two did not start for one reason: a configuration that
			// shares none of the first's settings tells the machine's
			// reason from one of the settings'.
			probe = opposite(o.Space, rep.Trials[0].Config)
		}
		tr := TrialRecord{N: n, Config: cfg, Result: res, Secs: o.Now().Sub(t0).Seconds()}
		if !o.Grid {
			tr.Predicted, tr.EI = prop.Predicted, finite(prop.EI)
		}
		rep.Trials = append(rep.Trials, tr)
		s.Observe(prop.Point, res.SamplesPerS)
		if res.SamplesPerS > 0 && (rep.Best == nil || res.SamplesPerS > rep.Best.Result.SamplesPerS) {
			b := tr
			rep.Best = &b
			bestRPS = res.MaxRPS
		}
		if err := writeReport(o.Out, rep); err != nil {
			return rep, err
		}
		progressLine(o, rep, tr, limit, o.Now().Sub(began))
	}
	if err := writeReport(o.Out, rep); err != nil {
		return rep, err
	}
	return rep, savePrior(o, rep)
}

// environmentCauses are failures of prism up that no configuration
// changes: the machine's, not the trial's.
var environmentCauses = []string{"in use by another process", "address already in use", "permission denied", "read-only file system", "no space left on device"}

// startFailures says whether res and every trial before it (one at
// least) did not start, for the same reason.
func startFailures(trials []TrialRecord, res Result) bool {
	if len(trials) == 0 {
		return false
	}
	for _, t := range trials {
		if !t.Result.NotStarted || cause(t.Result.Error) != cause(res.Error) {
			return false
		}
	}
	return true
}

// opposite is the point of space farthest from configuration c in every
// dimension: each value at the other end of its dimension's list.
func opposite(space Space, c Config) Point {
	p, _ := space.Index(c)
	out := make(Point, len(space.Dims))
	for i, d := range space.Dims {
		if i < len(p) && p[i] < len(d.Values)/2 {
			out[i] = len(d.Values) - 1
		}
	}
	return out
}

// cause is a trial's error without the log it points to.
func cause(err string) string {
	if i := strings.LastIndex(err, " (see "); i >= 0 {
		return err[:i]
	}
	return err
}

// environmental says whether a trial's error is one of
// environmentCauses.
func environmental(err string) bool {
	e := strings.ToLower(err)
	for _, c := range environmentCauses {
		if strings.Contains(e, c) {
			return true
		}
	}
	return false
}

// savePrior appends the run's measured trials to the prior file (none
// without one, or before any trial measured a rate), scored against the
// best so far: a run stopped early still teaches the next one.
func savePrior(o Options, rep *Report) error {
	if o.Prior == "" || rep.Best == nil {
		return nil
	}
	if err := AppendPrior(o.Prior, priorRecords(rep, o.Now())); err != nil {
		return fmt.Errorf("tune: %w", err)
	}
	return nil
}

// lineList is line numbers for a message: "3", "3, 7", "3, 7, 9 and 12
// more".
func lineList(lines []int) string {
	const most = 3
	var parts []string
	for _, n := range lines[:min(len(lines), most)] {
		parts = append(parts, strconv.Itoa(n))
	}
	out := strings.Join(parts, ", ")
	if len(lines) > most {
		out += fmt.Sprintf(" and %d more", len(lines)-most)
	}
	return out
}

func finite(f float64) float64 {
	if f > 1e300 {
		return 0
	}
	return f
}

func priorRecords(rep *Report, now time.Time) []PriorRecord {
	var out []PriorRecord
	for _, t := range rep.Trials {
		if t.Result.NotStarted || t.Result.Error != "" && t.Result.SamplesPerS == 0 && t.Result.MaxRPS == 0 && t.Result.Steps == 0 {
			continue // never measured (prism up did not start)
		}
		out = append(out, PriorRecord{Time: now.UTC(), Model: rep.Model, Features: rep.Features, Machine: rep.Machine, Config: t.Config,
			Score: t.Result.SamplesPerS / rep.Best.Result.SamplesPerS, SamplesPerS: t.Result.SamplesPerS})
	}
	return out
}

func progressLine(o Options, rep *Report, tr TrialRecord, limit int, elapsed time.Duration) {
	res := fmt.Sprintf("%.0f samples/s (%.1f req/s, p99 %.1f ms)", tr.Result.SamplesPerS, tr.Result.MaxRPS, tr.Result.P99Ms)
	if tr.Result.LowerBound {
		res += " at least: no find-max step failed (raise --steps)"
	}
	if tr.Result.Error != "" {
		res = "failed: " + tr.Result.Error
	}
	best := "none yet"
	if rep.Best != nil {
		best = fmt.Sprintf("%.0f (trial %d)", rep.Best.Result.SamplesPerS, rep.Best.N)
	}
	n := len(rep.Trials)
	eta := time.Duration(float64(elapsed) / float64(n) * float64(limit-n)).Round(time.Second)
	etaWord := "ETA"
	if !o.Grid {
		etaWord = "ETA at most"
	}
	fmt.Fprintf(o.Progress, "trial %d/%d  %s  ->  %s  best %s  %s %v\n", n, limit, tr.Config.flags(o.Space.Flags()), res, best, etaWord, eta)
}

func spaceString(s Space) string {
	var out string
	for i, d := range s.Dims {
		if i > 0 {
			out += " x "
		}
		out += fmt.Sprintf("%s %v", d.Flag, d.Values)
	}
	return out
}

// trialLog is the name of what a trial writes into the output folder
// (ProcessTrialer's LogDir, which prism tune makes its --out): its log
// trial-NN.log and its find-max folder trial-NN.
var trialLog = regexp.MustCompile(`^trial-[0-9]+(\.log)?$`)

// keepEarlier keeps an earlier run's outputs in dir from this run's: it
// renames its tune.json, if any, after the time it was last written
// (tune-20060102T150405Z.json; -2, -3, ... after it where that is
// taken), and moves its trial logs into a folder of the same name
// (tune-20060102T150405Z/; named after the newest log's time where the
// run left no report: it stopped in its first trial). It returns their
// new paths ("" for none). A new run wrote its trial-NN.log over the
// earlier run's, which a user comparing the two lost.
func keepEarlier(dir string) (report, logs string, err error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return "", "", fmt.Errorf("tune: %w", err)
	}
	var trials []string
	var when time.Time
	for _, e := range entries {
		if !trialLog.MatchString(e.Name()) {
			continue
		}
		trials = append(trials, e.Name())
		if info, err := e.Info(); err == nil && info.ModTime().After(when) {
			when = info.ModTime()
		}
	}
	cur := filepath.Join(dir, File)
	st, err := os.Stat(cur)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return "", "", fmt.Errorf("tune: %w", err)
	}
	hasReport := err == nil
	if !hasReport && len(trials) == 0 {
		return "", "", nil
	}
	if hasReport {
		when = st.ModTime()
	}
	base := "tune-" + when.UTC().Format("20060102T150405Z")
	for i := 1; ; i++ {
		name := base
		if i > 1 {
			name = fmt.Sprintf("%s-%d", base, i)
		}
		// One name for the report and its logs, free for both.
		kept := filepath.Join(dir, name)
		if _, err := os.Lstat(kept + ".json"); err == nil {
			continue
		}
		if _, err := os.Lstat(kept); err == nil {
			continue
		}
		if hasReport {
			if err := os.Rename(cur, kept+".json"); err != nil {
				return "", "", fmt.Errorf("tune: keep the earlier report: %w", err)
			}
			report = kept + ".json"
		}
		if len(trials) > 0 {
			if err := os.Mkdir(kept, 0o755); err != nil {
				return report, "", fmt.Errorf("tune: keep the earlier trial logs: %w", err)
			}
			for _, t := range trials {
				if err := os.Rename(filepath.Join(dir, t), filepath.Join(kept, t)); err != nil {
					return report, "", fmt.Errorf("tune: keep the earlier trial logs: %w", err)
				}
			}
			logs = kept
		}
		return report, logs, nil
	}
}

func writeReport(dir string, rep *Report) error {
	buf, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return fmt.Errorf("tune: %w", err)
	}
	tmp := filepath.Join(dir, File+".tmp")
	if err := os.WriteFile(tmp, append(buf, '\n'), 0o644); err != nil {
		return fmt.Errorf("tune: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, File)); err != nil {
		return fmt.Errorf("tune: %w", err)
	}
	return nil
}

// TunedFor is the model a tune.json at path was tuned for ("" for a
// plain JSON object of flags, or a file that cannot be read: ReadConfig
// says why).
func TunedFor(path string) string {
	buf, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	var top struct {
		Model string          `json:"model"`
		Best  json.RawMessage `json:"best"`
	}
	if json.Unmarshal(buf, &top) != nil || top.Best == nil {
		return ""
	}
	return top.Model
}

// TunedOn is the machine a tune.json's trials ran on (nil: not a
// tune.json, or one of a release before machines were recorded).
func TunedOn(path string) *Machine {
	buf, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	var top struct {
		Machine *Machine `json:"machine"`
	}
	if json.Unmarshal(buf, &top) != nil {
		return nil
	}
	return top.Machine
}

// ReadConfig reads the configuration prism up --config takes: the best
// configuration of a tune.json, or a JSON object of prism up flags to
// values (strings, numbers or booleans).
func ReadConfig(path string) (Config, error) {
	buf, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(buf, &top); err != nil {
		return nil, fmt.Errorf("read config %q: %w", path, err)
	}
	if best, ok := top["best"]; ok {
		var b struct {
			Config map[string]json.RawMessage `json:"config"`
		}
		if err := json.Unmarshal(best, &b); err != nil || b.Config == nil {
			return nil, fmt.Errorf("read config %q: tune.json without a best configuration (did every trial fail?)", path)
		}
		top = b.Config
	}
	c := Config{}
	for k, raw := range top {
		var v any
		if err := json.Unmarshal(raw, &v); err != nil {
			return nil, fmt.Errorf("read config %q: %s: %w", path, k, err)
		}
		switch x := v.(type) {
		case string:
			c[k] = x
		case float64:
			c[k] = string(raw)
			// A whole number written as a float (1e3, 1000.0: what
			// a JSON writer may make of a count) in the form an
			// integer flag reads.
			if strings.ContainsAny(c[k], ".eE") && x == math.Trunc(x) && math.Abs(x) < 1<<53 {
				c[k] = strconv.FormatFloat(x, 'f', -1, 64)
			}
		case bool:
			c[k] = fmt.Sprint(x)
		default:
			return nil, fmt.Errorf("read config %q: %s: want a string, number or boolean, got %s", path, k, raw)
		}
	}
	return c, nil
}

// lockFile is the file in a run's folder that its run holds locked.
const lockFile = ".tune.lock"

// lockOut takes dir's lock for this run (flock, released when the
// process ends however it ends), or says which folder another prism tune
// holds.
func lockOut(dir string) (unlock func(), err error) {
	p := filepath.Join(dir, lockFile)
	f, err := os.OpenFile(p, os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return nil, fmt.Errorf("tune: lock %s: %w", p, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("tune: --out %s is in use by another prism tune (it holds %s): give this one another --out", dir, lockFile)
		}
		return nil, fmt.Errorf("tune: lock %s: %w", p, err)
	}
	return func() { f.Close() }, nil
}
