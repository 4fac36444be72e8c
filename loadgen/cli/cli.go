// Package cli is the `prism loadgen` command: flags, the model's inputs
// from a preset, a plan or an ONNX file, and the gRPC connection around
// the loadgen core. It lives apart from loadgen so the core depends on
// the public API and the model zoo only.
package cli

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/internal/atomicfile"
	"github.com/prism-serve/prism/internal/auth"
	"github.com/prism-serve/prism/internal/auth/authflag"
	"github.com/prism-serve/prism/internal/flagval"
	pb "github.com/prism-serve/prism/internal/onnxpb"
	"github.com/prism-serve/prism/internal/progress"
	"github.com/prism-serve/prism/loadgen"
	"github.com/prism-serve/prism/models"
	"github.com/prism-serve/prism/plan"
)

type flags struct {
	watchBorrowed                        string
	target, model, preset, planDir, onnx string
	// httpURL is --target's HTTP/JSON endpoint when it is an http:// or
	// https:// URL (httpTarget); "" for a gRPC target.
	httpURL string
	// modelArgs and planArgs are --model's and --plan's values as given;
	// mix is the models parsed from them (model is its one model's name,
	// planDir the one plan, when there is one).
	modelArgs, planArgs []string
	mix                 loadgen.Mix
	context             []string
	expandContext       bool
	fake                bool
	pool                int

	arrival string
	rate    float64
	clients int

	trace                    string
	traceSpeedup, traceScale float64
	tracePeak                float64
	traceCount               bool
	traceWindow              time.Duration
	traceKey                 string
	promo                    loadgen.Promotion
	promoZero                map[string]bool // promo-at, -ramp, -plateau, -decay given as 0
	duration                 time.Duration
	maxRequests              int64
	candidates, criteo       string
	zipf                     float64
	seed, stream             uint64
	slo, timeout             time.Duration
	maxInFlight              int
	findMax                  bool
	findMaxTrial             time.Duration
	findMaxTolerance         float64
	findMaxTrials            int
	findMaxWarmUp            time.Duration
	out                      string
	quiet                    bool
	tls                      authflag.Flags
	tokenFile                string
	printRequests            int

	retries         int
	retryBackoff    time.Duration
	retryMaxBackoff time.Duration
	retryPushback   bool
	retryMode       string
	retryThrottling string

	updateRate    float64
	updateClients int
	updateRows    int
	updateTables  []string
	updateOnly    bool
	traceRatio    float64
}

// updates says whether the run sends an update stream.
func (f *flags) updates() bool { return f.updateRate > 0 || f.updateClients > 0 }

// mixed says whether the run's requests go to several models.
func (f *flags) mixed() bool { return len(f.mix) > 1 }

// New returns the loadgen command.
func New() *cobra.Command {
	var f flags
	cmd := &cobra.Command{
		Use:   "loadgen --target ADDR --model NAME[=WEIGHT,NAME=WEIGHT...] [flags]",
		Short: "Offer open-loop Recommend traffic (Poisson, promotion spikes, trace replay) and report latency free of coordinated omission",
		Long: `loadgen sends Recommend requests to a router (or any Recommender) and
measures every latency from the request's intended send time, so a server
that stalls cannot hide its queueing. Arrivals are open loop: constant,
poisson, promotion (a compressed day with a peak-to-valley of 6.5 and a
1.3x promotion spike; --rate is the normal daily peak) or trace (a CSV of
timestamp and rate or count, replayed --trace-speedup times faster).
--clients N runs closed loop instead; --find-max searches the highest rate
whose p99 meets --slo. Every run stops by itself after --duration or
--max-requests. The model's inputs come from --model-preset, --plan or
--onnx (default: the preset named by --model).

--model a=0.7,b=0.3 (or --model a=7 --model b=3) sends a mix of models:
one arrival process at --rate in total, each request going to a model
drawn by its share (reproducibly, from --seed and --stream), built as a
run of that model alone builds its requests. Each model's inputs come
from its --plan DIR (given once per model, matched by the model the plan
serves) or from the zoo preset of its name. The report adds each model's
requests, errors, latency and SLO attainment to the totals; --find-max
searches the highest total rate at the mix at which every model's p99
meets --slo, and names the model that bounds it.

--update-rate (or --update-clients) adds a stream of online embedding
updates (Embeddings/Update) beside the requests, as a trainer pushing
fresh rows does: --update-rows rows an update, of the plan's tables in
turn (--plan gives their names, rows and widths), ids skewed like the
lookups (--zipf). Its report (acknowledged updates, rows/s, latency
from each update's intended send time) follows the requests'; with
--update-only the run sends updates alone. --retries retries an update
refused with ResourceExhausted (the router's update queue full) or
Unavailable (its start-up window, no embedding worker right now) as it
retries a request, the same update each time, and counts its attempts
in the update report.

--target https://HOST:PORT (the router's --http-addr; http:// with
--insecure) sends the requests over HTTP/JSON instead, POST
/v1/recommend with the request in protojson (the pool's requests
encoded before the run), each request's deadline in X-Prism-Timeout;
an error answer is read back as the gRPC code its JSON names (by its
HTTP status when the body is not the router's JSON), so the report,
--retries (with X-Prism-Retry-Pushback-Ms as the pushback) and
--find-max read it as over gRPC.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// Values whose zero the libraries read as "the default": typed
			// as 0 on the command line they are refused, not replaced.
			if err := flagval.Positive(cmd.Flags(), "timeout", "zipf", "rate", "slo", "duration", "trace-speedup", "promo-spike", "promo-peak-to-valley", "promo-day",
				"max-inflight", "find-max-trial", "find-max-trials", "find-max-tolerance"); err != nil {
				return err
			}
			if err := flagval.NonNegative(cmd.Flags(), "trace-peak", "trace-scale", "trace-window", "update-rate", "update-clients"); err != nil {
				return err
			}
			if err := flagval.Positive(cmd.Flags(), "update-rows"); err != nil {
				return err
			}
			// The run's own checks named no flag ("clients must not be
			// negative", "the run needs a positive request cap").
			if err := flagval.Positive(cmd.Flags(), "max-requests"); err != nil {
				return err
			}
			if err := flagval.NonNegative(cmd.Flags(), "clients"); err != nil {
				return err
			}
			if len(f.modelArgs) > 0 {
				mix, err := loadgen.ParseMix(f.modelArgs)
				if err != nil {
					return err
				}
				f.mix = mix
				if len(mix) == 1 {
					f.model = mix[0].Name
				}
			}
			switch {
			case len(f.planArgs) == 1:
				f.planDir = f.planArgs[0]
			case len(f.planArgs) > 1 && !f.mixed():
				return fmt.Errorf("--plan is given %d times for one model: give the plan of the model --model names, once", len(f.planArgs))
			}
			if err := checkMixFlags(cmd, &f); err != nil {
				return err
			}
			if err := checkUpdateFlags(cmd, &f); err != nil {
				return err
			}
			if err := checkRetryFlags(cmd, &f); err != nil {
				return err
			}
			if err := checkTraceRatio(cmd, &f); err != nil {
				return err
			}
			if err := checkHTTPFlags(cmd, &f); err != nil {
				return err
			}
			if f.trace != "" && f.arrival != "trace" {
				if cmd.Flags().Changed("arrival") {
					return fmt.Errorf("--trace is replayed only with --arrival trace, not --arrival %s", f.arrival)
				}
				f.arrival = "trace" // --trace alone: replay it
			}
			// Shape flags of another arrival are refused, not ignored: a
			// trace replayed with --promo-spike 3 ran without the spike.
			for _, s := range []struct {
				arrival string
				flags   []string
			}{
				{"promotion", []string{"promo-at", "promo-day", "promo-decay", "promo-peak-to-valley", "promo-plateau", "promo-ramp", "promo-spike"}},
				{"trace", []string{"trace-count", "trace-key", "trace-peak", "trace-scale", "trace-speedup", "trace-window"}},
			} {
				for _, name := range s.flags {
					if cmd.Flags().Changed(name) && f.arrival != s.arrival {
						return fmt.Errorf("--%s shapes only --arrival %s, not --arrival %s: the run would ignore it", name, s.arrival, f.arrival)
					}
				}
			}
			// A closed loop has no arrival process: each of --clients
			// sends its next request when its last is answered. An open
			// loop's flags are refused with it, not ignored: --clients 4
			// --arrival promotion ran flat. (--find-max refuses --clients.)
			if f.clients > 0 && !f.findMax {
				for _, name := range []string{"arrival", "trace", "rate", "max-inflight"} {
					if cmd.Flags().Changed(name) {
						return fmt.Errorf("--%s shapes only an open-loop run; --clients %d runs closed loop (each client sends its next request when its last is answered): leave out one of them", name, f.clients)
					}
				}
			}
			// A promotion's times given as 0 are meant: --promo-at 0 starts
			// the ramp with the run, --promo-ramp 0 is a step. Read as
			// unset, each became its default share of the day.
			f.promoZero = map[string]bool{}
			for _, name := range []string{"promo-at", "promo-ramp", "promo-plateau", "promo-decay"} {
				if d, err := cmd.Flags().GetDuration(name); err == nil && d == 0 && cmd.Flags().Changed(name) {
					f.promoZero[name] = true
				}
			}
			if f.pool < 0 {
				return fmt.Errorf("--pool %d: want 0 (draw every request during the run) or more", f.pool)
			}
			// SIGTERM (a container stopped, kill, a timeout) as Ctrl-C:
			// the run stops and its partial result is written.
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return run(ctx, cmd.OutOrStdout(), cmd.ErrOrStderr(), f)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&f.target, "target", "", "address of the Recommender: HOST:PORT (gRPC), or the router's HTTP/JSON endpoint as a URL, https://HOST:PORT (http:// with --insecure; the path /v1/recommend may be given)")
	fl.StringArrayVar(&f.modelArgs, "model", nil, "model name sent in requests; a mix of models as NAME=WEIGHT,NAME=WEIGHT... (or repeated), each request going to a model by its share of the weights")
	fl.StringVar(&f.preset, "model-preset", "", "take the model's inputs from this zoo preset (default: --model, when it names one)")
	fl.StringArrayVar(&f.planArgs, "plan", nil, "take the model's inputs from this plan folder (a mix of models: once per model, each plan for the model it serves)")
	fl.StringVar(&f.onnx, "onnx", "", "take the model's inputs from this ONNX file")
	fl.StringSliceVar(&f.context, "context-inputs", nil, "inputs sent once per request as the user context (default: all per candidate)")
	fl.BoolVar(&f.expandContext, "expand-context", false, "send the --context-inputs per candidate, each candidate repeating the request's context values: the same requests without the user context")
	fl.IntVar(&f.pool, "pool", 0, "build this many requests before the run and cycle through them (0: draw every request during the run)")
	fl.BoolVar(&f.fake, "fake", false, "benchmark the generator itself: target an in-process Recommender that answers at once with zero scores (not a model)")
	fl.StringVar(&f.arrival, "arrival", "poisson", "arrival process: constant, poisson, promotion or trace")
	fl.Float64Var(&f.rate, "rate", 100, "requests/s (promotion: the normal daily peak; find-max: the first rate tried)")
	fl.IntVar(&f.clients, "clients", 0, "run closed loop with this many clients instead of open loop (not with --arrival, --trace, --rate or --max-inflight)")
	fl.StringVar(&f.trace, "trace", "", "rate trace CSV for --arrival trace (header with timestamp and value columns)")
	fl.Float64Var(&f.traceSpeedup, "trace-speedup", 60, "trace time compression: trace seconds per run second")
	fl.Float64Var(&f.traceScale, "trace-scale", 1, "multiply the trace's rates by this")
	fl.Float64Var(&f.tracePeak, "trace-peak", 0, "scale the trace so its peak is this many requests/s (overrides --trace-scale)")
	fl.BoolVar(&f.traceCount, "trace-count", false, "the trace's values are counts per row, not rates (implied by a value column named count)")
	fl.DurationVar(&f.traceWindow, "trace-window", 0, "trace window to sum rows over (default: the smallest time step)")
	fl.StringVar(&f.traceKey, "trace-key", "", `trace column naming each row's source (container): within a window a source's rates are averaged, then the sources summed (default: the first of container_ip, container, instance, pod the header has; "none": every row summed)`)
	fl.Float64Var(&f.promo.PeakToValley, "promo-peak-to-valley", 6.5, "promotion: daily peak over valley")
	fl.Float64Var(&f.promo.Spike, "promo-spike", 1.3, "promotion: spike over the normal peak")
	fl.DurationVar(&f.promo.Day, "promo-day", 0, "promotion: length of the compressed day (default --duration)")
	fl.DurationVar(&f.promo.At, "promo-at", 0, "promotion: start of the ramp (default 0.45 day; 0: at the run's start)")
	fl.DurationVar(&f.promo.Ramp, "promo-ramp", 0, "promotion: ramp length (default 0.05 day; 0: a step)")
	fl.DurationVar(&f.promo.Plateau, "promo-plateau", 0, "promotion: plateau length (default 0.1 day)")
	fl.DurationVar(&f.promo.Decay, "promo-decay", 0, "promotion: decay length (default 0.1 day; 0: a step down)")
	fl.DurationVar(&f.duration, "duration", 30*time.Second, "how long to send (each find-max trial: --find-max-trial)")
	fl.Int64Var(&f.maxRequests, "max-requests", 1_000_000, "stop after this many requests")
	fl.StringVar(&f.candidates, "candidates", "dlrmv2", "candidates per request: N, uniform:MIN-MAX or dlrmv2 (100-700, mean 270)")
	fl.StringVar(&f.criteo, "criteo", "", "replay rows of this Criteo file instead of synthetic samples")
	fl.Float64Var(&f.zipf, "zipf", 1.05, "Zipf exponent of synthetic ids per table")
	fl.Uint64Var(&f.seed, "seed", 1, "seed of which ids are popular and, with --stream, of the arrival schedule")
	fl.Uint64Var(&f.stream, "stream", 0, "sequence of synthetic requests to send, among those of --seed's popular ids (0: a new one each run, printed; give it to send a run's requests again)")
	fl.DurationVar(&f.slo, "slo", 60*time.Millisecond, "latency SLO (p99 bound for --find-max; attainment in the summary)")
	fl.DurationVar(&f.timeout, "timeout", 10*time.Second, "deadline of each request")
	fl.IntVar(&f.maxInFlight, "max-inflight", 10000, "requests awaiting an answer at most (open loop)")
	fl.BoolVar(&f.findMax, "find-max", false, "search the highest rate whose p99 meets --slo (Poisson trials at constant rates; not with another --arrival)")
	fl.DurationVar(&f.findMaxTrial, "find-max-trial", 10*time.Second, "duration of each find-max trial")
	fl.Float64Var(&f.findMaxTolerance, "find-max-tolerance", 0.05, "stop the search when pass and fail rates are this close (relative)")
	fl.IntVar(&f.findMaxTrials, "find-max-trials", 12, "at most this many find-max trials")
	fl.DurationVar(&f.findMaxWarmUp, "find-max-warmup", 3*time.Second, "before the first find-max trial, send at --rate for this long, not judged (a fresh server's first requests pay for connections, ONNX Runtime's first runs and the router's admission estimate); 0: none")
	fl.StringVar(&f.watchBorrowed, "watch-borrowed", "", "sample the borrowed dense workers every second from this /metrics URL (prism up --loan's controller) into the report")
	fl.StringVar(&f.out, "out", "", "write summary.json, timeseries.csv and plot.png into this folder (--find-max: findmax.json and the best trial's report)")
	fl.BoolVar(&f.quiet, "quiet", false, "no live status lines")
	fl.IntVar(&f.printRequests, "print-request", 0, "write this many requests as JSON to stdout and exit without sending: one request as an object (grpcurl -d @ and ghz --data-file take it), more as an array (ghz --data-file sends them in turn); --candidates, --seed, --stream and the input flags apply")
	fl.StringVar(&f.tokenFile, "auth-token-file", "", "send the bearer token in this file with every request (the router's --auth-token-file); with --tls-ca alone, no certificate is presented")
	fl.IntVar(&f.retries, "retries", 0, "retry a request (and an update of the update stream) refused with ResourceExhausted or Unavailable up to this many times after its first attempt, while its deadline (--timeout, from the first attempt) allows, as retrying clients do; latency stays from the first attempt's intended send time, and the report counts attempts per request and attempts/s")
	fl.DurationVar(&f.retryBackoff, "retry-backoff", 10*time.Millisecond, "backoff before the first retry; each next one doubles (at most --retry-max-backoff), jittered by 0.8-1.2 as grpc-go's")
	fl.DurationVar(&f.retryMaxBackoff, "retry-max-backoff", time.Second, "longest backoff between retries")
	fl.BoolVar(&f.retryPushback, "retry-pushback", true, "honour the server's grpc-retry-pushback-ms as grpc-go does (retry after it; negative: do not retry); false: retry on the backoff alone, as a retry loop that reads no trailer")
	fl.StringVar(&f.retryMode, "retry-mode", "loadgen", `who retries: "loadgen" (a retry loop around each call, in the generator) or "grpc" (grpc-go itself, from a service config's retryPolicy, at most 5 attempts; attempts counted by a stats handler)`)
	fl.StringVar(&f.retryThrottling, "retry-throttling", "", `with --retry-mode grpc: the service config's retryThrottling as MAX_TOKENS,TOKEN_RATIO (e.g. 10,0.1)`)
	fl.Float64Var(&f.updateRate, "update-rate", 0, "also send embedding updates at this many updates/s (Poisson, open loop; needs --plan for the tables)")
	fl.IntVar(&f.updateClients, "update-clients", 0, "also send embedding updates closed loop from this many clients, each sending its next update when its last is acknowledged (not with --update-rate)")
	fl.IntVar(&f.updateRows, "update-rows", 64, "rows each update upserts")
	fl.StringSliceVar(&f.updateTables, "update-tables", nil, "tables to update, in turn (default: every table of the plan)")
	fl.BoolVar(&f.updateOnly, "update-only", false, "send the update stream alone, no Recommend requests")
	fl.Float64Var(&f.traceRatio, "trace-ratio", 0, "send a W3C trace context (traceparent) with every request, sampled for this share of them (0 to 1), so that servers that follow the caller's sampling decision (Prism's tiers with tracing on) trace that share; the report names the slowest sampled requests' trace ids")
	f.tls.Register(cmd, auth.Admin)
	return cmd
}

// checkMixFlags refuses, with a mix of models, the flags that give one
// model's inputs or act on one model. --print-request prints the mix's
// requests; --candidates, --context-inputs, --expand-context, --criteo,
// --pool, --seed and --stream apply to each model's requests as to one
// model's (--pool N: N requests per model).
func checkMixFlags(cmd *cobra.Command, f *flags) error {
	if !f.mixed() {
		return nil
	}
	changed := cmd.Flags().Changed
	for _, name := range []string{"model-preset", "onnx"} {
		if changed(name) {
			return fmt.Errorf("loadgen: --%s gives one model's inputs; with a mix of models (--model %s) each model's inputs come from its --plan DIR (once per model) or from the zoo preset of its name", name, f.mix)
		}
	}
	for _, name := range []string{"update-rate", "update-clients", "update-only", "update-rows", "update-tables"} {
		if changed(name) {
			return fmt.Errorf("loadgen: --%s: the update stream writes one model's tables (its --plan); with a mix of models (--model %s) run it in a run of its own, --model NAME --plan DIR", name, f.mix)
		}
	}
	return nil
}

// checkUpdateFlags refuses update-stream flags that would be ignored or
// contradict each other.
func checkUpdateFlags(cmd *cobra.Command, f *flags) error {
	changed := cmd.Flags().Changed
	if f.updateRate > 0 && f.updateClients > 0 {
		return errors.New("loadgen: give one of --update-rate (open loop) and --update-clients (closed loop)")
	}
	if !f.updates() {
		for _, name := range []string{"update-rows", "update-tables", "update-only"} {
			if changed(name) {
				return fmt.Errorf("--%s shapes the update stream, which only --update-rate or --update-clients starts: the run would send no update", name)
			}
		}
		return nil
	}
	switch {
	case f.planDir == "":
		return errors.New("loadgen: the update stream takes its tables (names, rows, widths) from plan.json: give --plan DIR (prism partition's folder, or the plan folder prism up serves)")
	case f.findMax:
		return errors.New("loadgen: --find-max searches the Recommend rate alone; run the update stream in a run of its own (leave out --update-rate and --update-clients)")
	case f.printRequests > 0:
		return errors.New("loadgen: --print-request prints Recommend requests, not updates; leave out --update-rate and --update-clients")
	}
	if f.updateOnly {
		for _, name := range []string{"rate", "arrival", "trace", "clients", "candidates", "criteo", "context-inputs", "expand-context", "pool", "max-inflight", "watch-borrowed"} {
			if changed(name) {
				return fmt.Errorf("--%s shapes the Recommend requests, which --update-only does not send: leave out one of them", name)
			}
		}
	}
	return nil
}

// checkTraceRatio refuses a --trace-ratio out of range or with a run
// that sends no plain Recommend run.
func checkTraceRatio(cmd *cobra.Command, f *flags) error {
	if !cmd.Flags().Changed("trace-ratio") {
		return nil
	}
	switch {
	case !(f.traceRatio >= 0 && f.traceRatio <= 1):
		return fmt.Errorf("--trace-ratio %g: want a share from 0 to 1", f.traceRatio)
	case f.updateOnly:
		return errors.New("loadgen: --trace-ratio traces Recommend requests, which --update-only does not send")
	case f.findMax:
		return errors.New("loadgen: --trace-ratio traces a run's requests; --find-max reports rates, not requests: trace a run at the rate it found")
	case f.printRequests > 0:
		return errors.New("loadgen: --print-request sends nothing: leave out --trace-ratio")
	}
	return nil
}

// httpTarget reads --target: an http:// or https:// URL is the router's
// HTTP/JSON endpoint, returned as the URL to POST to (its path empty,
// "/", or ending in /v1/recommend, as behind a proxy that mounts it
// under a prefix); anything else is a gRPC target, as before (HOST:PORT,
// or a gRPC name such as dns:///HOST:PORT), and "" is returned.
func httpTarget(target string) (string, error) {
	scheme, _, ok := strings.Cut(target, "://")
	if !ok || !strings.EqualFold(scheme, "http") && !strings.EqualFold(scheme, "https") {
		return "", nil
	}
	u, err := url.Parse(target)
	switch {
	case err != nil:
		return "", fmt.Errorf("loadgen: --target %q: %w", target, err)
	case u.Hostname() == "":
		return "", fmt.Errorf("loadgen: --target %q: no host: want %s://HOST:PORT", target, u.Scheme)
	case u.User != nil:
		// In the URL it would be printed in every report line.
		return "", fmt.Errorf("loadgen: --target %q: no credentials in the URL: give --auth-token-file FILE (the bearer token) or --certs DIR", u.Redacted())
	case u.Fragment != "":
		return "", fmt.Errorf("loadgen: --target %q: a URL with a fragment", target)
	}
	u.Scheme = strings.ToLower(u.Scheme)
	switch {
	case u.Path == "" || u.Path == "/":
		u.Path = loadgen.RecommendPath
	case !strings.HasSuffix(u.Path, loadgen.RecommendPath):
		return "", fmt.Errorf("loadgen: --target %q: the path %q is not the router's HTTP/JSON Recommend: give %s://HOST:PORT or %s://HOST:PORT%s", target, u.Path, u.Scheme, u.Scheme, loadgen.RecommendPath)
	}
	return u.String(), nil
}

// checkHTTPFlags reads an HTTP/JSON --target (f.httpURL) and refuses the
// flags that do not apply over HTTP/JSON: the update stream (the
// Embeddings service is gRPC's alone) and grpc-go's own retries.
// loadgen has no RecommendStream mode to refuse: every request is a
// unary Recommend, over either transport.
func checkHTTPFlags(cmd *cobra.Command, f *flags) error {
	u, err := httpTarget(f.target)
	if err != nil || u == "" {
		return err
	}
	f.httpURL = u
	changed := cmd.Flags().Changed
	for _, name := range []string{"update-rate", "update-clients", "update-only", "update-rows", "update-tables"} {
		if changed(name) {
			return fmt.Errorf("loadgen: --%s: the update stream is the Embeddings service's, which the router serves over gRPC alone, not HTTP/JSON: send it in a run of its own to the router's gRPC address (--target HOST:PORT)", name)
		}
	}
	if f.retryMode == "grpc" {
		return errors.New("loadgen: --retry-mode grpc is grpc-go's own retries, which an HTTP/JSON --target does not use: leave it out (the generator's retry loop, --retry-mode loadgen, retries over HTTP/JSON with the router's X-Prism-Retry-Pushback-Ms)")
	}
	return nil
}

// httpSender is the sender of an HTTP/JSON --target: HTTPS with the
// admin certificate (--certs, or --tls-*), or the CA alone and the
// bearer token; plain HTTP with --insecure.
func httpSender(stderr io.Writer, f flags) (loadgen.Sender, error) {
	secure := strings.HasPrefix(f.httpURL, "https://")
	switch {
	case secure && f.tls.Insecure:
		return nil, fmt.Errorf("loadgen: --target %s is HTTPS; --insecure is plain HTTP: give http://HOST:PORT with --insecure (a router started with --insecure), or leave --insecure out and give --certs DIR", f.target)
	case !secure && !f.tls.Insecure:
		return nil, fmt.Errorf("loadgen: --target %s is plain HTTP, which only a router started with --insecure serves: give https://HOST:PORT with --certs DIR, or --insecure", f.target)
	}
	var tlsConf *tls.Config
	if secure {
		files, _, err := f.tls.Files(auth.Admin, f.tokenFile != "")
		if err != nil {
			return nil, fmt.Errorf("loadgen: %w", err)
		}
		if err := auth.CheckFiles(files); err != nil {
			return nil, fmt.Errorf("loadgen: %w", err)
		}
		// The load goes to the router only, as over gRPC: a server
		// whose certificate is not the router's does not get the
		// requests (or the token).
		if tlsConf, err = auth.ClientTLS(files, auth.Router); err != nil {
			return nil, fmt.Errorf("loadgen: %w", err)
		}
		f.tls.WarnClient(stderr, "loadgen")
	} else {
		fmt.Fprintln(stderr, "prism: warning: --insecure: loadgen sends plain HTTP: what it sends and receives crosses the network unencrypted, to a server it does not authenticate")
	}
	header := http.Header{}
	if f.tokenFile != "" {
		token, err := auth.ReadToken(f.tokenFile)
		if err != nil {
			return nil, fmt.Errorf("loadgen: --auth-token-file: %w", err)
		}
		if w := auth.TokenModeWarning(f.tokenFile); w != "" {
			fmt.Fprintf(stderr, "prism: warning: %s\n", w)
		}
		header.Set("Authorization", "Bearer "+token)
	}
	// Over HTTP/1.1 (plain HTTP) a request in flight holds a connection:
	// keep as many idle as the run has clients, or may have requests
	// out. Over HTTP/2 they share one, as gRPC's calls do.
	conns := f.clients
	if conns == 0 {
		conns = min(f.maxInFlight, 1024)
	}
	return loadgen.HTTPSender{URL: f.httpURL, Client: loadgen.NewHTTPClient(tlsConf, conns), Header: header}, nil
}

// checkRetryFlags refuses retry flags that would be ignored or
// contradict each other.
func checkRetryFlags(cmd *cobra.Command, f *flags) error {
	changed := cmd.Flags().Changed
	if f.retries < 0 {
		return fmt.Errorf("--retries %d: want 0 (no retry) or more", f.retries)
	}
	if f.retries == 0 {
		for _, name := range []string{"retry-backoff", "retry-max-backoff", "retry-pushback", "retry-mode", "retry-throttling"} {
			if changed(name) {
				return fmt.Errorf("--%s shapes the retries, which only --retries N (N > 0) makes: the run would not retry", name)
			}
		}
		return nil
	}
	if f.retryBackoff <= 0 || f.retryMaxBackoff <= 0 {
		return errors.New("loadgen: --retry-backoff and --retry-max-backoff must be positive")
	}
	switch f.retryMode {
	case "loadgen":
		if changed("retry-throttling") {
			return errors.New("loadgen: --retry-throttling is grpc-go's retryThrottling: give it with --retry-mode grpc")
		}
	case "grpc":
		if f.retries > 4 {
			return fmt.Errorf("loadgen: --retries %d with --retry-mode grpc: grpc-go makes at most 5 attempts (4 retries)", f.retries)
		}
		if changed("retry-pushback") {
			return errors.New("loadgen: --retry-pushback is the generator's retry loop's; grpc-go always honours the pushback (--retry-mode loadgen)")
		}
	default:
		return fmt.Errorf("loadgen: --retry-mode %q: want loadgen or grpc", f.retryMode)
	}
	switch {
	case f.findMax:
		return errors.New("loadgen: --find-max searches the rate the server sustains without retries; run the retrying clients in a run of their own at the rate it found")
	case f.printRequests > 0:
		return errors.New("loadgen: --print-request sends nothing: leave out --retries")
	}
	return nil
}

// retry is the run's loadgen.Retry, and the service config of
// --retry-mode grpc ("" otherwise).
func retry(f flags) (loadgen.Retry, string, error) {
	r := loadgen.Retry{Retries: f.retries, Initial: f.retryBackoff, Max: f.retryMaxBackoff, Multiplier: 2, IgnorePushback: !f.retryPushback, GRPC: f.retryMode == "grpc"}
	if f.retries == 0 || !r.GRPC {
		return r, "", nil
	}
	var th *loadgen.RetryThrottling
	if f.retryThrottling != "" {
		var t loadgen.RetryThrottling
		if n, err := fmt.Sscanf(f.retryThrottling, "%g,%g", &t.MaxTokens, &t.TokenRatio); err != nil || n != 2 || t.MaxTokens <= 0 || t.MaxTokens > 1000 || t.TokenRatio <= 0 {
			return r, "", fmt.Errorf("loadgen: --retry-throttling %q: want MAX_TOKENS,TOKEN_RATIO, MAX_TOKENS in (0, 1000], TOKEN_RATIO above 0 (e.g. 10,0.1)", f.retryThrottling)
		}
		th = &t
	}
	return r, loadgen.ServiceConfig(r, th), nil
}

// updateTables are the plan's tables the update stream writes: those
// named by --update-tables, or all.
func updateTables(f flags) ([]loadgen.UpdateTable, error) {
	p, err := plan.Read(f.planDir)
	if err != nil {
		return nil, fmt.Errorf("loadgen: %w", err)
	}
	byName := map[string]plan.Table{}
	var names []string
	for _, t := range p.Tables {
		byName[t.Name] = t
		names = append(names, t.Name)
	}
	want := f.updateTables
	if len(want) == 0 {
		want = names
	}
	if len(want) == 0 {
		return nil, fmt.Errorf("loadgen: the plan in %s has no embedding table to update", f.planDir)
	}
	var out []loadgen.UpdateTable
	for _, name := range want {
		t, ok := byName[name]
		if !ok {
			return nil, fmt.Errorf("loadgen: --update-tables: the plan has no table %q; its tables: %s", name, strings.Join(names, ","))
		}
		out = append(out, loadgen.UpdateTable{Name: t.Name, Rows: t.Rows, Dim: t.Dim})
	}
	return out, nil
}

func run(ctx context.Context, stdout, stderr io.Writer, f flags) error {
	if len(f.mix) == 0 {
		return errors.New("loadgen: --model is required")
	}
	if f.printRequests < 0 {
		return fmt.Errorf("loadgen: --print-request %d: want 1 or more requests to print", f.printRequests)
	}
	if f.printRequests == 0 && (f.target == "") == !f.fake {
		return errors.New("loadgen: give one of --target ADDR or --fake (or --print-request N to print requests without sending)")
	}
	var sig models.Signature
	var sigs []models.Signature // a mix's, in --model's order
	var err error
	if f.mixed() {
		sigs, err = mixSignatures(f)
	} else {
		sig, err = signature(f)
	}
	if err != nil {
		return err
	}
	cand, err := loadgen.ParseCandidates(f.candidates)
	if err != nil {
		return fmt.Errorf("loadgen: --%w", err)
	}
	if f.stream == 0 && f.printRequests > 0 {
		// Printed requests are for trying a server by hand: the same
		// command prints the same requests unless --stream says otherwise.
		f.stream = 1
	}
	if f.stream == 0 {
		// A new sequence each run: one that replayed the previous run's
		// requests would find their rows in the embedding tier's hot tier
		// (a warm-up and the run measured after it, above all).
		f.stream = rand.Uint64() | 1
	}
	newRequests := func() (*loadgen.Requests, error) {
		var err error
		options := func(model string, sig models.Signature) (loadgen.RequestOptions, func(), error) {
			o := loadgen.RequestOptions{Model: model, Sig: sig, Context: f.context, ExpandContext: f.expandContext, Candidates: cand, Seed: f.seed, ZipfS: f.zipf, Stream: f.stream, Pool: f.pool, PoolJSON: f.httpURL != ""}
			if f.criteo == "" {
				return o, func() {}, nil
			}
			file, err := os.Open(f.criteo)
			if err != nil {
				return o, nil, fmt.Errorf("loadgen: %w", err)
			}
			o.Criteo, o.CriteoName = file, filepath.Base(f.criteo)
			return o, func() { file.Close() }, nil
		}
		var q *loadgen.Requests
		if f.mixed() {
			// Each model's requests as a run of it alone draws them (the
			// same --seed and --stream); the choice of model from the
			// run's seed, so --stream N repeats a run's choices too.
			var ms []loadgen.MixedModel
			for i, share := range f.mix.Shares() {
				o, closeFile, err := options(f.mix[i].Name, sigs[i])
				if err != nil {
					return nil, err
				}
				defer closeFile()
				ms = append(ms, loadgen.MixedModel{Options: o, Share: share})
			}
			if q, err = loadgen.NewMixedRequests(ms, f.seed^f.stream*0x9E3779B97F4A7C15); err != nil {
				return nil, fmt.Errorf("loadgen: %w", err)
			}
		} else {
			o, closeFile, err := options(f.model, sig)
			if err != nil {
				return nil, err
			}
			defer closeFile()
			if q, err = loadgen.NewRequests(o); err != nil {
				return nil, err
			}
		}
		// The pool is drawn here, before the clock starts.
		return q, q.Prepare()
	}
	if f.printRequests > 0 {
		reqs, err := newRequests()
		if err != nil {
			return err
		}
		return printRequests(stdout, reqs, f.printRequests)
	}
	target := f.target
	if f.httpURL != "" {
		target = f.httpURL // the URL requests are POSTed to, in the lines below
	}
	if f.fake {
		addr, stop, err := loadgen.ServeFake("127.0.0.1:0", &loadgen.Fake{})
		if err != nil {
			return err
		}
		defer stop()
		target = addr
	}
	if !f.fake {
		// The bearer token's two halves, each named with the other.
		switch t := f.tls; {
		case f.tokenFile == "" && t.CA != "" && t.Cert == "" && t.Key == "" && t.Certs == "" && !t.Insecure:
			return errors.New("loadgen: --tls-ca alone needs --auth-token-file FILE (the router's bearer token), or --tls-cert and --tls-key (a certificate), or give --certs DIR")
		case f.tokenFile != "" && t.CA == "" && t.Cert == "" && t.Certs == "" && !t.Insecure:
			return errors.New("loadgen: --auth-token-file needs --tls-ca FILE (the CA the router's certificate chains to: the token travels over TLS)")
		case f.tokenFile != "" && t.Insecure:
			return errors.New("loadgen: --auth-token-file needs TLS: over --insecure the token would travel in the clear")
		}
	}
	rt, serviceConfig, err := retry(f)
	if err != nil {
		return err
	}
	var sender loadgen.Sender
	var cc *grpc.ClientConn // the gRPC target's connection (the update stream's too)
	if f.httpURL != "" {
		if sender, err = httpSender(stderr, f); err != nil {
			return err
		}
	} else {
		dialOpts := []grpc.DialOption{grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20), grpc.MaxCallSendMsgSize(64<<20))}
		if f.fake {
			// The in-process fake serves plaintext on loopback.
			dialOpts = append(dialOpts, grpc.WithTransportCredentials(insecure.NewCredentials()))
		} else {
			// The load goes to the router only: a worker's certificate
			// answering on the path does not get the session (or the token).
			creds, err := f.tls.Credentials(auth.Admin, f.tokenFile != "", auth.Router)
			if err != nil {
				return fmt.Errorf("loadgen: %w", err)
			}
			dialOpts = append(dialOpts, grpc.WithTransportCredentials(creds))
			if f.tokenFile != "" {
				token, err := auth.ReadToken(f.tokenFile)
				if err != nil {
					return fmt.Errorf("loadgen: --auth-token-file: %w", err)
				}
				if w := auth.TokenModeWarning(f.tokenFile); w != "" {
					fmt.Fprintf(stderr, "prism: warning: %s\n", w)
				}
				bearer, err := auth.BearerToken(token)
				if err != nil {
					return fmt.Errorf("loadgen: --auth-token-file: %w", err)
				}
				dialOpts = append(dialOpts, bearer)
			}
			f.tls.WarnClient(stderr, "loadgen")
		}
		if serviceConfig != "" {
			// grpc-go retries by itself; the stats handler counts its attempts.
			dialOpts = append(dialOpts, grpc.WithDefaultServiceConfig(serviceConfig), grpc.WithStatsHandler(loadgen.AttemptCounter{}))
			fmt.Fprintf(stderr, "loadgen: grpc-go retries from the service config %s\n", serviceConfig)
		}
		cc, err = grpc.NewClient(target, dialOpts...)
		if err != nil {
			return fmt.Errorf("loadgen: dial %q: %w", target, err)
		}
		defer cc.Close()
		sender = loadgen.GRPCSender{Client: prismv1.NewRecommenderClient(cc), Conn: cc}
	}

	// The schedule's seed is the run's stream's too: with --seed's alone
	// every run drew one Poisson path, rescaled, and seed 1's first
	// seconds arrive slowly (63 of 80 requests at 20 req/s for 4 s, in
	// every run). --stream N repeats a run's schedule with its requests.
	opts := loadgen.Options{Poisson: f.arrival != "constant", Seed: f.seed ^ f.stream*0x9E3779B97F4A7C15, Clients: f.clients, Duration: f.duration,
		MaxRequests: f.maxRequests, MaxInFlight: f.maxInFlight, Timeout: f.timeout, SLO: f.slo, TraceRatio: f.traceRatio}
	if f.watchBorrowed != "" {
		// prism up's controller serves HTTPS under TLS, with the
		// router's certificate: verified against this run's CA.
		var watchTLS *tls.Config
		if strings.HasPrefix(f.watchBorrowed, "https://") && !f.fake {
			files, ok, err := f.tls.Files(auth.Admin, true)
			if err != nil {
				return fmt.Errorf("loadgen: --watch-borrowed: %w", err)
			}
			if ok {
				if watchTLS, err = auth.ScrapeTLS(files, auth.Router); err != nil {
					return fmt.Errorf("loadgen: --watch-borrowed: %w", err)
				}
			}
		}
		if err := loadgen.ProbeURL(ctx, f.watchBorrowed, watchTLS); err != nil {
			return fmt.Errorf("loadgen: --watch-borrowed: %w (prism up --loan prints the controller's /metrics URL)", err)
		}
		opts.Watch = loadgen.GaugeWatch("borrowed workers", f.watchBorrowed, "prism_capacity_borrowed_workers", watchTLS)
	}
	if !f.quiet {
		opts.Live, opts.TTY = stderr, progress.IsTerminal(stderr)
		if !opts.TTY {
			opts.LiveEvery = 5 * time.Second
		}
	}
	if f.findMax {
		return findMax(ctx, stdout, stderr, f, opts, newRequests, sender)
	}
	// The Recommend requests' retries, and the update stream's: a
	// trainer retries an update refused for the moment (the router's
	// update queue full, its start-up window) as a client retries a
	// request (loadgen.UpdateRetryCodes).
	opts.Retry = rt
	var updates func() (*loadgen.Summary, error)
	if f.updates() {
		if updates, err = updateStream(ctx, stderr, f, target, opts, cc); err != nil {
			return err
		}
	}
	if f.updateOnly {
		return reportUpdates(stdout, f, updates)
	}
	if f.clients == 0 {
		if opts.Profile, err = profile(f); err != nil {
			return err
		}
	}
	reqs, err := newRequests()
	if err != nil {
		return err
	}
	drawn := ""
	if f.criteo == "" {
		drawn = fmt.Sprintf(", request stream %d", f.stream)
	}
	if f.mixed() {
		parts := make([]string, len(f.mix))
		for i, share := range f.mix.Shares() {
			parts[i] = fmt.Sprintf("%s %.1f%% (%d inputs)", f.mix[i].Name, 100*share, len(sigs[i].Inputs))
		}
		fmt.Fprintf(stderr, "loadgen: %s, %s arrivals, models %s, %d inputs in the context, candidates %s%s, for %v or %d requests\n",
			target, arrivalName(f), strings.Join(parts, ", "), len(f.context), cand, drawn, f.duration, f.maxRequests)
	} else {
		fmt.Fprintf(stderr, "loadgen: %s, %s arrivals, %d inputs (%d in the context), candidates %s%s, for %v or %d requests\n",
			target, arrivalName(f), len(sig.Inputs), len(f.context), cand, drawn, f.duration, f.maxRequests)
	}
	if r, ok := opts.Profile.(*loadgen.Replay); ok {
		// How the trace was read, so that a misread one shows before the
		// run (timestamps in milliseconds read as seconds: windows 1000
		// times too long, and a run that sees one of them).
		tr := r.Trace
		fmt.Fprintf(stderr, "loadgen: trace %s: %d windows of %v (%v of trace time, timestamps read as seconds), peak %.4g req/s as scaled; at %gx it plays in %v\n",
			filepath.Base(f.trace), len(tr.Rates), tr.Step, tr.Duration(), r.MaxRate(), r.Speedup, time.Duration(float64(tr.Duration())/r.Speedup).Round(time.Millisecond))
	}
	type result struct {
		sum *loadgen.Summary
		err error
	}
	updated := make(chan result, 1)
	if updates != nil {
		go func() {
			sum, err := updates()
			updated <- result{sum, err}
		}()
	}
	sum, err := loadgen.Run(ctx, opts, reqs, sender)
	if err != nil {
		return err
	}
	sum.Interrupted = ctx.Err() != nil
	sum.WriteText(stdout)
	if f.out != "" {
		if err := sum.WriteDir(f.out); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "wrote %s\n", filepath.Join(f.out, "{summary.json,timeseries.csv,plot.png}"))
	}
	var updateErr error
	if updates != nil {
		fmt.Fprintln(stdout)
		updateErr = reportUpdates(stdout, f, func() (*loadgen.Summary, error) {
			r := <-updated
			return r.sum, r.err
		})
	}
	if sum.Sent == 0 {
		hint := ""
		if f.arrival == "trace" {
			hint = " (the trace's rates as scaled are below one request over the run: raise --trace-peak or --trace-scale, or --duration)"
		}
		return errors.Join(fmt.Errorf("loadgen: no request was sent in %v%s", f.duration, hint), updateErr)
	}
	return errors.Join(noneOK(sum, f.tokenFile != ""), noneOKModels(sum), updateErr)
}

// noneOKModels is an error, in a mix whose totals had answers, for each
// model none of whose requests was answered OK (a model the router does
// not serve, named wrong): its part of the report measured nothing.
func noneOKModels(s *loadgen.Summary) error {
	if s.OK == 0 {
		return nil // noneOK says it for the run
	}
	var errs []error
	for _, m := range s.Models {
		if m.Sent == 0 || m.OK > 0 {
			continue
		}
		codes := slices.Sorted(maps.Keys(m.FirstErrors))
		if len(codes) == 0 {
			errs = append(errs, fmt.Errorf("loadgen: model %s: none of %d requests was answered OK", m.Model, m.Sent))
			continue
		}
		errs = append(errs, fmt.Errorf("loadgen: model %s: none of %d requests was answered OK; the first %s: %s", m.Model, m.Sent, codes[0], m.FirstErrors[codes[0]]))
	}
	return errors.Join(errs...)
}

// updateStream prepares the run's update stream (--update-rate or
// --update-clients) over cc, and returns the function that runs it.
// target is the address dialed (the in-process fake's with --fake).
func updateStream(ctx context.Context, stderr io.Writer, f flags, target string, opts loadgen.Options, cc grpc.ClientConnInterface) (func() (*loadgen.Summary, error), error) {
	tables, err := updateTables(f)
	if err != nil {
		return nil, err
	}
	u, err := loadgen.NewUpdates(loadgen.UpdateOptions{Model: f.model, Tables: tables, Rows: f.updateRows, ZipfS: f.zipf, Seed: f.seed ^ f.stream})
	if err != nil {
		return nil, fmt.Errorf("loadgen: %w", err)
	}
	o := opts
	o.Watch = nil
	o.MaxInFlight = 0 // the default
	// A schedule of its own: with the requests' seed the updates would
	// arrive on the requests' Poisson path, rescaled.
	o.Seed = opts.Seed ^ 0x5bd1e995
	o.Clients, o.Profile, o.Poisson = f.updateClients, nil, true
	mode := fmt.Sprintf("closed-loop (%d clients)", f.updateClients)
	if f.updateClients == 0 {
		o.Profile = loadgen.Constant(f.updateRate)
		mode = fmt.Sprintf("poisson at %g/s", f.updateRate)
	}
	if !f.updateOnly && opts.TTY {
		// One line redrawn in place is the requests'.
		o.Live = nil
	}
	fmt.Fprintf(stderr, "loadgen: updates: %s, %s, %s, for %v or %d updates\n", target, mode, u, f.duration, f.maxRequests)
	sender := loadgen.GRPCUpdater{Client: prismv1.NewEmbeddingsClient(cc)}
	return func() (*loadgen.Summary, error) { return loadgen.RunUpdates(ctx, o, u, sender) }, nil
}

// reportUpdates runs (or waits for) the update stream and reports it:
// its summary, its report folder (OUT/updates) and an error when no
// update was sent or acknowledged.
func reportUpdates(stdout io.Writer, f flags, updates func() (*loadgen.Summary, error)) error {
	sum, err := updates()
	if err != nil {
		return err
	}
	sum.WriteText(stdout)
	if f.out != "" {
		dir := f.out
		if !f.updateOnly {
			dir = filepath.Join(f.out, "updates")
		}
		if err := sum.WriteDir(dir); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "wrote %s\n", filepath.Join(dir, "{summary.json,timeseries.csv,plot.png}"))
	}
	if sum.Sent == 0 {
		return fmt.Errorf("loadgen: no update was sent in %v", f.duration)
	}
	if err := noneOK(sum, false); err != nil {
		return fmt.Errorf("loadgen: updates: %w", err)
	}
	return nil
}

// printRequests writes n requests from reqs to w as protojson with the
// proto field names a person types (num_candidates): one request as an
// object, which grpcurl -d @ and ghz --data-file take, more as a JSON
// array, one request a line, which ghz --data-file sends in turn
// (grpcurl sends one message to a unary method).
func printRequests(w io.Writer, reqs *loadgen.Requests, n int) error {
	m := protojson.MarshalOptions{UseProtoNames: true}
	bw := bufio.NewWriter(w)
	if n > 1 {
		bw.WriteString("[\n")
	}
	for i := range n {
		req, err := reqs.Next()
		if err != nil {
			return fmt.Errorf("loadgen: %w", err)
		}
		b, err := m.Marshal(req)
		if err != nil {
			return fmt.Errorf("loadgen: %w", err)
		}
		bw.Write(b)
		if n > 1 && i < n-1 {
			bw.WriteByte(',')
		}
		bw.WriteByte('\n')
	}
	if n > 1 {
		bw.WriteString("]\n")
	}
	return bw.Flush()
}

// noneOK is an error when requests were sent and none was answered OK
// (a wrong address, TLS against plaintext, a model the router does not
// serve): the run measured nothing, and a script must not read it as a
// measurement.
func noneOK(s *loadgen.Summary, token bool) error {
	if s.Sent == 0 || s.OK > 0 {
		return nil
	}
	what, answered := "requests", "answered OK"
	if s.Kind == loadgen.KindUpdates {
		what, answered = "updates", "acknowledged"
	}
	codes := slices.Sorted(maps.Keys(s.FirstErrors))
	if len(codes) == 0 {
		return fmt.Errorf("none of %d %s was %s", s.Sent, what, answered)
	}
	msg := s.FirstErrors[codes[0]]
	hint := auth.MismatchHint(msg)
	if token && hint == "" && (strings.Contains(msg, "certificate required") || strings.Contains(msg, "broken pipe") || strings.Contains(msg, "connection reset")) {
		// A router without --auth-token-file asks every client for a
		// certificate; TLS 1.3 sends its refusal after the handshake,
		// so the client sees its connection dropped.
		hint = " (a bearer token against a router that takes none? it asks every client for a certificate: give --certs DIR, or start the router with --auth-token-file)"
	}
	return fmt.Errorf("none of %d %s was %s; the first %s: %s%s", s.Sent, what, answered, codes[0], msg, hint)
}

func arrivalName(f flags) string {
	if f.clients > 0 {
		return fmt.Sprintf("closed-loop (%d clients)", f.clients)
	}
	return f.arrival
}

func profile(f flags) (loadgen.Profile, error) {
	switch f.arrival {
	case "constant", "poisson":
		if !(f.rate > 0) {
			return nil, fmt.Errorf("loadgen: --rate must be positive, got %v", f.rate)
		}
		return loadgen.Constant(f.rate), nil
	case "promotion":
		p := f.promo
		p.Peak = f.rate
		p.EnsureDefaults(f.duration)
		for name, d := range map[string]*time.Duration{"promo-at": &p.At, "promo-ramp": &p.Ramp, "promo-plateau": &p.Plateau, "promo-decay": &p.Decay} {
			if f.promoZero[name] {
				*d = 0
			}
		}
		if err := p.Validate(); err != nil {
			return nil, fmt.Errorf("loadgen: %w", err)
		}
		if p.At >= f.duration {
			return nil, fmt.Errorf("loadgen: the promotion starts at %v, not before the run ends (--duration %v): the run would see none of it", p.At, f.duration)
		}
		return &p, nil
	case "trace":
		if f.trace == "" {
			return nil, errors.New("loadgen: --arrival trace needs --trace FILE")
		}
		file, err := os.Open(f.trace)
		if err != nil {
			return nil, fmt.Errorf("loadgen: %w", err)
		}
		defer file.Close()
		tr, err := loadgen.ParseTrace(file, filepath.Base(f.trace), loadgen.TraceOptions{Count: f.traceCount, Window: f.traceWindow, KeyColumn: f.traceKey})
		if err != nil {
			return nil, err
		}
		if !(f.traceSpeedup > 0) {
			return nil, fmt.Errorf("loadgen: --trace-speedup must be positive, got %v", f.traceSpeedup)
		}
		r := &loadgen.Replay{Trace: tr, Speedup: f.traceSpeedup, Scale: f.traceScale}
		if f.tracePeak > 0 && tr.Peak() > 0 {
			r.Scale = f.tracePeak / tr.Peak()
		}
		if !(r.MaxRate() > 0) {
			return nil, fmt.Errorf("loadgen: trace %s has no traffic at scale %v", f.trace, r.Scale)
		}
		return r, nil
	}
	return nil, fmt.Errorf("loadgen: --arrival %q: want constant, poisson, promotion or trace", f.arrival)
}

func findMax(ctx context.Context, stdout, stderr io.Writer, f flags, opts loadgen.Options, newRequests func() (*loadgen.Requests, error), s loadgen.Sender) error {
	if f.clients > 0 {
		return errors.New("loadgen: --find-max runs open loop; leave out --clients")
	}
	if f.arrival != "poisson" {
		// Each trial is Poisson at one constant rate: a trace or a
		// promotion asked for was dropped without a word.
		return fmt.Errorf("loadgen: --find-max runs Poisson trials at constant rates; leave out --arrival %s (and --trace)", f.arrival)
	}
	opts.Duration = f.findMaxTrial
	opts.Live = nil
	if f.findMaxWarmUp < 0 {
		return fmt.Errorf("loadgen: --find-max-warmup %v: want 0 (none) or a positive duration", f.findMaxWarmUp)
	}
	// One request stream for the whole search, each run going on where
	// the last one stopped: rebuilt per run from the same --seed and
	// --stream, every trial replayed the warm-up's requests (and the
	// previous trials'), whose rows the embedding tier then had hot.
	reqs, err := newRequests()
	if err != nil {
		return err
	}
	// Each run's arrivals from a seed of its own (from --seed): with one
	// seed every trial was the same Poisson path rescaled, its count
	// short of (or over) the rate by the same share in every trial.
	runs := uint64(0)
	seed := func() uint64 {
		runs++
		return opts.Seed + (runs-1)*0x9E3779B97F4A7C15
	}
	trial := func(ctx context.Context, rate float64) (*loadgen.Summary, error) {
		o := opts
		o.Profile, o.Poisson, o.Seed = loadgen.Constant(rate), true, seed()
		return loadgen.Run(ctx, o, reqs, s)
	}
	var warm *loadgen.Summary
	if f.findMaxWarmUp > 0 {
		o := opts
		o.Duration, o.Seed = f.findMaxWarmUp, seed()
		o.Profile, o.Poisson = loadgen.Constant(f.rate), true
		if warm, err = loadgen.Run(ctx, o, reqs, s); err != nil {
			return fmt.Errorf("loadgen: find-max warm-up: %w", err)
		}
		fmt.Fprintf(stderr, "find-max: warm-up %v at %.1f req/s  sent %d  ok %d  p99 %.2fms  (not judged)\n", f.findMaxWarmUp, f.rate, warm.Sent, warm.OK, warm.P99)
	}
	res, searchErr := loadgen.FindMax(ctx, loadgen.FindMaxOptions{Start: f.rate, SLO: f.slo, Tolerance: f.findMaxTolerance, MaxTrials: f.findMaxTrials}, trial, stderr)
	if res == nil {
		return searchErr
	}
	// A search that stopped early (interrupted, or a trial that could
	// not run) still reports and writes the trials it ran: returning at
	// once lost every one of them, findmax.json included.
	res.WarmUp = warm
	var best *loadgen.Summary
	failed, anyOK := false, false
	for _, t := range res.Trials {
		if t.Pass && t.Rate == res.MaxRate {
			best = t.Summary
		}
		failed = failed || !t.Pass
		anyOK = anyOK || t.Summary.OK > 0
	}
	stopped := ""
	if searchErr != nil {
		stopped = ", stopped early"
	}
	switch {
	case f.mixed():
		writeMixVerdict(stdout, f, res, best != nil, failed, stopped)
	case best == nil:
		fmt.Fprintf(stdout, "find-max: no rate met p99 under %v (%d trials of %v%s)\n", f.slo, len(res.Trials), f.findMaxTrial, stopped)
	case !failed:
		// Every trial passed: the search never found where the server
		// falls behind, and the rate is a lower bound, not the maximum.
		fmt.Fprintf(stdout, "find-max: at least %.1f req/s: every trial met p99 under %v (%d trials of %v%s; none failed: a lower bound)\n", res.MaxRate, f.slo, len(res.Trials), f.findMaxTrial, stopped)
	default:
		fmt.Fprintf(stdout, "find-max: %.1f req/s is the highest rate with p99 under %v (%d trials of %v%s)\n", res.MaxRate, f.slo, len(res.Trials), f.findMaxTrial, stopped)
	}
	if best != nil {
		best.WriteText(stdout)
	}
	if f.out != "" {
		if err := os.MkdirAll(f.out, 0o755); err != nil {
			return fmt.Errorf("loadgen: %w", err)
		}
		buf, err := json.MarshalIndent(res, "", "  ")
		if err != nil {
			return fmt.Errorf("loadgen: %w", err)
		}
		if err := atomicfile.WriteFile(filepath.Join(f.out, "findmax.json"), func(w io.Writer) error {
			_, err := w.Write(append(buf, '\n'))
			return err
		}); err != nil {
			return fmt.Errorf("loadgen: %w", err)
		}
		if best != nil {
			if err := best.WriteDir(f.out); err != nil {
				return err
			}
		} else {
			// No trial passed: the folder's report of an earlier run
			// would read as this search's best trial.
			for _, name := range loadgen.ReportFiles {
				if err := os.Remove(filepath.Join(f.out, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
					return fmt.Errorf("loadgen: %w", err)
				}
			}
		}
	}
	if searchErr != nil {
		return searchErr
	}
	if !anyOK && len(res.Trials) > 0 {
		// No request of any trial was answered OK (a server down, a
		// wrong address): nothing was measured, as in a single run.
		if err := noneOK(res.Trials[len(res.Trials)-1].Summary, f.tokenFile != ""); err != nil {
			return fmt.Errorf("loadgen: find-max: %w", err)
		}
	}
	return nil
}

// writeMixVerdict is find-max's verdict over a mix of models: the
// highest total rate at the mix at which every model met the SLO, and
// the model that failed the lowest failing trial (the one that bounds
// the rate), with why.
func writeMixVerdict(w io.Writer, f flags, res *loadgen.FindMaxResult, passed, failed bool, stopped string) {
	trials := fmt.Sprintf("%d trials of %v%s", len(res.Trials), f.findMaxTrial, stopped)
	switch {
	case !passed:
		fmt.Fprintf(w, "find-max: no total rate at the mix %s met every model's p99 under %v (%s)\n", f.mix, f.slo, trials)
	case !failed:
		fmt.Fprintf(w, "find-max: at least %.1f req/s in total at the mix %s: every trial met every model's p99 under %v (%s; none failed: a lower bound)\n", res.MaxRate, f.mix, f.slo, trials)
	default:
		fmt.Fprintf(w, "find-max: %.1f req/s in total is the highest rate at the mix %s with every model's p99 under %v (%s)\n", res.MaxRate, f.mix, f.slo, trials)
	}
	if !failed {
		return
	}
	// The lowest failing trial: the search lowers its failing rate only.
	var low *loadgen.Trial
	for i, t := range res.Trials {
		if !t.Pass && (low == nil || t.Rate < low.Rate) {
			low = &res.Trials[i]
		}
	}
	if res.BoundBy != "" {
		fmt.Fprintf(w, "find-max: bound by model %s: at %.1f req/s, %s\n", res.BoundBy, low.Rate, low.Why)
	} else {
		fmt.Fprintf(w, "find-max: bound by the totals, no one model: at %.1f req/s, %s\n", low.Rate, low.Why)
	}
}

// mixSignatures finds each model's inputs in a mix, in --model's order:
// from the --plan whose model it is, or from the zoo preset of its name.
func mixSignatures(f flags) ([]models.Signature, error) {
	byModel := map[string]string{}
	for _, dir := range f.planArgs {
		p, err := plan.Read(dir)
		if err != nil {
			return nil, fmt.Errorf("loadgen: %w", err)
		}
		name := p.ServedName(dir)
		if !slices.Contains(f.mix.Names(), name) {
			return nil, fmt.Errorf("loadgen: --plan %s is model %s's, which the mix (--model %s) does not have", dir, name, f.mix)
		}
		if other, ok := byModel[name]; ok {
			return nil, fmt.Errorf("loadgen: --plan %s and --plan %s are both model %s's: give one plan per model", other, dir, name)
		}
		byModel[name] = dir
	}
	sigs := make([]models.Signature, len(f.mix))
	for i, m := range f.mix {
		var err error
		if dir, ok := byModel[m.Name]; ok {
			sigs[i], err = signature(flags{model: m.Name, planDir: dir})
		} else if sigs[i], err = presetSignature(m.Name); err != nil {
			err = fmt.Errorf("loadgen: model %s's inputs: give --plan DIR (its plan folder) or name a zoo preset: %w", m.Name, err)
		}
		if err != nil {
			return nil, err
		}
	}
	return sigs, nil
}

// signature finds the model's inputs: a plan, an ONNX file, or a preset.
func signature(f flags) (models.Signature, error) {
	n := 0
	for _, s := range []string{f.preset, f.planDir, f.onnx} {
		if s != "" {
			n++
		}
	}
	if n > 1 {
		return models.Signature{}, errors.New("loadgen: give at most one of --model-preset, --plan and --onnx")
	}
	switch {
	case f.planDir != "":
		p, err := plan.Read(f.planDir)
		if err != nil {
			return models.Signature{}, fmt.Errorf("loadgen: %w", err)
		}
		return planSignature(p)
	case f.onnx != "":
		m, err := pb.ReadModel(f.onnx, pb.ReadOptions{SkipExternalData: true})
		if err != nil {
			return models.Signature{}, fmt.Errorf("loadgen: %w", err)
		}
		sig, err := models.InferSignature(m)
		if err != nil {
			return models.Signature{}, fmt.Errorf("loadgen: inputs of %q: %w", f.onnx, err)
		}
		return sig, nil
	}
	name := f.preset
	if name == "" {
		name = f.model
	}
	sig, err := presetSignature(name)
	if err != nil {
		var lookup *lookupError
		if errors.As(err, &lookup) {
			return models.Signature{}, fmt.Errorf("loadgen: the model's inputs: give --model-preset, --plan or --onnx: %w", lookup.err)
		}
		return models.Signature{}, err
	}
	return sig, nil
}

// lookupError is a preset name the zoo does not have.
type lookupError struct{ err error }

func (e *lookupError) Error() string { return e.err.Error() }

// presetSignature is the inputs of the zoo preset name.
func presetSignature(name string) (models.Signature, error) {
	p, err := models.Lookup(name)
	if err != nil {
		return models.Signature{}, &lookupError{err}
	}
	c, err := p.Resolve(models.ScaleOptions{})
	if err != nil {
		return models.Signature{}, fmt.Errorf("loadgen: preset %q: %w", name, err)
	}
	return c.Signature(), nil
}

// planSignature reads a plan's inputs (models.PlanSignature): an id
// input takes its rows and bag from the table it looks up, a packed or
// float input carrying ids the valid range of each value, worked back
// through the lookups' pre-lookup ops; a float input its width from its
// shape.
func planSignature(p *plan.Plan) (models.Signature, error) {
	sig, err := models.PlanSignature(p)
	if err != nil {
		return sig, fmt.Errorf("loadgen: %w", err)
	}
	return sig, nil
}
