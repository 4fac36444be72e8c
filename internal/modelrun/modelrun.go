// Package modelrun joins the model zoo's sample batches to ONNX Runtime
// sessions. It sits above both, so internal/ort stays free of the zoo.
package modelrun

import (
	"github.com/prism-serve/prism/internal/ort"
	"github.com/prism-serve/prism/models"
)

// Inputs turns a batch of samples into session inputs that share its
// storage: the caller keeps b unchanged until the run returns.
func Inputs(b *models.Batch) []ort.Input {
	in := make([]ort.Input, len(b.Sig.Inputs))
	for i, spec := range b.Sig.Inputs {
		in[i] = ort.Input{Name: spec.Name, Shape: b.Shape(i), Float32: b.Columns[i].F32, Int64: b.Columns[i].I64}
	}
	return in
}
