// Package plan is the plan.json contract between the partitioner, which
// writes a plan folder (plan.json, cpu.onnx, dense.onnx, tables/*.arrow),
// and the tiers and tools that read it. It imports nothing of Prism, so
// reading a plan never links the compiler.
package plan

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/prism-serve/prism/internal/atomicfile"
)

// Version is the version of plan.json this build writes. Version 2 adds
// a lookup's pre-lookup ops (Lookup.Pre); version 3 the pre-lookup
// subgraph run through ONNX Runtime (Plan.PreModel, Lookup.PreOutput,
// Lookup.PreInputs); version 4 jagged inputs (TensorInfo.Offsets,
// Lookup.Offsets, Lookup.LastOffset: an EmbeddingBag with offsets);
// version 5 a model answering with several outputs (Plan.TaskOutputs).
// This build also reads version 1 to 4 plans, which have none of the
// later fields (MinVersion). The partitioner writes the oldest version
// that holds the plan's fields (WriteVersion), so a plan needing none of
// version 5's is still read by builds of version 4.
const Version = 5

// MinVersion is the oldest plan.json version this build reads.
const MinVersion = 1

// File is the plan's file name in a partition folder.
const File = "plan.json"

// Plan is plan.json: everything the serving tiers need to run a model
// split in two. Field names are the JSON the README documents.
type Plan struct {
	Version int `json:"version"`
	// Model names the source model.
	Model ModelInfo `json:"model"`
	// Inputs are the source model's inputs, with the side(s) that read them.
	Inputs []TensorInfo `json:"inputs"`
	// Outputs are the source model's outputs (all produced by dense.onnx).
	// The first is the score the dense tier answers with, or the first
	// TaskOutputs of them.
	Outputs []TensorInfo `json:"outputs"`
	// TaskOutputs (version 5), when more than 1, is how many of Outputs,
	// from the first, are the model's tasks: a multi-task model exported
	// with one output per task (PyTorch returning a tuple of heads,
	// HugeCTR's MMoE with one label per task). The dense tier answers
	// with all of them, sample-major in this order (Tasks, TaskNames). 0
	// or 1: the first output alone.
	TaskOutputs int `json:"task_outputs,omitempty"`
	// Cut lists the tensors that cross from the CPU side to the dense side:
	// exactly dense.onnx's inputs, in its input order.
	Cut []CutTensor `json:"cut"`
	// Tables are the embedding tables that left the graph, each once.
	Tables []Table `json:"tables"`
	// CPUModel is the CPU subgraph file ("cpu.onnx"), "" when there is
	// no CPU work besides the lookups. Its inputs are model inputs and
	// lookup outputs; its outputs are cut tensors.
	CPUModel string `json:"cpu_model,omitempty"`
	// DenseModel is the dense subgraph file ("dense.onnx").
	DenseModel string `json:"dense_model"`
	// PreModel (version 3) is the pre-lookup subgraph file ("pre.onnx"),
	// "" when every lookup's ids are a model input or made by native
	// pre-lookup ops. It holds the integer work between the model inputs
	// and the ids of the lookups the native ops do not cover: its inputs
	// are model inputs, its outputs (int64 or int32) the ids the lookups
	// naming them in PreOutput read. The embedding tier runs it through
	// ONNX Runtime on each micro-batch before the lookups.
	PreModel string `json:"pre_model,omitempty"`
	// PartSHA256 is, per ONNX part file the partitioner wrote (DenseModel,
	// CPUModel, PreModel), the SHA-256 of its bytes (hex): a part damaged
	// or replaced since is refused when a tier loads it (Content), where
	// it would otherwise score with other weights without a word. Plans
	// of earlier releases have none (not checked).
	PartSHA256 map[string]string `json:"part_sha256,omitempty"`
	// Cost is the cost report of the chosen cut.
	Cost CostReport `json:"cost"`
	// Sharding, if set, spreads the tables over shards (shard.go).
	Sharding *Sharding `json:"sharding,omitempty"`
	// Batch, set for a model exported with a fixed batch size (a number
	// as its inputs' first dimension), says what the partitioner made
	// of it: the nodes it rewrote to a symbolic batch, and the nodes
	// that tie the graph to the exported size.
	Batch *BatchInfo `json:"batch,omitempty"`
	// FixedBatch, when not 0, is the only batch size the parts run at
	// (Batch.Blockers say why): the embedding tier refuses a request of
	// any other number of candidates.
	FixedBatch int64 `json:"fixed_batch,omitempty"`
}

// BatchInfo is what the partitioner made of a fixed exported batch.
type BatchInfo struct {
	// Exported is the batch size in the model's inputs.
	Exported int64 `json:"exported"`
	// Rewritten names the nodes whose shape constants were rewritten to
	// a symbolic batch (-1 where the batch is).
	Rewritten []string `json:"rewritten,omitempty"`
	// Blockers are the nodes that keep the graph at the exported batch.
	Blockers []BatchBlocker `json:"blockers,omitempty"`
}

// BatchBlocker is a node that ties a graph to its exported batch size.
type BatchBlocker struct {
	Node   string `json:"node"`
	Op     string `json:"op"`
	Reason string `json:"reason"`
	// Side is where the node runs: "cpu" (the embedding tier: cpu.onnx
	// or a lookup's pre-lookup ops) or "gpu" (dense.onnx).
	Side Side `json:"side,omitempty"`
}

// ModelInfo identifies the source model.
type ModelInfo struct {
	Name  string `json:"name"`
	Path  string `json:"path"`
	Opset int64  `json:"opset"`
}

// Side is where a node or tensor lives.
type Side string

const (
	CPU Side = "cpu"
	GPU Side = "gpu"
)

// TensorInfo is a named tensor with its element type and per-sample
// shape (the batch dimension left out; -1 for a dimension not known).
type TensorInfo struct {
	Name  string  `json:"name"`
	DType string  `json:"dtype"`
	Shape []int64 `json:"shape"`
	// Sides that read a model input: "cpu", "gpu" or both.
	Sides []Side `json:"sides,omitempty"`
	// Offsets (version 4), set on a jagged model input, names the model
	// input holding where each sample's values start in it (jagged.go):
	// the input is 1-D, every sample's values concatenated, and Shape
	// ([]) says nothing of a sample's count.
	Offsets string `json:"offsets,omitempty"`
	// Keys, set on an integer model input whose ids reach the lookups
	// through a key map (a Gather on a constant integer tensor in
	// pre.onnx, as HugeCTR's key_to_indice_hash_all_tables maps its
	// hash keys to rows), are values it may take: keys the map sends to
	// valid rows of every table the input reaches, as sorted, disjoint
	// ranges (at most MaxKeyRanges: all of them, or the largest). Any
	// other value may fail the model (a Gather out of bounds). Only
	// what draws samples from a plan reads it (synthetic requests,
	// verification, scoring); left out when every id in [0, rows) is
	// valid, and ignored by a build that does not know it, so it needs
	// no new version.
	Keys []KeyRange `json:"keys,omitempty"`
}

// CutTensor is a tensor sent from the CPU side to the dense side.
type CutTensor struct {
	TensorInfo
	// BytesPerSample is its size for one sample (-1 when not known).
	BytesPerSample int64 `json:"bytes_per_sample"`
	// From says what produces it: "lookup" (a table lookup's output),
	// "cpu" (cpu.onnx), or "input" (a model input passed through).
	From string `json:"from"`
}

// Pooling is how a lookup combines the rows of one sample's bag.
type Pooling string

const (
	PoolNone Pooling = "none" // no bag axis reduction: [batch, (bag,) dim]
	PoolSum  Pooling = "sum"
	PoolMean Pooling = "mean"
	PoolMax  Pooling = "max"
)

// UnknownIDs is what a lookup does with an id outside its table.
type UnknownIDs string

const (
	UnknownError UnknownIDs = "error" // the default
	UnknownHash  UnknownIDs = "hash"  // id modulo rows
	UnknownZero  UnknownIDs = "zero"  // a zero vector
)

// Table is an embedding table written to tables/NAME.arrow.
type Table struct {
	Name  string `json:"name"`
	File  string `json:"file"` // relative to the plan folder
	Rows  int64  `json:"rows"`
	Dim   int    `json:"dim"`
	DType string `json:"dtype"`
	// SHA256 is the content hash (internal/tablefile): equal hashes, equal tables.
	SHA256 string `json:"sha256"`
	// UnknownIDs: "error" (default), "hash" or "zero".
	UnknownIDs UnknownIDs `json:"unknown_ids,omitempty"`
	Lookups    []Lookup   `json:"lookups"`
	// RowFactors are the rows the model multiplies by a factor before
	// its lookups (a row mask: Paddle2ONNX's padding_idx, the padding
	// row times 0): the table file holds them scaled, and the embedding
	// tier scales an online update's rows alike, so the padding row
	// stays zero whatever a trainer writes there. Earlier builds ignore
	// it and write updates as sent.
	RowFactors map[int64]float32 `json:"row_factors,omitempty"`
}

// Lookup is one use of a table: gather the rows of the ids in Input and
// pool them over the bag axis.
type Lookup struct {
	// Input is the model input holding the ids: [batch] (one id per
	// sample) or [batch, bag]. With Pre, the model input the pre-lookup
	// ops start from (any per-sample shape, int64 or float32).
	Input string `json:"input"`
	// Pre are the pre-lookup ops (version 2): integer work on Input,
	// in order, that the embedding tier runs natively before the lookup
	// to make its ids (see PreOp). Empty: Input holds the ids.
	Pre []PreOp `json:"pre,omitempty"`
	// PreOutput (version 3), if set, names the output of PreModel that
	// holds the lookup's ids (shape [batch] for Rank1, else [batch,
	// Bag]); Pre is then empty. PreInputs are the model inputs that
	// output is computed from, Input the first of them.
	PreOutput string   `json:"pre_output,omitempty"`
	PreInputs []string `json:"pre_inputs,omitempty"`
	// Bag is the ids per sample (1 for a [batch] input).
	Bag int `json:"bag"`
	// Rank1 marks one id per sample and no bag axis ([batch] ids).
	Rank1 bool `json:"rank1,omitempty"`
	// Pooling over the bag axis; PoolNone keeps it.
	Pooling Pooling `json:"pooling"`
	// Weights, if set, is a model input [batch, bag] of per-id weights
	// multiplied into the rows before pooling.
	Weights string `json:"weights,omitempty"`
	// Offsets (version 4), if set, makes the lookup jagged: Input (and
	// Weights) hold every sample's ids concatenated, and this model
	// input holds each sample's start in them (torch.nn.EmbeddingBag's
	// offsets); Bag is then 1 and a sample's bag is as long as its
	// offsets say. LastOffset: the model takes one offset more, the
	// number of ids (include_last_offset=True).
	Offsets    string `json:"offsets,omitempty"`
	LastOffset bool   `json:"last_offset,omitempty"`
	// Output is the tensor the lookup produces: a cut tensor or an input
	// of cpu.onnx. Shape per sample: [dim] pooled or rank-1 unpooled,
	// [bag, dim] unpooled.
	Output string `json:"output"`
}

// CostReport summarises the cut.
type CostReport struct {
	CPU             SideCost `json:"cpu"`
	GPU             SideCost `json:"gpu"`
	CutBytes        int64    `json:"cut_bytes_per_sample"`
	TableBytes      int64    `json:"table_bytes"`
	Objective       float64  `json:"objective"`
	UnknownShapes   []string `json:"unknown_shapes,omitempty"`
	Forced          []string `json:"forced,omitempty"`
	PartitionMillis int64    `json:"partition_ms"`
}

// SideCost is one side's share of the model.
type SideCost struct {
	Nodes        int            `json:"nodes"`
	Ops          map[string]int `json:"ops"`
	ParamBytes   int64          `json:"param_bytes"`
	FLOPsPerSamp int64          `json:"flops_per_sample"`
}

// Read reads dir/plan.json and validates it (see Validate).
func Read(dir string) (*Plan, error) {
	path := filepath.Join(dir, File)
	buf, err := os.ReadFile(path)
	if err != nil {
		if _, serr := os.Stat(filepath.Join(dir, "model.onnx")); serr == nil && errors.Is(err, fs.ErrNotExist) {
			// A prism models build folder where a partition folder goes.
			return nil, fmt.Errorf("read plan: %s holds a model, not a partition: run prism partition %s -o OUT and give OUT", dir, filepath.Join(dir, "model.onnx"))
		}
		return nil, fmt.Errorf("read plan: %w", err)
	}
	var p Plan
	if err := json.Unmarshal(buf, &p); err != nil {
		return nil, fmt.Errorf("read plan %q: %w", path, err)
	}
	if err := p.Validate(); err != nil {
		return nil, fmt.Errorf("read plan %q: %w", path, err)
	}
	return &p, nil
}

// Write validates p and writes it as dir/plan.json. The file is
// replaced whole or not at all: written beside it, synced and renamed
// over it, so a full disk or a kill part-way (prism shard rewrites the
// plan.json of a partition folder in place) leaves the plan.json that
// was there, never a truncated one.
func Write(dir string, p *Plan) error {
	if err := p.Validate(); err != nil {
		return fmt.Errorf("write plan: %w", err)
	}
	buf, err := json.MarshalIndent(p, "", "  ")
	if err != nil {
		return fmt.Errorf("write plan: %w", err)
	}
	path := filepath.Join(dir, File)
	if err := atomicfile.WriteFile(path, func(w io.Writer) error {
		_, err := w.Write(append(buf, '\n'))
		return err
	}); err != nil {
		return fmt.Errorf("write plan %s: %w", path, err)
	}
	return nil
}

// ServedName is the name the tiers serve the plan in dir under: its
// model's name, or for a model without one (a graph with no name and no
// prism.model metadata) the folder's name. Every tier and command that
// names a served model takes it from here: up waited for a nameless
// model under "" while its workers served it under the folder's name.
func (p *Plan) ServedName(dir string) string {
	if p.Model.Name != "" {
		return p.Model.Name
	}
	return filepath.Base(filepath.Clean(dir))
}
