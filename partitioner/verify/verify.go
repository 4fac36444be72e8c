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
}

// Verify scores n fresh random samples (seeded) with the monolithic model
// and with the partition in dir, and fails if any output differs by more
// than Tolerance.
func Verify(modelPath, dir string, n int, seed uint64) (Report, error) {
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
	return VerifySource(modelPath, dir, src, n)
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
				pre = pre || len(l.Pre) > 0
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
	const batch = 256
	for done := 0; done < n; {
		k := min(batch, n-done)
		b, err := src.Next(k)
		if err != nil {
			return rep, fmt.Errorf("verify: samples: %w", err)
		}
		want, err := mono.Run(modelrun.Inputs(b))
		if err != nil {
			return rep, err
		}
		got, err := chain.Run(b)
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
	}
	if rep.MaxAbsErr > Tolerance || math.IsNaN(rep.MaxAbsErr) {
		return rep, fmt.Errorf("verify: partitioned output differs from the monolithic model by %g (> %g)", rep.MaxAbsErr, Tolerance)
	}
	return rep, nil
}
