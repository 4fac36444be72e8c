package plan

import (
	"crypto/sha256"
	"fmt"
	"hash/fnv"
	"io"
	"os"
)

// Content identifies the model a plan folder serves, the same on every
// worker of either tier that serves a copy of it: the embedding tables'
// content (TablesFingerprint) and the bytes of the plan's ONNX parts
// (dense.onnx, cpu.onnx, pre.onnx; the partitioner writes them with
// their weights inside). A model retrained and partitioned again has
// another; one partitioned again from the same export has the same.
// 16 hex digits (FNV-1a 64 over the parts' SHA-256s).
//
// A plan answering with several task outputs (TaskOutputs, version 5)
// counts them too, in order: the same parts serving other tasks (its
// plan.json edited, or partitioned with other --tasks before the
// partitioner recorded them in dense.onnx) answer every request with
// another number of scores a candidate, so their workers must not be
// paired with, nor a request's micro-batches split over, these. Any
// other plan's content is what earlier releases compute for it.
//
// "" when the plan records no table content (plans of earlier
// releases): the model's identity is then unknown, and the router
// pairs such a worker with any (as earlier releases did).
func (p *Plan) Content(dir string) (string, error) {
	tables := p.TablesFingerprint()
	if tables == "" {
		return "", nil
	}
	h := fnv.New64a()
	fmt.Fprintf(h, "tables %s\n", tables)
	if p.TaskOutputs > 1 {
		fmt.Fprintf(h, "tasks")
		for _, o := range p.Outputs[:min(p.TaskOutputs, len(p.Outputs))] {
			fmt.Fprintf(h, " %q", o.Name)
		}
		fmt.Fprintf(h, "\n")
	}
	for _, part := range []struct{ role, file string }{{"dense", p.DenseModel}, {"cpu", p.CPUModel}, {"pre", p.PreModel}} {
		if part.file == "" {
			continue
		}
		path, err := Resolve(dir, part.file)
		if err != nil {
			return "", err
		}
		sum, err := fileSHA256(path)
		if err != nil {
			return "", fmt.Errorf("plan %s: the content of its %s part: %w", dir, part.role, err)
		}
		if want, ok := p.PartSHA256[part.file]; ok && want != fmt.Sprintf("%x", sum) {
			return "", &PartDamagedError{Role: part.role, Path: path, Want: want, Got: fmt.Sprintf("%x", sum)}
		}
		fmt.Fprintf(h, "%s %x\n", part.role, sum)
	}
	return fmt.Sprintf("%016x", h.Sum64()), nil
}

// PartDamagedError is Content's error for a part whose bytes do not
// match the SHA-256 plan.json records for it (PartSHA256): damaged, or
// replaced after partitioning. Role is "dense", "cpu" or "pre": the tier
// running that part refuses the plan.
type PartDamagedError struct {
	Role, Path, Want, Got string
}

func (e *PartDamagedError) Error() string {
	return fmt.Sprintf("%s does not match the SHA-256 plan.json records for it (%s; the file's is %s): it was damaged or replaced after partitioning; partition the model again, or restore the plan folder from a copy (changed on purpose, optimized or quantized: remove its entry from plan.json's part_sha256)", e.Path, e.Want, e.Got)
}

// PartSum is the SHA-256 (hex) of the part file at path, as PartSHA256
// records it.
func PartSum(path string) (string, error) {
	sum, err := fileSHA256(path)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("%x", sum), nil
}

func fileSHA256(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return nil, err
	}
	return h.Sum(nil), nil
}
