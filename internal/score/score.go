// Package score runs a whole model in one ONNX Runtime session on
// synthetic or Criteo samples (prism score): the monolithic reference
// every correctness check compares against, and the baseline every
// performance figure is a ratio against.
package score

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/prism-serve/prism/internal/atomicfile"
	"github.com/prism-serve/prism/internal/flagval"
	"github.com/prism-serve/prism/internal/memlimit"
	"github.com/prism-serve/prism/internal/modelrun"
	pb "github.com/prism-serve/prism/internal/onnxpb"
	"github.com/prism-serve/prism/internal/ort"
	"github.com/prism-serve/prism/internal/progress"
	"github.com/prism-serve/prism/models"
	"github.com/prism-serve/prism/plan"
)

// Options configure Run.
type Options struct {
	// Samples synthetic samples are scored, unless Criteo names a file
	// (TSV, or CSV/TSV with a header) whose rows are scored instead.
	Samples int
	Criteo  string
	// Plan, when set, is the model's partition folder: the samples follow
	// its inputs (models.PlanSignature: packed ids, ids among float
	// values, each value's valid range) instead of what the graph alone
	// shows (models.InferSignature).
	Plan string
	// Batch is the samples per ONNX Runtime run.
	Batch int
	// Threads are ONNX Runtime's intra-op threads (0: one per core).
	Threads int
	// Seed and Zipf draw the synthetic samples.
	Seed uint64
	Zipf float64
	// Show prints the first Show scores.
	Show int
	// ScoresOut, when set, receives every score, one sample a line (a
	// multi-task model's tasks values apart by a space).
	ScoresOut string
	// Warmup batches run untimed first.
	Warmup int
	// Progress, when set, receives a progress bar of a Criteo file's
	// bytes read (stderr: a whole train.txt takes hours).
	Progress io.Writer

	// fixed: the model takes batches of Batch samples only (Run sets
	// it): a Criteo file's last, shorter batch is left out.
	fixed bool
}

// Validate reports options that cannot work.
func (o *Options) Validate() error {
	if o.Batch <= 0 {
		return fmt.Errorf("batch %d: want > 0", o.Batch)
	}
	if o.Samples <= 0 && o.Criteo == "" {
		return fmt.Errorf("samples %d: want > 0", o.Samples)
	}
	if o.Threads < 0 {
		return fmt.Errorf("threads %d: want >= 0", o.Threads)
	}
	return nil
}

// Run scores the model at path and prints the first scores and the
// summary (samples/s, batch latency p50 and p99; the log loss for
// labelled rows) to w.
func Run(w io.Writer, path string, o Options) error {
	if err := o.Validate(); err != nil {
		return fmt.Errorf("score: %w", err)
	}
	meta, err := pb.ReadModel(path, pb.ReadOptions{SkipExternalData: true})
	if err != nil {
		return err
	}
	if fb := fixedBatch(meta); fb > 0 {
		// An export with a fixed batch (torch.onnx.export without
		// dynamic axes) takes batches of that size only: ONNX Runtime's
		// own error says "invalid dimensions" over three lines.
		if o.Criteo == "" && o.Samples%fb != 0 {
			return fmt.Errorf("score %q: the model's inputs have a fixed batch of %d (exported so): give --samples a multiple of %d", path, fb, fb)
		}
		if o.Batch != fb {
			fmt.Fprintf(w, "score: the model's inputs have a fixed batch of %d: batches of %d\n", fb, fb)
			o.Batch = fb
		}
		o.fixed = true
	}
	sig, err := signature(meta, o.Plan)
	if err != nil {
		return fmt.Errorf("score %q: %w", path, err)
	}
	// The scores file is opened before any scoring, so a folder that is
	// missing or not writable fails at once, not after an hour of a
	// Criteo file; it is written under a temporary name beside the path
	// and renamed at the end, so a failure never leaves a part of it.
	var sink *atomicfile.File
	if o.ScoresOut != "" {
		if sink, err = createScores(o.ScoresOut); err != nil {
			return err
		}
		defer sink.Abort()
	}
	// Synthetic batches are drawn before timing; a Criteo file's are
	// read one at a time (the whole of train.txt, 45M rows, would take
	// more than 11 GB held at once), and only the runs are timed.
	next, closeSrc, err := batches(sig, o)
	if err != nil {
		return err
	}
	defer closeSrc()
	// Only the score is computed (as the dense tier does): the output
	// named models.ScoreOutput, else the first.
	graphOuts := meta.GetGraph().GetOutput()
	if len(graphOuts) == 0 {
		return fmt.Errorf("score %q: the model has no outputs", path)
	}
	outName := graphOuts[0].GetName()
	for _, out := range graphOuts {
		if out.GetName() == models.ScoreOutput {
			outName = out.GetName()
		}
	}
	outNames, widths, err := planScores(o.Plan, outName, graphOuts)
	if err != nil {
		return fmt.Errorf("score %q: %w", path, err)
	}
	tasks := 0
	for _, w := range widths {
		tasks += w
	}
	sess, err := ort.NewSession(path, ort.SessionOptions{IntraOpThreads: o.Threads, Outputs: outNames})
	if err != nil {
		return err
	}
	defer sess.Close()
	first, firstLabels, err := next()
	if err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	for i := 0; i < o.Warmup && first != nil; i++ {
		if _, err := sess.Run(modelrun.Inputs(first)); err != nil {
			return err
		}
	}
	var scores, labels []float32
	var lat []time.Duration
	var busy time.Duration
	for b, bl := first, firstLabels; b != nil; {
		t0 := time.Now()
		out, err := sess.Run(modelrun.Inputs(b))
		if err != nil {
			return err
		}
		d := time.Since(t0)
		lat, busy = append(lat, d), busy+d
		for j, w := range widths {
			if len(out[j]) == b.N*w {
				continue
			}
			// Two class probabilities a sample were counted as two
			// samples, and the log loss paired labels with other values.
			if tasks > 1 {
				return fmt.Errorf("score %q: output %q has %d values for %d samples: want %d a sample (the plan's %d tasks)", path, outNames[j], len(out[j]), b.N, w, tasks)
			}
			return fmt.Errorf("score %q: output %q has %d values for %d samples: want one score per sample", path, outNames[j], len(out[j]), b.N)
		}
		// Sample-major, the task outputs' values interleaved as the
		// dense tier answers.
		for i := range b.N {
			for j, w := range widths {
				scores = append(scores, out[j][i*w:(i+1)*w]...)
			}
		}
		labels = append(labels, bl...)
		if b, bl, err = next(); err != nil && !errors.Is(err, io.EOF) {
			return err
		}
	}

	// A multi-task model's scores are tasks a sample, sample-major; the
	// samples, their rate and the log loss (of a click label: task 0's)
	// count samples.
	all := scores
	if tasks > 1 {
		scores = make([]float32, len(all)/tasks)
		for i := range scores {
			scores[i] = all[i*tasks]
		}
	}
	for i := 0; i < o.Show && i < len(scores); i++ {
		score := fmt.Sprintf("score %.6f", scores[i])
		if tasks > 1 {
			score = "scores"
			for _, v := range all[i*tasks : (i+1)*tasks] {
				score += fmt.Sprintf(" %.6f", v)
			}
		}
		if o.Criteo != "" {
			fmt.Fprintf(w, "sample %d: %s label %g\n", i, score, labels[i])
		} else {
			fmt.Fprintf(w, "sample %d: %s\n", i, score)
		}
	}
	if sink != nil {
		if err := commitScores(sink, all, tasks); err != nil {
			return err
		}
	}
	slices.Sort(lat)
	threads := fmt.Sprint(o.Threads)
	if o.Threads == 0 {
		threads = "auto"
	}
	rate := 0.0 // no batch (an empty file): no run timed
	if busy > 0 {
		rate = float64(len(scores)) / busy.Seconds()
	}
	fmt.Fprintf(w, "scored %d samples in %d batches of up to %d, threads=%s: %.0f samples/s; batch latency p50 %s p99 %s\n",
		len(scores), len(lat), o.Batch, threads, rate, percentile(lat, 0.5), percentile(lat, 0.99))
	if o.Criteo != "" {
		fmt.Fprintf(w, "log loss on %d labelled rows: %.4f\n", len(labels), LogLoss(scores, labels))
	}
	return nil
}

// planScores is the outputs scored and the values a sample of each:
// the score output outName, one value a sample, without a plan (dir ""),
// as a model is scored; with the plan in dir, the outputs the dense tier
// answers with (plan.TaskWidths: one score, a multi-task model's [k], or
// its task outputs), when the model has them all.
func planScores(dir, outName string, graphOuts []*pb.ValueInfoProto) ([]string, []int, error) {
	if dir == "" {
		return []string{outName}, []int{1}, nil
	}
	p, err := plan.Read(dir)
	if err != nil {
		return nil, nil, err
	}
	widths, err := p.TaskWidths()
	if err != nil {
		return nil, nil, err
	}
	names := make([]string, len(widths))
	for i := range widths {
		names[i] = p.Outputs[i].Name
		if !slices.ContainsFunc(graphOuts, func(o *pb.ValueInfoProto) bool { return o.GetName() == names[i] }) {
			return []string{outName}, []int{1}, nil
		}
	}
	return names, widths, nil
}

// signature is the model's inputs: from the plan in dir when given,
// else from the graph.
func signature(meta *pb.ModelProto, dir string) (models.Signature, error) {
	if dir == "" {
		sig, err := models.InferSignature(meta)
		if err != nil {
			return sig, fmt.Errorf("%w (a model whose ids are packed or computed: score it with its partition's plan)", err)
		}
		return sig, nil
	}
	p, err := plan.Read(dir)
	if err != nil {
		return models.Signature{}, err
	}
	have := map[string]bool{}
	for _, in := range meta.GetGraph().GetInput() {
		have[in.GetName()] = true
	}
	for _, in := range p.Inputs {
		if !have[in.Name] {
			return models.Signature{}, fmt.Errorf("the plan in %s has input %q, the model none of that name: not this model's plan", dir, in.Name)
		}
	}
	return models.PlanSignature(p)
}

// batches returns the batches to score one at a time (nil and io.EOF
// after the last), with their labels for a Criteo file's: o.Samples
// synthetic samples, drawn at once up front; or the file's rows, read a
// batch at a time. done closes the file.
func batches(sig models.Signature, o Options) (next func() (*models.Batch, []float32, error), done func(), err error) {
	if o.Criteo == "" {
		bs, err := draw(sig, o)
		if err != nil {
			return nil, nil, err
		}
		return func() (*models.Batch, []float32, error) {
			if len(bs) == 0 {
				return nil, nil, io.EOF
			}
			b := bs[0]
			bs = bs[1:]
			return b, nil, nil
		}, func() {}, nil
	}
	file, err := os.Open(o.Criteo)
	if err != nil {
		return nil, nil, fmt.Errorf("score: %w", err)
	}
	read := &countingReader{r: file}
	var bar *progress.Bar
	if st, err := file.Stat(); err == nil && o.Progress != nil && st.Mode().IsRegular() {
		bar = progress.New(o.Progress, "scoring "+filepath.Base(o.Criteo), st.Size(), true)
	}
	src, err := models.NewCriteo(bufio.NewReader(read), o.Criteo, sig)
	if err != nil {
		file.Close()
		return nil, nil, err
	}
	return func() (*models.Batch, []float32, error) {
		b, err := src.Next(o.Batch)
		if bar != nil {
			bar.Set(read.n)
			if err != nil {
				bar.Done()
			}
		}
		if err != nil {
			return nil, nil, err
		}
		if o.fixed && b.N < o.Batch {
			// A model of a fixed batch scores whole batches only.
			return nil, nil, io.EOF
		}
		// Labels reuses its slice at each Next.
		return b, slices.Clone(src.Labels()), nil
	}, func() { file.Close() }, nil
}

// countingReader counts the bytes read through it.
type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// draw makes o.Samples synthetic samples up front, cut into batches.
func draw(sig models.Signature, o Options) ([]*models.Batch, error) {
	if err := drawFits(sig, o.Samples, memlimit.Read().Effective()); err != nil {
		return nil, err
	}
	var batches []*models.Batch
	src, err := models.NewSynthetic(sig, models.SyntheticOptions{Seed: o.Seed, ZipfS: o.Zipf})
	if err != nil {
		return nil, err
	}
	// Drawn at once, then cut into batches: the source draws a batch
	// input by input, so drawn per batch the samples (and the scores
	// a user compares) changed with --batch.
	all, err := src.Next(o.Samples)
	if err != nil {
		return nil, err
	}
	for i := 0; i < o.Samples; i += o.Batch {
		batches = append(batches, all.Slice(i, min(i+o.Batch, o.Samples)))
	}
	return batches, nil
}

// fixedBatch is the batch size fixed in the model's first graph input
// (not an initializer), 0 when it is symbolic or unknown.
func fixedBatch(meta *pb.ModelProto) int {
	g := meta.GetGraph()
	inits := map[string]bool{}
	for _, t := range g.GetInitializer() {
		inits[t.GetName()] = true
	}
	for _, in := range g.GetInput() {
		if inits[in.GetName()] {
			continue
		}
		dims := in.GetType().GetTensorType().GetShape().GetDim()
		if len(dims) == 0 {
			return 0
		}
		return int(dims[0].GetDimValue())
	}
	return 0
}

// percentile of sorted latencies by nearest rank: the smallest value
// at or above which no more than 1-p of them lie (the ceil(p*n)-th), as
// loadgen's histograms give it. The p99 of 100 batches is the 99th, not
// the slowest.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(p*float64(len(sorted)))) - 1
	return sorted[min(len(sorted)-1, max(0, i))]
}

// WriteScores writes scores to path, one a line: whole or not at all
// (a failure, a full disk, leaves path as it was).
func WriteScores(path string, scores []float32) error {
	sf, err := createScores(path)
	if err != nil {
		return err
	}
	defer sf.Abort()
	return commitScores(sf, scores, 1)
}

// createScores opens path's scores file (internal/atomicfile: renamed
// into place by commitScores, or written straight into a stream); its
// error names path.
func createScores(path string) (*atomicfile.File, error) {
	f, err := atomicfile.Create(path)
	if err != nil {
		return nil, fmt.Errorf("write scores: %w", err)
	}
	return f, nil
}

// commitScores writes scores of tasks values a sample, sample-major:
// one sample a line, its values apart by a space; and puts f in place.
func commitScores(f *atomicfile.File, scores []float32, tasks int) error {
	w := bufio.NewWriter(f)
	for i, s := range scores {
		sep := byte('\n')
		if tasks > 1 && (i+1)%tasks != 0 {
			sep = ' '
		}
		fmt.Fprintf(w, "%.8g%c", s, sep)
	}
	if err := w.Flush(); err != nil {
		return fmt.Errorf("write scores %q: %w", f.Name(), err)
	}
	if err := f.Commit(0o644); err != nil {
		return fmt.Errorf("write scores: %w", err)
	}
	return nil
}

// LogLoss is the mean binary cross-entropy of predictions p against
// labels y (> 0.5 is positive), with p clipped away from 0 and 1.
func LogLoss(p, y []float32) float64 {
	var s float64
	for i := range y {
		q := min(max(float64(p[i]), 1e-7), 1-1e-7)
		if y[i] > 0.5 {
			s -= math.Log(q)
		} else {
			s -= math.Log(1 - q)
		}
	}
	return s / float64(len(y))
}

// drawFits refuses synthetic samples whose inputs, drawn at once (8
// bytes a value, the widest an input takes), would take more than half
// of memory bytes (0: unknown, no check): --samples 1000000000000 ended
// in "fatal error: runtime: out of memory" and a stack trace. In
// float64: no product overflows.
func drawFits(sig models.Signature, samples int, memory int64) error {
	width := 0
	for _, in := range sig.Inputs {
		width += max(in.Width, 1)
	}
	if memory <= 0 || width == 0 {
		return nil
	}
	if b := float64(samples) * float64(width) * 8; b > float64(memory)/2 {
		return fmt.Errorf("score: --samples %d: drawn at once, their %d input values a sample take %s, more than half of the %s of memory this process may use: want at most %d",
			samples, width, flagval.FormatBytes(int64(min(b, 1<<62))), flagval.FormatBytes(memory), memory/2/int64(width*8))
	}
	return nil
}
