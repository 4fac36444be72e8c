package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/prism-serve/prism/capacity"
	"github.com/prism-serve/prism/capacity/sim"
	"github.com/prism-serve/prism/internal/flagval"
	"github.com/prism-serve/prism/placement/cli"
)

func init() { planSubcommands = append(planSubcommands, newPlanLoanCmd) }

// newPlanLoanCmd is `prism plan loan`: the what-if of capacity loaning.
// The logic lives in capacity/sim; this file only parses flags.
func newPlanLoanCmd() *cobra.Command {
	var (
		c                  sim.LoanConfig
		trace, policies    string
		promotions         []string
		reclaims           []time.Duration
		minLease, coolDown time.Duration
		target, high, low  float64
	)
	cmd := &cobra.Command{
		Use:   "loan",
		Short: "What-if of capacity loaning: replay a QPS trace through the capacity controller",
		Long: `loan replays a QPS trace (times --scale, samples/s), with promotions on top,
through the capacity controller on a simulated clock, once per policy. Each
tick the serving workers (owned, and borrowed ones --startup after the
borrow) times --capacity-per-worker serve the demand; what exceeds them
misses the SLO. --reclaim injects the lender taking a borrowed worker back
with --grace. It reports the GPUs static provisioning for the peak would
need, the peak borrowed, borrowed GPU-hours, SLO attainment and reclaims
survived, and writes report.json and loan.png to --out.`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			// Checked first, naming the flag: the simulation's own checks
			// said "trace scale", "tick" and "lender idle", after the
			// trace was read.
			if err := flagval.Positive(cmd.Flags(), "scale", "tick"); err != nil {
				return err
			}
			if err := flagval.NonNegative(cmd.Flags(), "owned", "lender-idle", "startup", "drain", "grace", "min-lease", "cool-down"); err != nil {
				return err
			}
			if c.Base.Owned > sim.MaxOwned {
				return fmt.Errorf("--owned %d: want at most %d, more than any cluster has", c.Base.Owned, sim.MaxOwned)
			}
			var err error
			if c.Trace, err = dataFlag("qps", trace, sim.QPSTrace); err != nil {
				return err
			}
			for _, s := range strings.Split(policies, ",") {
				p, err := capacity.ParsePolicy(strings.TrimSpace(s))
				if err != nil {
					return fmt.Errorf("--policy: %w", err)
				}
				c.Policies = append(c.Policies, p)
			}
			for _, s := range promotions {
				p, err := capacity.ParsePromotion(s)
				if err != nil {
					return fmt.Errorf("--promotion: %w", err)
				}
				c.Base.Promotions = append(c.Base.Promotions, p)
			}
			c.Base.Reclaims = reclaims
			o := &c.Base.Controller
			o.MinLease, o.CoolDown, o.Target, o.High, o.Low = minLease, coolDown, target, high, low
			o.Exact = true // --min-lease 0 and --cool-down 0 are zeros, not the controller's defaults
			if !(c.Base.CapacityPerWorker > 0) {
				return fmt.Errorf("--capacity-per-worker must be positive (samples/s one dense worker serves), got %v", c.Base.CapacityPerWorker)
			}
			if c.TraceOptions.Window < 0 {
				return fmt.Errorf("--trace-window %v is negative", c.TraceOptions.Window)
			}
			c.Base.Exact = true // the flags carry the defaults; a 0 typed means 0
			return sim.Loan(cmd.OutOrStdout(), c)
		},
	}
	f := cmd.Flags()
	f.StringVar(&trace, "qps", cli.DefaultData(sim.QPSTrace), "QPS trace CSV (timestamp_anon,value,container_ip,...: per time window, each container's rates averaged and the containers summed)")
	f.Float64Var(&c.Scale, "scale", 1, "multiply the trace's rates by this (requests/s to samples/s)")
	f.DurationVar(&c.TraceOptions.Window, "trace-window", 0, "trace window to sum rows over, as prism loadgen's (default: the smallest time step; give it for a trace whose rows, one per container, jitter in time)")
	f.BoolVar(&c.TraceOptions.Count, "trace-count", false, "the trace's values are counts per row, not rates")
	f.StringVar(&c.TraceOptions.KeyColumn, "trace-key", "", `trace column naming each row's source (container), as prism loadgen's: within a window a source's rates are averaged, then the sources summed (default: the first of container_ip, container, instance, pod the header has; "none": every row summed)`)
	f.Float64Var(&c.Base.CapacityPerWorker, "capacity-per-worker", 0, "samples/s one dense worker serves within the SLO (required)")
	f.StringArrayVar(&promotions, "promotion", nil, "START,DURATION,FACTOR: demand times FACTOR from START for DURATION (as 5h,1h,3); repeatable")
	f.StringVar(&policies, "policy", "reactive,predictive", "reactive, predictive, or both comma-separated")
	f.IntVar(&c.Base.Owned, "owned", 0, "dense workers the service owns (0: the trace's median demand at --target)")
	f.DurationVar(&c.Base.Tick, "tick", 10*time.Second, "controller period")
	f.DurationVar(&c.Base.Startup, "startup", 90*time.Second, "time from a borrow to the worker serving (model load, warm-up, registration); the predictive policy borrows this far ahead until it has measured one")
	f.DurationVar(&c.Base.Drain, "drain", time.Second, "time a drained worker needs to finish its in-flight work")
	f.DurationSliceVar(&reclaims, "reclaim", nil, "times (from the trace start) at which the lender reclaims the newest borrowed worker; comma-separated or repeated")
	f.DurationVar(&c.Base.Grace, "grace", 30*time.Second, "the lender's grace period on a reclaim")
	f.IntVar(&c.Base.LenderIdle, "lender-idle", 1000, "workers the lender can lend at most")
	f.DurationVar(&minLease, "min-lease", 10*time.Minute, "a borrowed worker serves at least this long before a return for low demand")
	f.DurationVar(&coolDown, "cool-down", 5*time.Minute, "after a return: no further return, and a borrow only for a real shortage")
	f.Float64Var(&target, "target", 0.7, "utilization a borrow sizes to")
	f.Float64Var(&high, "high", 0.85, "utilization above which the controller borrows")
	f.Float64Var(&low, "low", 0, "utilization a return must leave at most (0: --target)")
	f.StringVar(&c.Out, "out", "", "directory for report.json and loan.png")
	return cmd
}
