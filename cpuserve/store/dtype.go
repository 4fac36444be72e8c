package store

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/prism-serve/prism/cpuserve/store/hot"
)

// DType is how a table's rows are stored in Pebble. The hot tier and
// every lookup see float32 rows; the stored dtype trades accuracy for
// bytes, chosen per table at ingest.
type DType string

const (
	// Float32 stores rows as they are (4 bytes a value), exactly.
	Float32 DType = "float32"
	// Float16 stores IEEE half precision (2 bytes a value), rounded to
	// nearest even: |x - x'| <= max(|x| * 2^-11, 2^-25) for |x| < 65504.
	Float16 DType = "float16"
	// Int8 stores a float32 scale per row and one int8 per value:
	// scale = max|x| / 127 over the row, x' = round(x / scale) * scale,
	// so |x - x'| <= max|x| / 254 (half a step).
	Int8 DType = "int8"
)

// ParseDType checks a dtype name ("" is float32).
func ParseDType(s string) (DType, error) {
	switch DType(s) {
	case "", Float32:
		return Float32, nil
	case Float16, Int8:
		return DType(s), nil
	}
	return "", fmt.Errorf("dtype %q: want float32, float16 or int8", s)
}

// RowBytes is the stored size of a row of width dim.
func (t DType) RowBytes(dim int) int {
	switch t {
	case Float16:
		return 2 * dim
	case Int8:
		return 4 + dim
	}
	return 4 * dim
}

// encode appends the stored form of row to dst.
func (t DType) encode(dst []byte, row []float32) []byte {
	switch t {
	case Float16:
		for _, x := range row {
			dst = binary.LittleEndian.AppendUint16(dst, hot.F32ToF16(x))
		}
	case Int8:
		var m float32
		for _, x := range row {
			m = max(m, float32(math.Abs(float64(x))))
		}
		scale := m / 127
		dst = binary.LittleEndian.AppendUint32(dst, math.Float32bits(scale))
		for _, x := range row {
			q := 0.0
			if scale > 0 {
				q = math.Round(float64(x / scale))
			}
			dst = append(dst, byte(int8(max(-127, min(127, q)))))
		}
	default:
		for _, x := range row {
			dst = binary.LittleEndian.AppendUint32(dst, math.Float32bits(x))
		}
	}
	return dst
}

// decode fills dst (len dim) from a stored row; false if src is not a
// row of that width.
func (t DType) decode(dst []float32, src []byte) bool {
	if len(src) != t.RowBytes(len(dst)) {
		return false
	}
	switch t {
	case Float16:
		for i := range dst {
			dst[i] = hot.F16Table[binary.LittleEndian.Uint16(src[2*i:])]
		}
	case Int8:
		scale := math.Float32frombits(binary.LittleEndian.Uint32(src))
		for i, b := range src[4:] {
			dst[i] = float32(int8(b)) * scale
		}
	default:
		for i := range dst {
			dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
		}
	}
	return true
}

// Loss is the accuracy a table lost to its stored dtype, measured over
// every value at ingest.
type Loss struct {
	DType  DType   `json:"dtype"`
	MaxAbs float64 `json:"max_abs_err"`
	RMS    float64 `json:"rms_err"`
	// MaxRel is the largest error relative to its row's largest |value|.
	MaxRel float64 `json:"max_rel_err"`
	Values int64   `json:"values"`
	SumSq  float64 `json:"sum_sq"`
}

// add measures rows (originals) against their decoded form.
func (l *Loss) add(orig, got []float32, dim int) {
	for r := 0; r+dim <= len(orig); r += dim {
		var m float64
		for _, x := range orig[r : r+dim] {
			m = max(m, math.Abs(float64(x)))
		}
		for i := r; i < r+dim; i++ {
			e := math.Abs(float64(orig[i]) - float64(got[i]))
			l.MaxAbs = max(l.MaxAbs, e)
			l.SumSq += e * e
			if m > 0 {
				l.MaxRel = max(l.MaxRel, e/m)
			}
		}
	}
	l.Values += int64(len(orig))
	if l.Values > 0 {
		l.RMS = math.Sqrt(l.SumSq / float64(l.Values))
	}
}

func (l Loss) String() string {
	return fmt.Sprintf("%s: max abs err %.3g, rms %.3g, max err/row max %.3g over %d values", l.DType, l.MaxAbs, l.RMS, l.MaxRel, l.Values)
}
