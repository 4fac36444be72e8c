package verify

import (
	"fmt"
	"github.com/prism-serve/prism/internal/modelrun"
	"math"

	pb "github.com/prism-serve/prism/internal/onnxpb"
	"github.com/prism-serve/prism/internal/ort"
	"github.com/prism-serve/prism/models"
	"github.com/prism-serve/prism/plan"
)

// Tolerance is the largest difference allowed between the chained and the
// monolithic outputs, in float32.
const Tolerance = 1e-5

// Report is the outcome of Verify.
type Report struct {
	Samples   int
	MaxAbsErr float64
	// BatchSizes are the batch sizes the partition ran at, for a model
	// exported with a fixed batch (plan.json batch): the exported size
	// only when the plan keeps it (fixed_batch), sizes other than it
	// when the partitioner rewrote the graph to a symbolic batch.
	BatchSizes []int
}

// Verify scores n fresh random samples (seeded) with the monolithic model
// and with the partition in dir, and fails if any output differs by more
// than Tolerance.
func Verify(modelPath, dir string, n int, seed uint64) (Report, error) {
	return VerifyProgress(modelPath, dir, n, seed, nil)
}

// VerifyProgress is Verify calling progress (if set) after each chunk
// of samples: done of n.
func VerifyProgress(modelPath, dir string, n int, seed uint64, progress func(done, n int)) (Report, error) {
	if n <= 0 {
		return Report{}, fmt.Errorf("verify: need at least one sample")
	}
	meta, err := pb.ReadModel(modelPath, pb.ReadOptions{SkipExternalData: true})
	if err != nil {
		return Report{}, err
	}
	sig, err := signature(meta, dir)
	if err != nil {
		return Report{}, fmt.Errorf("verify %q: %w", modelPath, err)
	}
	src, err := models.NewSynthetic(sig, models.SyntheticOptions{Seed: seed})
	if err != nil {
		return Report{}, err
	}
	return verifySource(modelPath, dir, src, n, progress)
}

// signature is what the samples of Verify are drawn for: the model's
// inputs as its graph shows them (models.InferSignature), unless the
// plan's lookups run pre-lookup ops or the graph does not explain its
// ids; then the plan's (models.PlanSignature: valid ids worked back from
// the tables through the pre-lookup ops).
func signature(meta *pb.ModelProto, dir string) (models.Signature, error) {
	p, perr := plan.Read(dir)
	pre := false
	if perr == nil {
		for _, t := range p.Tables {
			for _, l := range t.Lookups {
				pre = pre || len(l.Pre) > 0 || l.Offsets != "" || l.PreOutput != ""
			}
		}
	}
	if !pre {
		sig, err := models.InferSignature(meta)
		if err == nil || perr != nil {
			return sig, err
		}
	}
	if perr != nil {
		return models.Signature{}, perr
	}
	return models.PlanSignature(p)
}

// VerifySource is Verify on n samples drawn from src, for a caller that
// knows better what valid inputs are.
func VerifySource(modelPath, dir string, src models.Source, n int) (Report, error) {
	return verifySource(modelPath, dir, src, n, nil)
}

func verifySource(modelPath, dir string, src models.Source, n int, progress func(done, n int)) (Report, error) {
	if n <= 0 {
		return Report{}, fmt.Errorf("verify: need at least one sample")
	}
	so := ort.SessionOptions{IntraOpThreads: 1}
	mono, err := ort.NewSession(modelPath, so)
	if err != nil {
		return Report{}, err
	}
	defer mono.Close()
	chain, err := Open(dir, so)
	if err != nil {
		return Report{}, err
	}
	defer chain.Close()
	rep := Report{}
	batch := 256
	// A model exported with a fixed batch B runs whole only in batches
	// of B: the reference runs in chunks of B, and the partition at
	// other sizes (proving the rewrite to a symbolic batch), or at B
	// when the plan keeps it fixed.
	var exported int
	var sizes []int
	if bi := chain.Plan.Batch; bi != nil {
		exported = int(bi.Exported)
		batch = max(1, 256/exported) * exported
		n += (exported - n%exported) % exported
		if chain.Plan.FixedBatch > 0 {
			sizes = []int{exported}
		} else {
			for _, s := range []int{1, 3, 7, 2*exported + 1, 64} {
				if s != exported {
					sizes = append(sizes, s)
				}
			}
		}
	}
	seen := map[int]bool{}
	next := 0
	for done := 0; done < n; {
		k := min(batch, n-done)
		b, err := src.Next(k)
		if err != nil {
			return rep, fmt.Errorf("verify: samples: %w", err)
		}
		want, err := runChunks(k, exported, func(i, j int) ([][]float32, error) { return mono.Run(modelrun.Inputs(b.Slice(i, j))) })
		if err != nil {
			return rep, err
		}
		var got [][]float32
		if sizes == nil {
			got, err = chain.Run(b)
		} else {
			got, err = runSizes(k, sizes, &next, func(i, j int) ([][]float32, error) {
				if !seen[j-i] {
					seen[j-i] = true
					rep.BatchSizes = append(rep.BatchSizes, j-i)
				}
				return chain.Run(b.Slice(i, j))
			})
		}
		if err != nil {
			return rep, fmt.Errorf("verify: partitioned model: %w", err)
		}
		if len(got) != len(want) {
			return rep, fmt.Errorf("verify: partition has %d outputs, the model %d", len(got), len(want))
		}
		for o := range want {
			if len(got[o]) != len(want[o]) {
				return rep, fmt.Errorf("verify: output %d has %d values, the model's %d", o, len(got[o]), len(want[o]))
			}
			for i := range want[o] {
				rep.MaxAbsErr = max(rep.MaxAbsErr, math.Abs(float64(got[o][i])-float64(want[o][i])))
			}
		}
		done += k
		rep.Samples = done
		if progress != nil {
			progress(done, n)
		}
	}
	if rep.MaxAbsErr > Tolerance || math.IsNaN(rep.MaxAbsErr) {
		return rep, fmt.Errorf("verify: partitioned output differs from the monolithic model by %g (> %g)", rep.MaxAbsErr, Tolerance)
	}
	return rep, nil
}

// runChunks runs samples [0, k) in chunks of size (all at once for 0)
// and joins the outputs.
func runChunks(k, size int, run func(i, j int) ([][]float32, error)) ([][]float32, error) {
	if size == 0 {
		return run(0, k)
	}
	var out [][]float32
	for i := 0; i < k; i += size {
		o, err := run(i, min(i+size, k))
		if err != nil {
			return nil, err
		}
		out = joinOutputs(out, o)
	}
	return out, nil
}

// runSizes runs samples [0, k) in batches whose sizes cycle through
// sizes (from *next on; a fixed size is never cut short) and joins the
// outputs.
func runSizes(k int, sizes []int, next *int, run func(i, j int) ([][]float32, error)) ([][]float32, error) {
	var out [][]float32
	for i := 0; i < k; {
		s := sizes[*next%len(sizes)]
		*next++
		if len(sizes) > 1 {
			s = min(s, k-i)
		}
		o, err := run(i, i+s)
		if err != nil {
			return nil, err
		}
		out = joinOutputs(out, o)
		i += s
	}
	return out, nil
}

func joinOutputs(acc, o [][]float32) [][]float32 {
	if acc == nil {
		return o
	}
	for i := range acc {
		if i < len(o) {
			acc[i] = append(acc[i], o[i]...)
		}
	}
	return acc
}
