package gpuserve

import (
	"fmt"

	"github.com/prism-serve/prism/internal/flagval"
	"github.com/prism-serve/prism/internal/memlimit"
)

// BatchMemoryError says that a batch of MaxBatch samples of a model's
// dense inputs would not fit in the memory the process may use: its
// warm-up run allocates one at startup, so such a max batch panicked
// (past int64, makeslice: len out of range) or drew the OOM killer.
type BatchMemoryError struct {
	Model     string
	MaxBatch  int
	PerSample int64 // bytes of one sample's dense inputs
	Memory    int64 // bytes the process may use
}

func (e *BatchMemoryError) Error() string {
	return fmt.Sprintf("model %q: a batch of %d samples of its dense inputs (%s a sample) takes more than half of the %s of memory this process may use: want at most %d",
		e.Model, e.MaxBatch, flagval.FormatBytes(e.PerSample), flagval.FormatBytes(e.Memory), e.Largest())
}

// Largest is the largest max batch whose inputs fit.
func (e *BatchMemoryError) Largest() int64 { return e.Memory / 2 / e.PerSample }

// memory is o.Memory, read from the machine when 0.
func (o Options) memory() int64 {
	if o.Memory != 0 {
		return o.Memory
	}
	return memlimit.Read().Effective()
}

// batchFits refuses a max batch whose float32 inputs alone take more
// than half of memory (unknown when 0 or less: no check): the model's
// activations, its weights and the queued requests need the rest.
// Computed by division, so that no size overflows.
func batchFits(model string, spec []InputSpec, maxBatch int, memory int64) error {
	var per int64
	for _, s := range spec {
		per += 4 * int64(s.Width)
	}
	if per <= 0 || memory <= 0 {
		return nil
	}
	if e := (&BatchMemoryError{Model: model, MaxBatch: maxBatch, PerSample: per, Memory: memory}); int64(maxBatch) > e.Largest() {
		return e
	}
	return nil
}
