package sharding

import (
	"fmt"
	"io"
	"strings"

	"github.com/prism-serve/prism/internal/onnxpb"
	"github.com/prism-serve/prism/internal/progress"
	"github.com/prism-serve/prism/internal/shareddata"
	"github.com/prism-serve/prism/plan"
)

// DefaultZipf is the Zipf exponent assumed without a Criteo sample.
const DefaultZipf = 1.05

// RunOptions configure Run (`prism shard`).
type RunOptions struct {
	Options
	// Criteo is a Criteo sample to count row frequencies on; "" with
	// Zipf 0 takes the sample in ../shared/data if there is one and the
	// model reads Criteo rows, else Zipf DefaultZipf.
	Criteo string
	// Zipf, if > 0, assumes row r looked up with weight 1/(r+1)^Zipf.
	Zipf float64
}

// Validate checks the options.
func (o *RunOptions) Validate() error {
	if o.Criteo != "" && o.Zipf != 0 {
		return fmt.Errorf("a Criteo sample and a Zipf exponent both given; pick one")
	}
	if o.Zipf < 0 {
		return fmt.Errorf("zipf exponent %v, want > 0", o.Zipf)
	}
	return o.Options.Validate()
}

// Run plans the sharding of the plan in dir and writes it into its
// plan.json (a sharding section already there is replaced). Notes on
// the estimate it fell back to go to log.
func Run(dir string, o RunOptions, log io.Writer) (*plan.Plan, error) {
	o.EnsureDefaults()
	if err := o.Validate(); err != nil {
		return nil, err
	}
	p, err := plan.Read(dir)
	if err != nil {
		return nil, err
	}
	var freq func(string) Freq
	estimate := ""
	switch {
	case o.Zipf > 0:
		z := Zipf{S: o.Zipf}
		freq, estimate = func(string) Freq { return z }, z.String()
	default:
		file, explicit := o.Criteo, o.Criteo != ""
		if !explicit {
			file = shareddata.Default(CriteoSample)
		}
		if file != "" {
			counts, err := Criteo(p, file)
			switch {
			case err != nil && explicit:
				return nil, err
			case err != nil:
				fmt.Fprintf(log, "shard: not using the Criteo sample %s (%v); assuming Zipf %g\n", file, err, DefaultZipf)
			default:
				freq = func(t string) Freq { return counts[t] }
				estimate = counts[p.Tables[0].Name].Source
			}
		}
		if freq == nil {
			z := Zipf{S: DefaultZipf}
			freq, estimate = func(string) Freq { return z }, z.String()
		}
	}
	r, err := Plan(Tables(p, freq), o.Options)
	if err != nil {
		return nil, fmt.Errorf("shard %q: %w", dir, err)
	}
	s, err := Section(p, r, estimate)
	if err != nil {
		return nil, fmt.Errorf("shard %q: %w", dir, err)
	}
	if err := checkCPUReads(dir, p, s); err != nil {
		return nil, fmt.Errorf("shard %q: %w", dir, err)
	}
	p.Sharding = s
	if err := plan.Write(dir, p); err != nil {
		return nil, err
	}
	return p, nil
}

// WriteText prints a sharding section for people: one line per shard,
// then the row-wise tables.
func WriteText(w io.Writer, s *plan.Sharding) {
	fmt.Fprintf(w, "%d shards of at most %s; expected lookups from %s, imbalance %.1f%% (tolerance %.0f%%)\n",
		s.Shards, progress.Bytes(s.ShardBytes), s.Estimate, 100*s.Imbalance, 100*s.Tolerance)
	for _, sh := range s.Shard {
		fmt.Fprintf(w, "shard %-3d %10s %12d rows %8.2f lookups/sample  %d full, %d partial outputs\n",
			sh.Shard, progress.Bytes(sh.Bytes), sh.Rows, sh.Lookups, len(sh.Full), len(sh.Partial))
	}
	for _, t := range s.Tables {
		if t.Placement == plan.RowWise {
			parts := make([]string, len(t.Shards))
			for i, sh := range t.Shards {
				parts[i] = fmt.Sprint(sh)
			}
			fmt.Fprintf(w, "row-wise %-24s rows r on shard [%s][r mod %d]\n", t.Table, strings.Join(parts, " "), len(t.Shards))
		}
	}
}

// checkCPUReads refuses a sharding under which cpu.onnx reads a lookup
// output shard 0 does not answer whole: shard 0's embedding worker runs
// cpu.onnx and refuses to serve such a plan (cpuserve/server/shard.go).
func checkCPUReads(dir string, p *plan.Plan, s *plan.Sharding) error {
	if p.CPUModel == "" {
		return nil
	}
	path, err := plan.Resolve(dir, p.CPUModel)
	if err != nil {
		return err
	}
	mp, err := onnxpb.ReadModel(path, onnxpb.ReadOptions{SkipExternalData: true})
	if err != nil {
		return err
	}
	table := map[string]string{} // lookup output -> its table
	for _, t := range p.Tables {
		for _, l := range t.Lookups {
			table[l.Output] = t.Name
		}
	}
	full := map[string]bool{}
	for _, o := range s.Shard[0].Full {
		full[o] = true
	}
	for _, in := range mp.GetGraph().GetInput() {
		name := in.GetName()
		t, ok := table[name]
		if !ok || full[name] {
			continue
		}
		tp := s.Placement(t)
		where := fmt.Sprintf("whole on shard %d", tp.Shards[0])
		if tp.Placement == plan.RowWise {
			where = fmt.Sprintf("row-wise over shards %v", tp.Shards)
		}
		return fmt.Errorf("cpu.onnx reads lookup output %q of table %q, which the sharding places %s: shard 0's embedding worker runs cpu.onnx and answers only its own tables' lookups, so a sharded model's cpu.onnx may read only lookups of tables whole on shard 0 (partition it with --lookups-dense, which keeps every reader of a lookup on the dense side, or serve it unsharded, or with --shards 1)", name, t, where)
	}
	return nil
}
