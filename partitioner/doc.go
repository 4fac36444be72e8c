// Package partitioner cuts an ONNX recommendation model into an
// embedding side (table lookups and cheap CPU work, next to the embedding
// store) and a dense side (run on GPUs through ONNX Runtime), choosing the
// cut that minimises bytes per sample across it plus each side's compute,
// exactly, as a minimum s-t cut.
//
// Its output, a partition folder, is plan.json (see Plan), cpu.onnx,
// dense.onnx and tables/NAME.arrow (internal/tablefile).
package partitioner
