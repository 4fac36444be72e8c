package ort

import "github.com/prism-serve/prism/models"

// BatchInputs turns a batch of samples into session inputs, sharing its
// storage.
func BatchInputs(b *models.Batch) []Input {
	in := make([]Input, len(b.Sig.Inputs))
	for i, spec := range b.Sig.Inputs {
		in[i] = Input{Name: spec.Name, Shape: spec.Shape(b.N), Float32: b.Columns[i].F32, Int64: b.Columns[i].I64}
	}
	return in
}
