package plan

import (
	"fmt"
	"math"
	"path/filepath"
	"strings"
)

// Bounds Validate keeps, so that sizes the tiers compute from a plan
// (values per sample, bytes of a table) cannot overflow.
const (
	// MaxSampleElements bounds a tensor's known values per sample.
	MaxSampleElements = 1 << 24
	// MaxDim bounds a table's width.
	MaxDim = 1 << 20
	// MaxBag bounds a lookup's ids per sample.
	MaxBag = 1 << 20
)

// Validate checks that p is a plan the tiers can serve: the version this
// build reads, every name a lookup or the cut refers to declared once,
// sizes positive, enumerations known, and every file the plan names a
// local path inside the plan folder (no "..", not absolute), so a plan
// cannot make a tier open files elsewhere. Read calls it; the partitioner
// calls it before writing. The error names the first field that is wrong.
func (p *Plan) Validate() error {
	if p.Version < MinVersion || p.Version > Version {
		return fmt.Errorf("version %d, this build reads versions %d to %d", p.Version, MinVersion, Version)
	}
	if p.DenseModel == "" {
		return fmt.Errorf("dense_model is empty")
	}
	if err := localFile("dense_model", p.DenseModel); err != nil {
		return err
	}
	if p.CPUModel != "" {
		if err := localFile("cpu_model", p.CPUModel); err != nil {
			return err
		}
	}
	if p.PreModel != "" {
		if p.Version < 3 {
			return fmt.Errorf("pre_model in a version %d plan (it came in version 3)", p.Version)
		}
		if err := localFile("pre_model", p.PreModel); err != nil {
			return err
		}
	}
	if err := p.validateBatch(); err != nil {
		return err
	}
	if len(p.Inputs) == 0 {
		return fmt.Errorf("inputs: none")
	}
	inputs := map[string]bool{}
	inputInfo := map[string]TensorInfo{}
	for i, in := range p.Inputs {
		inputInfo[in.Name] = in
		if err := checkTensor(fmt.Sprintf("inputs[%d]", i), in); err != nil {
			return err
		}
		if inputs[in.Name] {
			return fmt.Errorf("inputs[%d]: input %q listed twice", i, in.Name)
		}
		inputs[in.Name] = true
		if err := checkKeys(fmt.Sprintf("inputs[%d]", i), in); err != nil {
			return err
		}
		for _, s := range in.Sides {
			if s != CPU && s != GPU {
				return fmt.Errorf("inputs[%d] %q: side %q, want %q or %q", i, in.Name, s, CPU, GPU)
			}
		}
	}
	if len(p.Outputs) == 0 {
		return fmt.Errorf("outputs: none")
	}
	for i, out := range p.Outputs {
		if err := checkTensor(fmt.Sprintf("outputs[%d]", i), out); err != nil {
			return err
		}
	}
	switch {
	case p.TaskOutputs < 0 || p.TaskOutputs > len(p.Outputs):
		return fmt.Errorf("task_outputs %d: the plan has %d outputs", p.TaskOutputs, len(p.Outputs))
	case p.TaskOutputs > 1 && p.Version < 5:
		return fmt.Errorf("task_outputs in a version %d plan (it came in version 5)", p.Version)
	}
	cut := map[string]bool{}
	for i, c := range p.Cut {
		if err := checkTensor(fmt.Sprintf("cut[%d]", i), c.TensorInfo); err != nil {
			return err
		}
		if cut[c.Name] {
			return fmt.Errorf("cut[%d]: tensor %q listed twice", i, c.Name)
		}
		cut[c.Name] = true
		if c.BytesPerSample < -1 {
			return fmt.Errorf("cut[%d] %q: bytes_per_sample %d, want -1 (unknown) or more", i, c.Name, c.BytesPerSample)
		}
		switch c.From {
		case "lookup", "cpu", "input":
		default:
			return fmt.Errorf("cut[%d] %q: from %q, want lookup, cpu or input", i, c.Name, c.From)
		}
	}
	tables := map[string]bool{}
	outputs := map[string]bool{}
	for i, t := range p.Tables {
		where := fmt.Sprintf("tables[%d] %q", i, t.Name)
		switch {
		case t.Name == "":
			return fmt.Errorf("tables[%d]: name is empty", i)
		case tables[t.Name]:
			return fmt.Errorf("%s: listed twice", where)
		case t.Rows <= 0:
			return fmt.Errorf("%s: rows %d, want > 0", where, t.Rows)
		case t.Dim <= 0:
			return fmt.Errorf("%s: dim %d, want > 0", where, t.Dim)
		case t.Dim > MaxDim:
			return fmt.Errorf("%s: dim %d, want at most %d", where, t.Dim, MaxDim)
		case t.Rows > math.MaxInt64/4/int64(t.Dim):
			return fmt.Errorf("%s: %d rows of %d float32 overflow a byte count", where, t.Rows, t.Dim)
		case len(t.Lookups) == 0:
			return fmt.Errorf("%s: no lookups", where)
		}
		tables[t.Name] = true
		if err := localFile(where+" file", t.File); err != nil {
			return err
		}
		for r, f := range t.RowFactors {
			if r < 0 || r >= t.Rows || math.IsNaN(float64(f)) || math.IsInf(float64(f), 0) {
				return fmt.Errorf("%s: row_factors: row %d factor %g, want a row in [0, %d) and a finite factor", where, r, f, t.Rows)
			}
		}
		switch t.UnknownIDs {
		case "", UnknownError, UnknownHash, UnknownZero:
		default:
			return fmt.Errorf("%s: unknown_ids %q, want error, hash or zero", where, t.UnknownIDs)
		}
		for j, l := range t.Lookups {
			lw := fmt.Sprintf("%s lookups[%d]", where, j)
			switch {
			case l.Input == "":
				return fmt.Errorf("%s: input is empty", lw)
			case !inputs[l.Input]:
				return fmt.Errorf("%s: input %q is not a model input", lw, l.Input)
			case l.Weights != "" && !inputs[l.Weights]:
				return fmt.Errorf("%s: weights %q is not a model input", lw, l.Weights)
			case l.Bag < 1:
				return fmt.Errorf("%s: bag %d, want >= 1", lw, l.Bag)
			case l.Bag > MaxBag:
				return fmt.Errorf("%s: bag %d, want at most %d", lw, l.Bag, MaxBag)
			case l.Rank1 && l.Bag != 1:
				return fmt.Errorf("%s: rank1 with bag %d, want 1", lw, l.Bag)
			case l.Output == "":
				return fmt.Errorf("%s: output is empty", lw)
			case outputs[l.Output]:
				return fmt.Errorf("%s: output %q produced twice", lw, l.Output)
			}
			switch l.Pooling {
			case PoolNone, PoolSum, PoolMean, PoolMax:
			default:
				return fmt.Errorf("%s: pooling %q, want none, sum, mean or max", lw, l.Pooling)
			}
			if len(l.Pre) > 0 {
				if err := checkPre(p.Version, lw, inputInfo[l.Input], inputInfo[l.Weights], l); err != nil {
					return err
				}
			}
			if l.PreOutput != "" || len(l.PreInputs) > 0 {
				if err := p.checkPreOutput(lw, inputs, l); err != nil {
					return err
				}
			}
			outputs[l.Output] = true
		}
	}
	if err := p.validateJagged(); err != nil {
		return err
	}
	return p.ValidateSharding()
}

func checkTensor(where string, t TensorInfo) error {
	if t.Name == "" {
		return fmt.Errorf("%s: name is empty", where)
	}
	if t.DType == "" {
		return fmt.Errorf("%s %q: dtype is empty", where, t.Name)
	}
	if t.Keys != nil && !strings.HasPrefix(where, "inputs[") {
		return fmt.Errorf("%s %q: keys on a tensor that is not a model input", where, t.Name)
	}
	n := int64(1)
	for _, d := range t.Shape {
		if d < -1 {
			return fmt.Errorf("%s %q: shape %v: dimension %d, want -1 (unknown) or more", where, t.Name, t.Shape, d)
		}
		if d > 0 {
			if n > MaxSampleElements/d {
				return fmt.Errorf("%s %q: shape %v: more than %d values per sample", where, t.Name, t.Shape, MaxSampleElements)
			}
			n *= d
		}
	}
	return nil
}

// localFile refuses a path that leaves the plan folder.
func localFile(field, path string) error {
	if path == "" {
		return fmt.Errorf("%s is empty", field)
	}
	if !filepath.IsLocal(path) {
		return fmt.Errorf("%s %q is not a path inside the plan folder", field, path)
	}
	return nil
}

// checkPre checks a lookup's pre-lookup ops: a version 2 field, applied
// to the input's per-sample shape they must end in integer ids, Bag of
// them per sample (none of axis for Rank1), and a weighted lookup's
// weights (w, the Weights input) must hold one value per id they make,
// not one per value of the input.
func checkPre(version int, where string, in, w TensorInfo, l Lookup) error {
	if version < 2 {
		return fmt.Errorf("%s: pre-lookup ops in a version %d plan (they came in version 2)", where, version)
	}
	switch in.DType {
	case "int64", "int32", "float32":
	default:
		return fmt.Errorf("%s: input %q of dtype %q: pre-lookup ops start from int64, int32 or float32", where, in.Name, in.DType)
	}
	shape, dtype, err := PreShape(in.Shape, in.DType, l.Pre)
	if err != nil {
		return fmt.Errorf("%s: %w", where, err)
	}
	if dtype != "int64" && dtype != "int32" {
		return fmt.Errorf("%s: pre-lookup ops end in %s values, want integer ids (a cast)", where, dtype)
	}
	n := int64(1)
	for _, d := range shape {
		n *= d
	}
	switch {
	case n != int64(l.Bag):
		return fmt.Errorf("%s: pre-lookup ops make %d ids per sample (shape %v), bag is %d", where, n, shape, l.Bag)
	case l.Rank1 != (len(shape) == 0):
		return fmt.Errorf("%s: pre-lookup ops make ids of per-sample shape %v, rank1 is %v", where, shape, l.Rank1)
	}
	if l.Weights != "" {
		width := int64(1)
		for _, d := range w.Shape {
			if d < 0 {
				width = -1 // unknown: the tier checks each request
				break
			}
			width *= d
		}
		if width >= 0 && width != n {
			return fmt.Errorf("%s: weights %q hold %d values per sample, but the pre-lookup ops make %d ids (shape %v): one weight per id", where, l.Weights, width, n, shape)
		}
	}
	return nil
}

// checkPreOutput checks a lookup whose ids come from the plan's
// pre_model (version 3): it names the output and the model inputs it is
// computed from (input the first), and runs no native ops besides.
func (p *Plan) checkPreOutput(where string, inputs map[string]bool, l Lookup) error {
	switch {
	case p.Version < 3:
		return fmt.Errorf("%s: pre_output in a version %d plan (it came in version 3)", where, p.Version)
	case p.PreModel == "":
		return fmt.Errorf("%s: pre_output %q, but the plan has no pre_model", where, l.PreOutput)
	case l.PreOutput == "":
		return fmt.Errorf("%s: pre_inputs without a pre_output", where)
	case len(l.Pre) > 0:
		return fmt.Errorf("%s: both pre-lookup ops and a pre_output %q: the ids come from one or the other", where, l.PreOutput)
	case len(l.PreInputs) == 0 || l.PreInputs[0] != l.Input:
		return fmt.Errorf("%s: pre_inputs %v must start with the lookup's input %q", where, l.PreInputs, l.Input)
	}
	for _, in := range l.PreInputs {
		if !inputs[in] {
			return fmt.Errorf("%s: pre_inputs: %q is not a model input", where, in)
		}
	}
	return nil
}

// validateBatch checks fixed_batch against batch: a fixed batch is the
// exported one, and some node keeps the graph at it.
func (p *Plan) validateBatch() error {
	switch {
	case p.FixedBatch < 0:
		return fmt.Errorf("fixed_batch %d is negative", p.FixedBatch)
	case p.Batch != nil && p.Batch.Exported <= 0:
		return fmt.Errorf("batch: exported %d, want a positive batch size", p.Batch.Exported)
	case p.FixedBatch > 0 && (p.Batch == nil || p.Batch.Exported != p.FixedBatch || len(p.Batch.Blockers) == 0):
		return fmt.Errorf("fixed_batch %d: batch must say the model was exported at that size and name the nodes that keep it there", p.FixedBatch)
	case p.FixedBatch == 0 && p.Batch != nil && len(p.Batch.Blockers) > 0:
		return fmt.Errorf("batch: %d node(s) keep the graph at batch %d, but fixed_batch is not set", len(p.Batch.Blockers), p.Batch.Exported)
	}
	if p.Batch != nil {
		for i, b := range p.Batch.Blockers {
			if b.Side != "" && b.Side != CPU && b.Side != GPU {
				return fmt.Errorf("batch.blockers[%d] %q: side %q, want %q or %q", i, b.Node, b.Side, CPU, GPU)
			}
		}
	}
	return nil
}
