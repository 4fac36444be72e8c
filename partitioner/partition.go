package partitioner

import (
	"errors"
	"fmt"
	"github.com/prism-serve/prism/plan"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	pb "github.com/prism-serve/prism/internal/onnxpb"
	"github.com/prism-serve/prism/internal/tablefile"
)

// Options control Partition.
type Options struct {
	Cost     CostModel
	ForceCPU []string
	ForceGPU []string
	// LookupsDense pins every node reading a lookup's output to the
	// dense side: cpu.onnx then reads no lookup output, which a plan
	// sharded by prism shard needs when a table is not whole on shard 0
	// (shard 0's embedding worker runs cpu.onnx on its own lookups
	// only). The bytes crossing the cut may grow (work that shrank the
	// lookups' outputs on the CPU side runs on the dense side); for
	// HugeCTR's per-slot lookups they stay the same.
	LookupsDense bool
	// Tasks names the outputs the dense tier answers with, in order
	// (plan.Plan.TaskOutputs); empty: every output that is a float32
	// score (chooseTasks).
	Tasks []string
	// ReportOnly plans without writing anything.
	ReportOnly bool
	// AllowDenseOnly writes a plan even when Gathers on tables were not
	// recognised as lookups (they stay in the dense graph); without it
	// that is an ErrUnrecognised error naming each. So is a plan whose
	// dense side reads model inputs the tiers cannot send it (such a
	// table's int64 ids): without it, an ErrUnsendable error.
	AllowDenseOnly bool
	// AllowBatchDependent writes a plan whose scores depend on the other
	// samples of a batch (Placement.batchDependent); without it that is
	// an ErrBatchDependent error.
	AllowBatchDependent bool
	// Overwrite replaces a non-empty output folder.
	Overwrite bool
	// TableProgress, if set, is called as table bytes are written.
	TableProgress func(done, total int64)
}

// Result is a finished partition.
type Result struct {
	Plan      *plan.Plan
	Placement *Placement
	Elapsed   time.Duration
	// Removed lists the temporary folders of earlier runs into the same
	// output folder, stopped part way (Ctrl-C, SIGKILL), that this run
	// removed.
	Removed []string
}

// ErrForced marks an error caused by the nodes the caller forced onto a
// side (Options.ForceCPU, Options.ForceGPU).
var ErrForced = errors.New("cannot honour a forced placement")

// ErrCostsTooLarge: the cost model's figures (bandwidth, FLOP rates,
// launch time) make the graph's costs too large for the exact min-cut.
var ErrCostsTooLarge = errors.New("costs too large to solve exactly")

// ErrUnrecognised marks a model with tables whose lookups the
// partitioner cannot recognise (see Options.AllowDenseOnly).
var ErrUnrecognised = errors.New("embedding tables not recognised as lookups")

// ErrOutputExists: the output folder exists and is not empty.
var ErrOutputExists = errors.New("output folder exists and is not empty")

// Partition reads the model at modelPath, places every node, and (unless
// ReportOnly) writes the partition folder outDir: plan.json, cpu.onnx when
// there is CPU work besides the lookups, dense.onnx and tables/. It writes
// into a temporary folder beside outDir and renames it at the end, so a
// failure leaves outDir as it was. Tables stream from the model's
// (external) data one piece at a time: memory stays near the dense
// weights plus one record batch, whatever the tables' size.
// scoreOutput is the output name the model zoo and the reference scorer
// take for the score (models.ScoreOutput; the partitioner imports no
// model zoo).
const scoreOutput = "score"

func Partition(modelPath, outDir string, o Options) (*Result, error) {
	start := time.Now()
	m, err := pb.ReadModel(modelPath, pb.ReadOptions{SkipExternalData: true})
	if err != nil {
		return nil, err
	}
	if err := inlineFunctions(m); err != nil {
		return nil, fmt.Errorf("partition %q: %w", modelPath, err)
	}
	if err := checkArity(m.GetGraph(), modelOpset(m), ""); err != nil {
		return nil, fmt.Errorf("partition %q: %w", modelPath, err)
	}
	batch, err := Debatch(m)
	if err != nil {
		return nil, fmt.Errorf("partition %q: %w", modelPath, err)
	}
	g, err := NewGraph(m)
	if err != nil {
		return nil, fmt.Errorf("partition %q: %w", modelPath, err)
	}
	g.Dir = filepath.Dir(modelPath)
	// Multi-slot lookups ([batch, slots, nnz] keys pooled per slot:
	// HugeCTR's) become one lookup per slot.
	if split, err := splitSlots(g); err != nil {
		return nil, fmt.Errorf("partition %q: %w", modelPath, err)
	} else if split {
		if g, err = NewGraph(m); err != nil {
			return nil, fmt.Errorf("partition %q: %w", modelPath, err)
		}
		g.Dir = filepath.Dir(modelPath)
	}
	// Tables the quantization and float16 tools rewrote (quant.go).
	if rewriteTables(g) {
		if g, err = NewGraph(m); err != nil {
			return nil, fmt.Errorf("partition %q: %w", modelPath, err)
		}
		g.Dir = filepath.Dir(modelPath)
	}
	if batch != nil && len(batch.Blockers) > 0 {
		g.FixedBatch = batch.Exported
	}
	pl, err := place(g, o.Cost, o.ForceCPU, o.ForceGPU, o.LookupsDense)
	if err != nil {
		return nil, fmt.Errorf("partition %q: %w", modelPath, err)
	}
	cm := o.Cost
	cm.EnsureDefaults()
	p := pl.plan(modelPath, cm)
	unknown := map[string]bool{}
	for _, out := range g.Outputs {
		unknown[out.GetName()] = !sampleKnown(pl.outputType(out))
	}
	if err := chooseTasks(p, o.Tasks, unknown); err != nil {
		return nil, fmt.Errorf("partition %q: %w", modelPath, err)
	}
	pl.setBatch(p, batch)
	res := &Result{Plan: p, Placement: pl}
	if o.ReportOnly {
		res.Elapsed = time.Since(start)
		p.Cost.PartitionMillis = res.Elapsed.Milliseconds()
		return res, nil
	}
	if err := pl.unrecognised(); err != nil && !o.AllowDenseOnly {
		return nil, fmt.Errorf("partition %q: %w", modelPath, err)
	}
	if err := pl.unsendable(); err != nil && !o.AllowDenseOnly {
		// With AllowDenseOnly the plan is written (prism score --plan
		// runs it), its report saying that the tiers cannot serve it.
		return nil, fmt.Errorf("partition %q: %w", modelPath, err)
	}
	if err := pl.batchDependent(); err != nil && !o.AllowBatchDependent {
		return nil, fmt.Errorf("partition %q: %w", modelPath, err)
	}
	if err := checkOutDir(outDir, o.Overwrite); err != nil {
		return nil, err
	}
	parent := filepath.Dir(filepath.Clean(outDir))
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return nil, fmt.Errorf("partition: %w", err)
	}
	partial := "." + filepath.Base(filepath.Clean(outDir)) + ".partial-"
	// A run stopped part way (Ctrl-C, SIGKILL: no deferred removal runs)
	// left its temporary folder, as big as the partition, hidden beside
	// outDir; each such run added one, and none was ever removed.
	if res.Removed, err = removePartials(parent, partial); err != nil {
		return nil, fmt.Errorf("partition: %w", err)
	}
	tmp, err := os.MkdirTemp(parent, partial)
	if err != nil {
		return nil, fmt.Errorf("partition: %w", err)
	}
	ok := false
	defer func() {
		if !ok {
			os.RemoveAll(tmp)
		}
	}()
	// MkdirTemp makes it 0700: renamed into place, the output folder was
	// unreadable to a tier running as another user than prism partition.
	if err := os.Chmod(tmp, 0o755); err != nil {
		return nil, fmt.Errorf("partition: %w", err)
	}
	if err := pl.write(tmp, filepath.Dir(modelPath), p, o); err != nil {
		return nil, fmt.Errorf("partition %q: %w", modelPath, err)
	}
	res.Elapsed = time.Since(start)
	p.Cost.PartitionMillis = res.Elapsed.Milliseconds()
	if err := plan.Write(tmp, p); err != nil {
		return nil, err
	}
	if err := replaceDir(tmp, outDir); err != nil {
		return nil, fmt.Errorf("partition: %w", err)
	}
	ok = true
	return res, nil
}

// outputType is the type of graph output o: as inferred, or as the
// model declares it where inference did not reach it (a per-sample
// shape the plan writes must never be a guess: [] would say one score
// per sample, and the dense tier, which serves k values a sample only
// for a first output the plan says is [k], would serve a multi-task
// model's [batch, tasks] as one score a sample).
func (pl *Placement) outputType(o *pb.ValueInfoProto) TensorType {
	t := pl.Types[o.GetName()]
	if sampleKnown(t) {
		return t
	}
	if d := valueInfoType(o); sampleKnown(d) {
		if d.Elem == 0 {
			d.Elem = t.Elem
		}
		return d
	}
	return t
}

// unrecognised is the error naming every table left in the graph, its
// size and why, or nil.
func (pl *Placement) unrecognised() error {
	var lines []string
	for _, c := range pl.Candidates {
		if c.Reason != "" {
			op := "Gather"
			if c.Op != "" {
				op = c.Op
			}
			lines = append(lines, fmt.Sprintf("table %q (%d x %d, %s) at %s %q: %s", c.Table, c.Rows, c.Dim, human(c.Bytes(), "B"), op, c.Gather, c.Reason))
		}
	}
	if len(lines) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %d read(s) of tables would stay in the dense graph:\n  %s", ErrUnrecognised, len(lines), strings.Join(lines, "\n  "))
}

// ErrUnsendable marks a model whose dense side reads model inputs the
// tiers cannot send it (Placement.Unsendable).
var ErrUnsendable = errors.New("the dense side reads inputs the tiers cannot send it")

// unsendable is the error naming the inputs of Placement.Unsendable, or
// nil.
func (pl *Placement) unsendable() error {
	if len(pl.Unsendable) == 0 {
		return nil
	}
	hint := ""
	if slices.ContainsFunc(pl.Unsendable, func(s string) bool { return strings.Contains(s, " (float16 ") }) {
		// onnxconverter-common's convert_float_to_float16 without
		// keep_io_types makes the model's float inputs float16.
		hint = "; a float16 input: convert the model to float16 with keep_io_types=True (its inputs stay float32, cast to float16 inside the graph)"
	}
	return fmt.Errorf("%w: model input(s) %s; cut tensors cross as float32 rows of a known per-sample shape only (a table left in the dense graph takes its ids there: see the table candidates; or --force-cpu the readers)%s", ErrUnsendable, strings.Join(pl.Unsendable, ", "), hint)
}

// ErrBatchDependent marks a model in which a sample's score depends on
// the other samples of its batch (see Options.AllowBatchDependent).
var ErrBatchDependent = errors.New("a sample's score depends on the other samples of its batch")

// batchDependent is the error naming the nodes that make one scale for
// a whole batch, or nil: DynamicQuantizeLinear (ONNX Runtime's
// quantize_dynamic puts one before every MatMul it quantizes) reduces
// its input, batch axis included, to one scale and zero point. The
// monolithic model is batch-dependent too, but served, the batch is
// whatever the router's micro-batches and the dense tier's dynamic
// batching put together: a candidate's score would change with other
// requests' traffic, and no reference run reproduces it.
func (pl *Placement) batchDependent() error {
	var nodes []string
	for i, n := range pl.G.Nodes {
		if _, placed := pl.OnCPU[i]; !placed || n.GetOpType() != "DynamicQuantizeLinear" || len(n.GetInput()) == 0 {
			continue
		}
		if t := pl.Types[n.GetInput()[0]]; t.Known && !t.HasBatch() {
			continue // a weight quantized in the graph: the same for every batch
		}
		nodes = append(nodes, fmt.Sprintf("DynamicQuantizeLinear %q (of %q)", n.GetName(), n.GetInput()[0]))
	}
	if len(nodes) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s computes one scale and zero point over the whole tensor, batch axis included (onnxruntime quantize_dynamic quantizes each MatMul's input so): served, a candidate's score would change with the candidates the router's micro-batches and the dense tier's dynamic batching put beside it, other requests' included; quantize with quantize_static (QuantFormat.QDQ: calibrated scales, the same for every sample), or quantize the tables only (quantize_dynamic(..., op_types_to_quantize=[\"Gather\"]))", ErrBatchDependent, strings.Join(nodes, ", "))
}

func checkOutDir(dir string, overwrite bool) error {
	ents, err := os.ReadDir(dir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil
	case err != nil:
		return fmt.Errorf("partition: output %q: %w", dir, err)
	case len(ents) > 0 && !overwrite:
		return fmt.Errorf("partition: %q: %w", dir, ErrOutputExists)
	}
	return nil
}

// removePartials removes the folders in parent whose names start with
// prefix (the temporary folders of runs stopped part way, and the
// ".old" folder of one stopped while replacing its output) and lists
// them.
func removePartials(parent, prefix string) ([]string, error) {
	ents, err := os.ReadDir(parent)
	if err != nil {
		return nil, err
	}
	var removed []string
	for _, e := range ents {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), prefix) {
			continue
		}
		p := filepath.Join(parent, e.Name())
		if err := os.RemoveAll(p); err != nil {
			return removed, fmt.Errorf("remove the partial output of an earlier run: %w", err)
		}
		removed = append(removed, p)
	}
	return removed, nil
}

// replaceDir moves tmp to dir, replacing what was there.
func replaceDir(tmp, dir string) error {
	if _, err := os.Stat(dir); err == nil {
		old := tmp + ".old"
		if err := os.Rename(dir, old); err != nil {
			return err
		}
		if err := os.Rename(tmp, dir); err != nil {
			os.Rename(old, dir)
			return err
		}
		return os.RemoveAll(old)
	}
	return os.Rename(tmp, dir)
}

// plan describes the placement as plan.json.
func (pl *Placement) plan(modelPath string, cm CostModel) *plan.Plan {
	g := pl.G
	p := &plan.Plan{
		Version:    plan.WriteVersion(&plan.Plan{}),
		Model:      plan.ModelInfo{Name: g.Model.GetGraph().GetName(), Path: filepath.Base(modelPath), Opset: g.Opset()},
		Cut:        pl.Cut,
		DenseModel: DenseFile,
	}
	for _, kv := range g.Model.GetMetadataProps() {
		if kv.GetKey() == "prism.model" {
			p.Model.Name = kv.GetValue()
		}
	}
	keys := pl.inputKeys(filepath.Dir(modelPath))
	cutSet := map[string]bool{}
	for _, c := range pl.Cut {
		cutSet[c.Name] = true
	}
	for _, in := range g.Inputs {
		t := pl.Types[in.GetName()]
		ti := plan.TensorInfo{Name: in.GetName(), DType: dtypeName(t.Elem), Shape: t.SampleShape(), Keys: keys[in.GetName()]}
		var cpu, gpu bool
		for _, c := range g.Consumers[in.GetName()] {
			if pl.Absorbed[c] != nil || pl.OnCPU[c] || pl.Pre[c] {
				cpu = true
			}
		}
		for _, l := range pl.Lookups {
			if l.ids == in.GetName() || l.weights == in.GetName() || slices.Contains(l.preInputs, in.GetName()) {
				cpu = true
			}
		}
		gpu = cutSet[in.GetName()]
		if cpu {
			ti.Sides = append(ti.Sides, plan.CPU)
		}
		if gpu {
			ti.Sides = append(ti.Sides, plan.GPU)
		}
		p.Inputs = append(p.Inputs, ti)
	}
	for _, o := range g.Outputs {
		p.Outputs = append(p.Outputs, plan.TensorInfo{Name: o.GetName(), DType: dtypeName(pl.outputType(o).Elem), Shape: pl.outputType(o).SampleShape()})
	}
	// The dense tier answers with plan.json's first output; the
	// reference scorer (prism score) with the output named "score" when
	// the model has one. A model exporting [aux, score] was scored by aux
	// in serving and by score in the reference: "score" goes first.
	if i := slices.IndexFunc(p.Outputs, func(o plan.TensorInfo) bool { return o.Name == scoreOutput }); i > 0 {
		score := p.Outputs[i]
		p.Outputs = slices.Insert(slices.Delete(p.Outputs, i, i+1), 0, score)
	}
	byTable := map[*tableSource]*plan.Table{}
	files := map[string]bool{}
	for _, l := range pl.Lookups {
		t, ok := byTable[l.table]
		if !ok {
			t = &plan.Table{Name: l.table.name, File: uniqueTableFile(l.table.name, files), Rows: l.table.rows, Dim: l.table.dim, DType: "float32", UnknownIDs: plan.UnknownError,
				RowFactors: l.table.rowFactors()}
			byTable[l.table] = t
			p.Tables = append(p.Tables, plan.Table{})
		}
		t.Lookups = append(t.Lookups, plan.Lookup{Input: l.ids, Pre: l.pre, PreOutput: l.preOut, PreInputs: l.preInputs, Bag: l.bag, Rank1: l.rank1, Pooling: l.pooling, Weights: l.weights, Output: l.output})
		if l.preOut != "" {
			p.PreModel = PreFile
		}
	}
	i := 0
	seen := map[*tableSource]bool{}
	for _, l := range pl.Lookups {
		if !seen[l.table] {
			seen[l.table] = true
			p.Tables[i] = *byTable[l.table]
			i++
		}
	}
	pl.planJagged(p)
	if pl.cpuNodes() > 0 {
		p.CPUModel = CPUFile
	}
	p.Cost = pl.costReport(cm)
	return p
}

func (pl *Placement) cpuNodes() int {
	n := 0
	for _, on := range pl.OnCPU {
		if on {
			n++
		}
	}
	return n
}

func (pl *Placement) costReport(cm CostModel) plan.CostReport {
	g := pl.G
	r := plan.CostReport{
		CPU:           plan.SideCost{Ops: map[string]int{}},
		GPU:           plan.SideCost{Ops: map[string]int{}},
		Objective:     float64(pl.Objective) / costScale,
		UnknownShapes: pl.UnknownShapes,
		Forced:        pl.Forced,
	}
	seen := [2]map[string]bool{{}, {}}
	for i, n := range g.Nodes {
		on, placed := pl.OnCPU[i]
		if !placed {
			continue
		}
		side, k := &r.GPU, 1
		if on {
			side, k = &r.CPU, 0
		}
		side.Nodes++
		side.Ops[n.GetOpType()]++
		side.ParamBytes += paramBytes(g, n, seen[k])
		if f, ok := nodeFLOPs(g, n, pl.Types); ok {
			side.FLOPsPerSamp += f
		}
	}
	for _, l := range pl.Lookups {
		r.CPU.Ops["Lookup("+string(l.pooling)+")"]++
		r.CPU.FLOPsPerSamp += int64(l.bag * l.table.dim)
	}
	for _, c := range pl.Cut {
		if c.BytesPerSample > 0 {
			r.CutBytes += c.BytesPerSample
		}
	}
	tables := map[*tableSource]bool{}
	for _, l := range pl.Lookups {
		if !tables[l.table] {
			tables[l.table] = true
			r.TableBytes += l.table.rows * int64(l.table.dim) * 4
		}
	}
	return r
}

// write emits the subgraphs and tables into dir.
func (pl *Placement) write(dir, modelDir string, p *plan.Plan, o Options) error {
	g := pl.G
	outTypes := map[string]*pb.ValueInfoProto{}
	for _, vi := range g.Outputs {
		outTypes[vi.GetName()] = vi
	}
	var cut []string
	for _, c := range pl.Cut {
		cut = append(cut, c.Name)
	}
	dense, err := pl.subModel("dense", false, cut, outputNames(g), outTypes, modelDir)
	if err != nil {
		return err
	}
	// Which outputs the dense tier answers with is part of what the plan
	// serves, and plan.Plan.Content hashes dense.onnx's bytes: two
	// partitions of one export answering with other outputs (--tasks)
	// have other contents, in this release and earlier ones alike.
	var scores []string
	for _, o := range p.Outputs[:min(max(p.TaskOutputs, 1), len(p.Outputs))] {
		scores = append(scores, strconv.Quote(o.Name))
	}
	dense.MetadataProps = append(dense.MetadataProps, &pb.StringStringEntryProto{Key: "prism.scores", Value: strings.Join(scores, " ")})
	if err := pb.WriteModel(filepath.Join(dir, DenseFile), dense, pb.WriteOptions{}); err != nil {
		return err
	}
	if p.CPUModel != "" {
		// cpu.onnx reads model inputs and lookup outputs, and produces the
		// cut tensors that CPU nodes make.
		var ins, outs []string
		have := map[string]bool{}
		lookupOut := map[string]bool{}
		for _, l := range pl.Lookups {
			lookupOut[l.output] = true
		}
		for i := range g.Nodes {
			if on, placed := pl.OnCPU[i]; !placed || !on {
				continue
			}
			for _, in := range g.Reads(i) {
				if (g.IsInput(in) || lookupOut[in]) && !have[in] {
					have[in] = true
					ins = append(ins, in)
				}
			}
		}
		for _, c := range pl.Cut {
			if c.From == "cpu" {
				outs = append(outs, c.Name)
			}
		}
		cpu, err := pl.subModel("cpu", true, ins, outs, nil, modelDir)
		if err != nil {
			return err
		}
		if err := pb.WriteModel(filepath.Join(dir, CPUFile), cpu, pb.WriteOptions{}); err != nil {
			return err
		}
	}
	if p.PreModel != "" {
		pre, err := pl.preModel(modelDir)
		if err != nil {
			return err
		}
		if err := pb.WriteModel(filepath.Join(dir, PreFile), pre, pb.WriteOptions{}); err != nil {
			return err
		}
	}
	// Each part's checksum, which a tier loading it checks (plan.Content).
	p.PartSHA256 = map[string]string{}
	for _, f := range []string{p.DenseModel, p.CPUModel, p.PreModel} {
		if f == "" {
			continue
		}
		sum, err := plan.PartSum(filepath.Join(dir, f))
		if err != nil {
			return err
		}
		p.PartSHA256[f] = sum
	}
	if len(p.Tables) == 0 {
		return nil
	}
	if err := os.MkdirAll(filepath.Join(dir, "tables"), 0o755); err != nil {
		return err
	}
	var total, done int64
	for _, t := range p.Tables {
		total += t.Rows * int64(t.Dim) * 4
	}
	srcs := map[string]*tableSource{}
	for _, l := range pl.Lookups {
		srcs[l.table.name] = l.table
	}
	for i := range p.Tables {
		t := &p.Tables[i]
		src := srcs[t.Name]
		base := done
		meta, err := tablefile.WriteStream(filepath.Join(dir, t.File), t.Name, t.Dim, t.Rows, tableStream(src, modelDir), func(rows, _ int64) {
			if o.TableProgress != nil {
				o.TableProgress(base+rows*int64(t.Dim)*4, total)
			}
		})
		if err != nil {
			return err
		}
		t.SHA256 = meta.SHA256
		done += t.Rows * int64(t.Dim) * 4
	}
	return nil
}

func outputNames(g *Graph) []string {
	var out []string
	for _, o := range g.Outputs {
		out = append(out, o.GetName())
	}
	return out
}

// Report is the human summary of a partition.
func (r *Result) Report() string {
	p := r.Plan
	var b strings.Builder
	fmt.Fprintf(&b, "model %s (opset %d): %d inputs, %d outputs\n", p.Model.Name, p.Model.Opset, len(p.Inputs), len(p.Outputs))
	side := func(label string, s plan.SideCost) {
		var ops []string
		for op, n := range s.Ops {
			ops = append(ops, fmt.Sprintf("%s x%d", op, n))
		}
		sort.Strings(ops)
		fmt.Fprintf(&b, "%s: %d nodes, %s of parameters, %s FLOPs/sample\n", label, s.Nodes, human(s.ParamBytes, "B"), human(s.FLOPsPerSamp, ""))
		if len(ops) > 0 {
			fmt.Fprintf(&b, "  ops: %s\n", strings.Join(ops, ", "))
		}
	}
	if p.CPUModel == "" && len(p.Tables) == 0 {
		fmt.Fprintf(&b, "CPU side: empty (no embedding lookups found; the whole model is dense)\n")
	}
	side("CPU side ("+orNone(p.CPUModel, "lookups only")+")", p.Cost.CPU)
	if p.PreModel != "" {
		fmt.Fprintf(&b, "pre-lookup subgraph (%s, ONNX Runtime before the lookups): %s\n", p.PreModel, r.Placement.preSummary())
	}
	side("dense side ("+p.DenseModel+")", p.Cost.GPU)
	fmt.Fprintf(&b, "cut: %d tensors, %d bytes/sample\n", len(p.Cut), p.Cost.CutBytes)
	for _, c := range p.Cut {
		fmt.Fprintf(&b, "  %-40s %-8s %v %d B (%s)\n", c.Name, c.DType, c.Shape, c.BytesPerSample, c.From)
	}
	if names, err := p.TaskNames(); err != nil {
		fmt.Fprintf(&b, "scores: NOT SERVABLE: %v\n", err)
	} else if len(names) > 1 {
		fmt.Fprintf(&b, "scores: %d tasks a sample, in this order: %s\n", len(names), strings.Join(names, ", "))
	} else {
		fmt.Fprintf(&b, "scores: output %q\n", names[0])
	}
	// Float outputs the dense tier does not answer with (an output of
	// several values a sample after the first task: PaddleRec's ESMM
	// fetches two softmax heads [B, 2]): said, never dropped without a
	// word.
	for _, o := range p.Outputs[min(max(p.TaskOutputs, 1), len(p.Outputs)):] {
		if o.DType == "float32" {
			fmt.Fprintf(&b, "  not served: output %q %v (computed by dense.onnx, not sent back; --tasks names the outputs to serve)\n", o.Name, o.Shape)
		}
	}
	fmt.Fprintf(&b, "tables: %d, %s\n", len(p.Tables), human(p.Cost.TableBytes, "B"))
	for i, t := range p.Tables {
		if i == 8 && len(p.Tables) > 10 {
			fmt.Fprintf(&b, "  ... %d more\n", len(p.Tables)-8)
			break
		}
		var pools []string
		for _, l := range t.Lookups {
			pools = append(pools, fmt.Sprintf("%s[bag %d]->%s", l.Input, l.Bag, l.Pooling))
		}
		fmt.Fprintf(&b, "  %-30s %10d x %-4d %s\n", t.Name, t.Rows, t.Dim, strings.Join(pools, ", "))
	}
	if len(r.Placement.Candidates) > 0 {
		fmt.Fprintf(&b, "table candidates: %d\n", len(r.Placement.Candidates))
		for _, c := range r.Placement.Candidates {
			state := "lookup"
			if c.Reason != "" {
				state = "NOT a lookup: " + c.Reason
			}
			path := c.Path
			if path == "" {
				path = "(no path from the inputs)"
			}
			fmt.Fprintf(&b, "  %-30s %10d x %-4d %s\n    %s\n", c.Table, c.Rows, c.Dim, state, path)
		}
	}
	if len(p.Cost.UnknownShapes) > 0 {
		fmt.Fprintf(&b, "shapes not inferred (costed conservatively): %s\n", strings.Join(p.Cost.UnknownShapes, ", "))
	}
	if len(p.Cost.Forced) > 0 {
		fmt.Fprintf(&b, "forced: %s\n", strings.Join(p.Cost.Forced, ", "))
	}
	if d := r.Placement.Dead; len(d) > 0 {
		fmt.Fprintf(&b, "dead nodes (no output depends on them; in neither part): %s\n", strings.Join(d, ", "))
	}
	if err := r.Placement.unsendable(); err != nil {
		fmt.Fprintf(&b, "NOT SERVABLE: %v\n", err)
	}
	if err := r.Placement.batchDependent(); err != nil {
		fmt.Fprintf(&b, "BATCH-DEPENDENT: %v\n", err)
	}
	if bi := p.Batch; bi != nil {
		if p.FixedBatch > 0 {
			fmt.Fprintf(&b, "batch: FIXED at %d (exported without a dynamic batch; the parts run batches of exactly %d candidates only, and the router cuts every request into micro-batches of %d, padding the last), kept there by:\n", p.FixedBatch, p.FixedBatch, p.FixedBatch)
			dense := false
			for _, x := range bi.Blockers {
				fmt.Fprintf(&b, "  node %q (%s, %s side): %s\n", x.Node, x.Op, orNone(string(x.Side), "no"), x.Reason)
				dense = dense || x.Side == plan.GPU
			}
			if dense {
				fmt.Fprintf(&b, "  dense.onnx keeps the fixed batch: the dense tier runs this model's micro-batches one at a time, each of exactly %d (--force-cpu the node(s) above to let it batch requests together)\n", p.FixedBatch)
			}
		} else {
			fmt.Fprintf(&b, "batch: exported fixed at %d, rewritten to a symbolic batch", bi.Exported)
			if len(bi.Rewritten) > 0 {
				fmt.Fprintf(&b, " (shape constants of %s)", strings.Join(bi.Rewritten, ", "))
			}
			fmt.Fprintf(&b, "; --verify checks it at other batch sizes\n")
		}
	}
	fmt.Fprintf(&b, "objective: %.1f ns/sample; took %s\n", p.Cost.Objective, r.Elapsed.Round(time.Millisecond))
	return b.String()
}

func orNone(s, none string) string {
	if s == "" {
		return none
	}
	return s
}

func human(n int64, unit string) string {
	f := float64(n)
	for _, s := range []string{"", "K", "M", "G", "T"} {
		if f < 1000 || s == "T" {
			if s == "" {
				return strings.TrimSpace(fmt.Sprintf("%d %s", n, unit))
			}
			return strings.TrimSpace(fmt.Sprintf("%.2f %s%s", f, s, unit))
		}
		f /= 1000
	}
	return ""
}

// setBatch records what Debatch made of a fixed exported batch, with
// the side each blocker landed on.
func (pl *Placement) setBatch(p *plan.Plan, bi *plan.BatchInfo) {
	if bi == nil {
		return
	}
	byName := map[string]int{}
	for i, n := range pl.G.Nodes {
		byName[n.GetName()] = i
	}
	for k := range bi.Blockers {
		i, ok := byName[bi.Blockers[k].Node]
		if !ok {
			continue
		}
		if on, placed := pl.OnCPU[i]; placed {
			bi.Blockers[k].Side = plan.GPU
			if on {
				bi.Blockers[k].Side = plan.CPU
			}
		} else if pl.Pre[i] || pl.Absorbed[i] != nil {
			bi.Blockers[k].Side = plan.CPU
		}
	}
	p.Batch = bi
	if len(bi.Blockers) > 0 {
		p.FixedBatch = bi.Exported
	}
}
