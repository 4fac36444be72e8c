// Package models is Prism's model zoo: DLRM, DCNv2 and DeepFM at tiny,
// Kaggle and MLPerf sizes, built as ONNX graphs the way PyTorch exports
// them, with seeded weights and an independent float64 reference scorer.
package models

import (
	"errors"
	"fmt"
	"math"
)

// Family is a model architecture.
type Family string

const (
	DLRM   Family = "dlrm"
	DCNv2  Family = "dcnv2"
	DeepFM Family = "deepfm"
)

// Config is a model's shape: everything needed to build it except weights.
type Config struct {
	Name   string `json:"name"`
	Family Family `json:"family"`
	// NumDense is the number of dense (continuous) features.
	NumDense int `json:"num_dense"`
	// TableRows holds each sparse feature's embedding table size.
	TableRows []int64 `json:"table_rows"`
	EmbDim    int     `json:"emb_dim"`
	// BagSizes is the ids per sample of each table. 0 means one-hot with
	// a rank-1 input ([batch] ids, a plain Gather); n >= 1 means a
	// [batch, n] input pooled by ReduceSum over the bag axis.
	BagSizes []int `json:"bag_sizes"`
	// Bottom is the bottom MLP's layer widths (DLRM, DCNv2); its last
	// width must equal EmbDim.
	Bottom []int `json:"bottom,omitempty"`
	// Top is the top MLP's layer widths, ending in 1 (the logit). For
	// DeepFM it is the deep component.
	Top []int `json:"top"`
	// CrossLayers and CrossRank shape DCNv2's low-rank cross network.
	CrossLayers int `json:"cross_layers,omitempty"`
	CrossRank   int `json:"cross_rank,omitempty"`
	// Packed takes every table's id in one [batch, tables] int64 input
	// (PackedInput), each column picked by Gather(axis=1) with a scalar
	// index, as TorchScript exports x[:, k] (symbolic_opset9 select),
	// instead of one input per table. One-hot tables only.
	Packed bool `json:"packed,omitempty"`
}

// NumTables is the number of sparse features (one table each).
func (c *Config) NumTables() int { return len(c.TableRows) }

// Bag is the number of ids per sample for table k (1 for one-hot).
func (c *Config) Bag(k int) int { return max(c.BagSizes[k], 1) }

// Validate reports the first thing wrong with c.
func (c *Config) Validate() error {
	if c.NumDense <= 0 {
		return fmt.Errorf("model %s: num_dense must be positive", c.Name)
	}
	if len(c.TableRows) == 0 {
		return fmt.Errorf("model %s: no tables", c.Name)
	}
	if len(c.BagSizes) != len(c.TableRows) {
		return fmt.Errorf("model %s: %d bag sizes for %d tables", c.Name, len(c.BagSizes), len(c.TableRows))
	}
	for k, r := range c.TableRows {
		if r <= 0 {
			return fmt.Errorf("model %s: table %d has %d rows", c.Name, k, r)
		}
	}
	if c.EmbDim <= 0 {
		return fmt.Errorf("model %s: emb_dim must be positive", c.Name)
	}
	if len(c.Top) == 0 || c.Top[len(c.Top)-1] != 1 {
		return fmt.Errorf("model %s: top MLP must end in width 1", c.Name)
	}
	if c.Packed {
		for k, b := range c.BagSizes {
			if b != 0 {
				return fmt.Errorf("model %s: packed ids take one-hot tables, table %d has bags of %d", c.Name, k, b)
			}
		}
	}
	switch c.Family {
	case DLRM, DCNv2:
		if len(c.Bottom) == 0 || c.Bottom[len(c.Bottom)-1] != c.EmbDim {
			return fmt.Errorf("model %s: bottom MLP must end in emb_dim %d", c.Name, c.EmbDim)
		}
		if c.Family == DCNv2 && (c.CrossLayers <= 0 || c.CrossRank <= 0) {
			return fmt.Errorf("model %s: DCNv2 needs cross_layers and cross_rank", c.Name)
		}
	case DeepFM:
	default:
		return fmt.Errorf("model %s: unknown family %q", c.Name, c.Family)
	}
	return nil
}

// Params counts c's parameters: embedding rows and dense weights.
func (c *Config) Params() (embedding, dense int64) {
	for _, r := range c.TableRows {
		embedding += r * int64(c.EmbDim)
		if c.Family == DeepFM {
			embedding += r // first-order weight per id
		}
	}
	mlp := func(in int, widths []int) int {
		n := 0
		for _, w := range widths {
			n += in*w + w
			in = w
		}
		return n
	}
	nt := c.NumTables()
	switch c.Family {
	case DLRM:
		dense += int64(mlp(c.NumDense, c.Bottom))
		f := nt + 1
		dense += int64(mlp(c.EmbDim+f*(f-1)/2, c.Top))
	case DCNv2:
		dense += int64(mlp(c.NumDense, c.Bottom))
		in := (nt + 1) * c.EmbDim
		dense += int64(c.CrossLayers * (2*in*c.CrossRank + in))
		dense += int64(mlp(in, c.Top))
	case DeepFM:
		dense += int64(c.NumDense + 1)
		dense += int64(mlp(nt*c.EmbDim+c.NumDense, c.Top))
	}
	return embedding, dense
}

// Bytes is the float32 size of c's parameters.
func (c *Config) Bytes() int64 {
	e, d := c.Params()
	return 4 * (e + d)
}

// ScaleOptions shrink a preset's tables.
type ScaleOptions struct {
	// RowsScale multiplies every table's rows (0 means 1). A table never
	// shrinks below min(its size, MinScaledRows), so small categorical
	// features keep their real cardinality.
	RowsScale float64
	// MaxRows caps every table (0: no cap).
	MaxRows int64
}

// MinScaledRows is the floor RowsScale applies.
const MinScaledRows = 1000

// Scaled returns a copy of c with its tables scaled.
func (c Config) Scaled(o ScaleOptions) (Config, error) {
	if o.RowsScale < 0 || math.IsNaN(o.RowsScale) || math.IsInf(o.RowsScale, 0) {
		return c, errors.New("rows-scale must be a positive number")
	}
	if o.MaxRows < 0 {
		return c, errors.New("max-rows must not be negative")
	}
	rows := make([]int64, len(c.TableRows))
	for k, r := range c.TableRows {
		if o.RowsScale > 0 && o.RowsScale != 1 {
			// Past int64 the conversion gave a negative count, and the
			// table kept its preset's rows: rows-scale 1e18 built the
			// preset as it is, silently.
			f := math.Ceil(float64(r) * o.RowsScale)
			if o.MaxRows > 0 {
				f = min(f, float64(o.MaxRows)) // capped below
			}
			if !(f < 1<<62) {
				return c, fmt.Errorf("rows-scale %g gives table %d %g rows: more than any table can hold", o.RowsScale, k, f)
			}
			r = max(int64(f), min(r, MinScaledRows))
		}
		if o.MaxRows > 0 {
			r = min(r, o.MaxRows)
		}
		rows[k] = r
	}
	c.TableRows = rows
	return c, nil
}
