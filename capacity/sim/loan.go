package sim

import (
	"github.com/prism-serve/prism/loadgen"

	"fmt"
	"io"

	"github.com/prism-serve/prism/capacity"
)

// QPSTrace is the gateway QPS trace under ../shared/data that `prism plan
// loan` defaults to.
const QPSTrace = "qps/genai_gateway_qps.csv"

// LoanConfig is what `prism plan loan` runs once its flags are parsed.
type LoanConfig struct {
	// Trace is the QPS CSV; Scale multiplies its rates into samples/s.
	Trace string
	Scale float64
	// TraceOptions say how to read it (columns, counts, the window rows
	// are summed over: loadgen.TraceOptions).
	TraceOptions loadgen.TraceOptions
	// Policies to compare, each run on the same Base.
	Policies []capacity.Policy
	// Base is the simulation; its Step, Rates and Controller.Policy are
	// set per run.
	Base Config
	// Out, when set, is the folder for report.json and loan.png.
	Out string
}

// Loan replays the trace once per policy, prints each report and writes
// the outputs.
func Loan(w io.Writer, c LoanConfig) error {
	tr, err := ReadTrace(c.Trace, c.Scale, c.TraceOptions)
	if err != nil {
		return err
	}
	step, rates := tr.Step, tr.Rates
	if tr.Filled > 0 {
		// A gap is read as the demand standing (a scrape missed, not
		// traffic gone): said, so that a trace with hours missing is
		// not planned on as if it had them.
		fmt.Fprintf(w, "note: the trace has no row in %d of its %d windows of %v (the longest gap %v): each is given the rate of the window before it\n", tr.Filled, len(rates), step, tr.LongestGap)
	}
	if len(c.Policies) == 0 {
		return fmt.Errorf("no policy to simulate")
	}
	var results []*Result
	for _, p := range c.Policies {
		cfg := c.Base
		cfg.Step, cfg.Rates = step, rates
		cfg.Controller.Policy = p
		r, err := Run(cfg)
		if err != nil {
			return err
		}
		WriteSummary(w, r.Report)
		results = append(results, r)
	}
	if c.Out == "" {
		return nil
	}
	if err := WriteOutputs(c.Out, results); err != nil {
		return err
	}
	fmt.Fprintf(w, "wrote %s/report.json and %s/loan.png\n", c.Out, c.Out)
	return nil
}
