package models

import (
	"fmt"
	"sort"
)

// Preset is a named model of the zoo.
type Preset struct {
	Config Config
	// Doc says what the preset is for.
	Doc string
	// Scale is applied unless the caller gives its own (dlrm-terabyte caps
	// rows, dcnv2-mlperf scales them so it fits a 24 GiB machine).
	Scale ScaleOptions
}

// Criteo Kaggle (Display Advertising Challenge) cardinalities of C1..C26,
// as Meta's DLRM reference counts them: 33,762,577 rows in all.
var kaggleRows = []int64{1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194, 27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572}

// Criteo Terabyte cardinalities (Meta's DLRM reference, no index cap).
var terabyteRows = []int64{227605432, 39060, 17295, 7424, 20265, 3, 7122, 1543, 63, 130229467, 3067956, 405282, 10, 2209, 11938, 155, 4, 976, 14, 292775614, 40790948, 187188510, 590152, 12973, 108, 36}

// MLPerf DLRMv2 (Criteo 1TB multi-hot) cardinalities and bag sizes.
var mlperfRows = []int64{40000000, 39060, 17295, 7424, 20265, 3, 7122, 1543, 63, 40000000, 3067956, 405282, 10, 2209, 11938, 155, 4, 976, 14, 40000000, 40000000, 40000000, 590152, 12973, 108, 36}
var mlperfBags = []int{3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1}

// tinyRows: 26 tables from 100 to 1000 rows.
func tinyRows() []int64 {
	r := make([]int64, 26)
	for k := range r {
		r[k] = 100 + int64(k)*900/25
	}
	return r
}

func repeat(v, n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = v
	}
	return out
}

func capped(b []int, c int) []int {
	out := make([]int, len(b))
	for i, v := range b {
		out[i] = min(v, c)
	}
	return out
}

var presets = map[string]Preset{
	"dlrm-tiny": {
		Doc:    "DLRM for tests: 26 tables of 100-1000 rows, dim 16",
		Config: Config{Family: DLRM, NumDense: 13, TableRows: tinyRows(), EmbDim: 16, BagSizes: repeat(0, 26), Bottom: []int{32, 16}, Top: []int{64, 32, 1}},
	},
	"dlrm-kaggle": {
		Doc:    "DLRM on Criteo Kaggle table sizes (33.7M rows), dim 16",
		Config: Config{Family: DLRM, NumDense: 13, TableRows: kaggleRows, EmbDim: 16, BagSizes: repeat(0, 26), Bottom: []int{512, 256, 64, 16}, Top: []int{512, 256, 1}},
	},
	"dlrm-kaggle-packed": {
		Doc:    "dlrm-kaggle with its 26 ids in one packed [batch, 26] input (TorchScript's x[:, k]); same weights as dlrm-kaggle for a seed",
		Config: Config{Family: DLRM, NumDense: 13, TableRows: kaggleRows, EmbDim: 16, BagSizes: repeat(0, 26), Bottom: []int{512, 256, 64, 16}, Top: []int{512, 256, 1}, Packed: true},
	},
	"dlrm-tiny-packed": {
		Doc:    "dlrm-tiny with its 26 ids in one packed [batch, 26] input; same weights as dlrm-tiny for a seed",
		Config: Config{Family: DLRM, NumDense: 13, TableRows: tinyRows(), EmbDim: 16, BagSizes: repeat(0, 26), Bottom: []int{32, 16}, Top: []int{64, 32, 1}, Packed: true},
	},
	"dlrm-terabyte": {
		Doc:    "DLRM on Criteo Terabyte table sizes, dim 64, rows capped by --max-rows",
		Config: Config{Family: DLRM, NumDense: 13, TableRows: terabyteRows, EmbDim: 64, BagSizes: repeat(0, 26), Bottom: []int{512, 256, 64}, Top: []int{512, 512, 256, 1}},
		Scale:  ScaleOptions{MaxRows: 1_000_000},
	},
	"dcnv2-mlperf": {
		Doc:    "DCNv2 as MLPerf DLRMv2 (dim 128, multi-hot, 3 cross layers rank 512), rows scaled by --rows-scale",
		Config: Config{Family: DCNv2, NumDense: 13, TableRows: mlperfRows, EmbDim: 128, BagSizes: mlperfBags, Bottom: []int{512, 256, 128}, Top: []int{1024, 1024, 512, 256, 1}, CrossLayers: 3, CrossRank: 512},
		Scale:  ScaleOptions{RowsScale: 0.05},
	},
	"dcnv2-tiny": {
		Doc:    "DCNv2 for tests: multi-hot, 26 tables of 100-1000 rows, dim 16, rank 32",
		Config: Config{Family: DCNv2, NumDense: 13, TableRows: tinyRows(), EmbDim: 16, BagSizes: capped(mlperfBags, 10), Bottom: []int{64, 32, 16}, Top: []int{64, 32, 1}, CrossLayers: 3, CrossRank: 32},
	},
	"deepfm-tiny": {
		Doc:    "DeepFM for tests: FM + deep MLP over 26 tables of 100-1000 rows, dim 16",
		Config: Config{Family: DeepFM, NumDense: 13, TableRows: tinyRows(), EmbDim: 16, BagSizes: repeat(0, 26), Top: []int{64, 32, 1}},
	},
}

func init() {
	for name, p := range presets {
		p.Config.Name = name
		if err := p.Config.Validate(); err != nil {
			panic(err)
		}
		presets[name] = p
	}
}

// Presets lists the zoo's presets by name.
func Presets() []string {
	names := make([]string, 0, len(presets))
	for n := range presets {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// Lookup returns the named preset.
func Lookup(name string) (Preset, error) {
	p, ok := presets[name]
	if !ok {
		return Preset{}, fmt.Errorf("unknown model %q (known: %v)", name, Presets())
	}
	return p, nil
}

// Resolve returns the preset's config scaled by o, or by the preset's
// default scale where o leaves a field zero.
func (p Preset) Resolve(o ScaleOptions) (Config, error) {
	if o.RowsScale == 0 {
		o.RowsScale = p.Scale.RowsScale
	}
	if o.MaxRows == 0 {
		o.MaxRows = p.Scale.MaxRows
	}
	return p.Config.Scaled(o)
}
