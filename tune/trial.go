package tune

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/prism-serve/prism/internal/readyline"
	"github.com/prism-serve/prism/internal/supervise"
	"github.com/prism-serve/prism/loadgen"
)

// Result is one trial's measurement.
type Result struct {
	// MaxRPS is the highest rate (requests/s) whose p99 met the SLO;
	// SamplesPerS and P99Ms are that step's answered samples/s and p99.
	MaxRPS      float64 `json:"max_rps"`
	SamplesPerS float64 `json:"samples_per_s"`
	P99Ms       float64 `json:"p99_ms"`
	// Steps are the find-max steps run.
	Steps int `json:"steps"`
	// Error, when set, says why the trial has no result.
	Error string `json:"error,omitempty"`
	// NotStarted says prism up did not start (Error says why): nothing
	// was measured.
	NotStarted bool `json:"not_started,omitempty"`
	// LowerBound says no find-max step failed within its step limit:
	// MaxRPS is the highest rate tried, not the highest that meets the
	// SLO (raise prism tune --steps).
	LowerBound bool `json:"lower_bound,omitempty"`
}

// Trialer measures one configuration.
type Trialer interface {
	Trial(ctx context.Context, n int, c Config, startRPS float64) (Result, error)
}

// ProcessTrialer runs each trial as processes of the prism binary:
// prism up with the configuration (its ready line read through the
// supervisor), then prism loadgen --find-max against it, then stops
// prism up.
type ProcessTrialer struct {
	// Exe is the prism binary.
	Exe string
	// Plan, DB, Certs (or Insecure) and the model's name are passed to
	// prism up and prism loadgen.
	Plan, DB, Certs string
	Insecure        bool
	Model           string
	// Candidates per request ("270"), Pool requests built before the
	// clock starts, Timeout each request's deadline.
	Candidates string
	Pool       int
	Timeout    time.Duration
	// SLO is the p99 bound; Step each find-max step's length; Tolerance
	// its relative precision.
	SLO       time.Duration
	Step      time.Duration
	Tolerance float64
	// MaxSteps bounds the find-max steps of one trial (0: loadgen's).
	MaxSteps int
	// LogDir gets trial-N.log (prism up's and loadgen's output) and the
	// find-max result of each trial.
	LogDir string
	// ReadyTimeout bounds prism up's start.
	ReadyTimeout time.Duration
}

func (t *ProcessTrialer) tls() []string {
	if t.Insecure {
		return []string{"--insecure"}
	}
	return []string{"--certs", t.Certs}
}

// UpArgs are prism up's arguments for configuration c (its flags in
// sorted order).
func (t *ProcessTrialer) UpArgs(c Config) []string {
	args := append([]string{"up", "--model", t.Plan, "--db", t.DB, "--addr", "127.0.0.1:0"}, t.tls()...)
	return append(args, FlagArgs(c)...)
}

// FlagArgs are c's flags as command-line arguments, in sorted order.
func FlagArgs(c Config) []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	args := make([]string, 0, len(keys))
	for _, k := range keys {
		args = append(args, "--"+k+"="+c[k])
	}
	return args
}

// Trial runs trial n.
func (t *ProcessTrialer) Trial(ctx context.Context, n int, c Config, startRPS float64) (Result, error) {
	logPath := filepath.Join(t.LogDir, fmt.Sprintf("trial-%02d.log", n))
	logf, err := os.Create(logPath)
	if err != nil {
		return Result{}, fmt.Errorf("trial %d: %w", n, err)
	}
	defer logf.Close()
	// An *os.File is safe for the supervisor's concurrent writers.
	log := logf
	sup := supervise.New(supervise.Options{
		Starter: &supervise.Exec{Path: t.Exe, Stderr: log},
		Stdout:  log,
		Grace:   20 * time.Second,
	})
	defer sup.Shutdown()
	up := &supervise.Child{Name: "up", Ready: readyline.Up, Args: t.UpArgs(c)}
	// The ready timeout ends the start through its context, not the
	// supervisor's timeout, which kills the process: prism up, stopped
	// by the deferred Shutdown with SIGTERM instead, stops its own
	// children (killed, it left them holding the store and the update
	// log, and the next trial's prism up failed on their locks).
	startCtx, cancel := context.WithTimeout(ctx, t.ReadyTimeout)
	addr, err := sup.Start(startCtx, up, 0)
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return Result{}, ctx.Err()
		}
		if errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("up not ready after %s", t.ReadyTimeout)
		}
		return Result{NotStarted: true, Error: fmt.Sprintf("prism up: %s%s (see %s)",
			strings.TrimSuffix(err.Error(), " (see its log above)"), lastErrorLine(logPath), logPath)}, nil
	}
	fmDir := filepath.Join(t.LogDir, fmt.Sprintf("trial-%02d", n))
	args := append([]string{"loadgen", "--target", addr, "--model", t.Model, "--plan", t.Plan,
		"--candidates", t.Candidates, "--pool", fmt.Sprint(t.Pool), "--timeout", t.Timeout.String(), "--quiet",
		"--find-max", "--rate", fmt.Sprintf("%.1f", startRPS), "--slo", t.SLO.String(),
		"--find-max-trial", t.Step.String(), "--find-max-tolerance", fmt.Sprint(t.Tolerance), "--out", fmDir}, t.tls()...)
	if t.MaxSteps > 0 {
		args = append(args, "--find-max-trials", fmt.Sprint(t.MaxSteps))
	}
	cmd := exec.CommandContext(ctx, t.Exe, args...)
	cmd.Stdout, cmd.Stderr = log, log
	// Tied to tune's life as prism up is (supervise.Exec): tune killed
	// outright (SIGKILL, the OOM killer) left the load generator running
	// its remaining find-max steps (49 s measured) against a stack that
	// was gone, writing its result into a folder no run owned.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	fmt.Fprintf(log, "[tune] %s %v\n", t.Exe, args)
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			return Result{}, ctx.Err()
		}
		return Result{Error: fmt.Sprintf("prism loadgen: %v (see %s)", err, logPath)}, nil
	}
	return readFindMax(filepath.Join(fmDir, "findmax.json"))
}

// readFindMax turns loadgen's findmax.json into a Result.
func readFindMax(path string) (Result, error) {
	buf, err := os.ReadFile(path)
	if err != nil {
		return Result{}, fmt.Errorf("read find-max result: %w", err)
	}
	var fm loadgen.FindMaxResult
	if err := json.Unmarshal(buf, &fm); err != nil {
		return Result{}, fmt.Errorf("read find-max result %q: %w", path, err)
	}
	r := Result{MaxRPS: fm.MaxRate, Steps: len(fm.Trials), LowerBound: len(fm.Trials) > 0}
	for _, tr := range fm.Trials {
		if !tr.Pass {
			r.LowerBound = false
		}
		if tr.Pass && tr.Rate == fm.MaxRate && tr.Summary != nil {
			r.SamplesPerS = tr.Summary.SamplesPS
			r.P99Ms = tr.Summary.Latency["p99"]
		}
	}
	if r.MaxRPS == 0 {
		r.Error = "no find-max step met the SLO"
	}
	return r, nil
}

// lastErrorLine is ": " and the last line of the log at path in which
// a prism process said why it stopped ("prism: ...", a child's tagged
// "[router] prism: ..."), or "" when there is none: the cause of a
// prism up that did not start, which its own error leaves to the log.
func lastErrorLine(path string) string {
	buf, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(buf), "\n"), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		l := strings.TrimSpace(lines[i])
		if _, msg, ok := strings.Cut(l, "prism: "); ok && !strings.Contains(msg, "exited before it was ready") {
			if len(l) > 300 {
				l = l[:300] + "..."
			}
			return ": " + l
		}
	}
	return ""
}
