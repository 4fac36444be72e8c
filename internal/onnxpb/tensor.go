package onnxpb

import (
	"encoding/binary"
	"fmt"
	"github.com/prism-serve/prism/internal/leview"
	"math"
)

// ElemSize is the byte size of one element of an ONNX data type, 0 when
// the type has no fixed size (STRING) or is unknown.
func ElemSize(dt TensorProto_DataType) int {
	switch dt {
	case TensorProto_UINT8, TensorProto_INT8, TensorProto_BOOL:
		return 1
	case TensorProto_UINT16, TensorProto_INT16, TensorProto_FLOAT16, TensorProto_BFLOAT16:
		return 2
	case TensorProto_FLOAT, TensorProto_INT32, TensorProto_UINT32:
		return 4
	case TensorProto_DOUBLE, TensorProto_INT64, TensorProto_UINT64, TensorProto_COMPLEX64:
		return 8
	case TensorProto_COMPLEX128:
		return 16
	}
	return 0
}

// checkedNumElements is the product of t's dims, an error for a negative
// dim or a product beyond int64.
func checkedNumElements(t *TensorProto) (int64, error) {
	n := int64(1)
	for _, d := range t.GetDims() {
		if d < 0 {
			return 0, fmt.Errorf("tensor %q: dims %v: negative dimension", t.GetName(), t.GetDims())
		}
		if d != 0 && n > math.MaxInt64/d {
			return 0, fmt.Errorf("tensor %q: dims %v: element count overflows", t.GetName(), t.GetDims())
		}
		n *= d
	}
	return n, nil
}

// ByteSize is the size of t's data in bytes, and whether it is known
// (not for a type without a fixed size, or dims that are negative or
// overflow).
func ByteSize(t *TensorProto) (int64, bool) {
	n, known, err := checkedByteSize(t)
	return n, known && err == nil
}

// checkedByteSize is ByteSize with an error for dims that cannot be.
func checkedByteSize(t *TensorProto) (int64, bool, error) {
	n, err := checkedNumElements(t)
	if err != nil {
		return 0, false, err
	}
	es := int64(ElemSize(TensorProto_DataType(t.GetDataType())))
	if es == 0 {
		return 0, false, nil
	}
	if n > math.MaxInt64/es {
		return 0, false, fmt.Errorf("tensor %q: dims %v: byte size overflows", t.GetName(), t.GetDims())
	}
	return n * es, true, nil
}

// ToRaw moves data held in typed fields (float_data, int64_data, ...) to
// raw_data, little-endian, the form external data and Prism's readers use.
func ToRaw(t *TensorProto) error {
	if len(t.RawData) > 0 {
		return nil
	}
	switch TensorProto_DataType(t.GetDataType()) {
	case TensorProto_FLOAT:
		if len(t.FloatData) > 0 {
			b := make([]byte, 4*len(t.FloatData))
			for i, v := range t.FloatData {
				binary.LittleEndian.PutUint32(b[4*i:], math.Float32bits(v))
			}
			t.RawData, t.FloatData = b, nil
		}
	case TensorProto_INT64:
		if len(t.Int64Data) > 0 {
			b := make([]byte, 8*len(t.Int64Data))
			for i, v := range t.Int64Data {
				binary.LittleEndian.PutUint64(b[8*i:], uint64(v))
			}
			t.RawData, t.Int64Data = b, nil
		}
	case TensorProto_INT32, TensorProto_BOOL, TensorProto_INT8, TensorProto_UINT8,
		TensorProto_INT16, TensorProto_UINT16, TensorProto_FLOAT16, TensorProto_BFLOAT16:
		// onnx.proto: these all travel in int32_data, one element per
		// int32 (16-bit floats as their bit patterns); raw_data holds
		// each in its own size.
		if len(t.Int32Data) > 0 {
			es := ElemSize(TensorProto_DataType(t.GetDataType()))
			b := make([]byte, es*len(t.Int32Data))
			for i, v := range t.Int32Data {
				switch es {
				case 1:
					b[i] = byte(v)
				case 2:
					binary.LittleEndian.PutUint16(b[2*i:], uint16(v))
				default:
					binary.LittleEndian.PutUint32(b[4*i:], uint32(v))
				}
			}
			t.RawData, t.Int32Data = b, nil
		}
	case TensorProto_UINT32, TensorProto_UINT64: // in uint64_data
		if len(t.Uint64Data) > 0 {
			es := ElemSize(TensorProto_DataType(t.GetDataType()))
			b := make([]byte, es*len(t.Uint64Data))
			for i, v := range t.Uint64Data {
				if es == 4 {
					binary.LittleEndian.PutUint32(b[4*i:], uint32(v))
				} else {
					binary.LittleEndian.PutUint64(b[8*i:], v)
				}
			}
			t.RawData, t.Uint64Data = b, nil
		}
	case TensorProto_DOUBLE:
		if len(t.DoubleData) > 0 {
			b := make([]byte, 8*len(t.DoubleData))
			for i, v := range t.DoubleData {
				binary.LittleEndian.PutUint64(b[8*i:], math.Float64bits(v))
			}
			t.RawData, t.DoubleData = b, nil
		}
	default:
		if packedSize(t) > 0 {
			return fmt.Errorf("tensor %q: cannot convert data type %v to raw data", t.GetName(), TensorProto_DataType(t.GetDataType()))
		}
	}
	return nil
}

// Float32s returns t's values. For raw data on a little-endian machine the
// slice aliases t.RawData (no copy); the caller must not modify it.
func Float32s(t *TensorProto) ([]float32, error) {
	if TensorProto_DataType(t.GetDataType()) != TensorProto_FLOAT {
		return nil, fmt.Errorf("tensor %q is %v, not FLOAT", t.GetName(), TensorProto_DataType(t.GetDataType()))
	}
	if t.GetDataLocation() == TensorProto_EXTERNAL {
		return nil, fmt.Errorf("tensor %q: external data not loaded", t.GetName())
	}
	n, err := checkedNumElements(t)
	if err != nil {
		return nil, err
	}
	if len(t.FloatData) > 0 {
		if int64(len(t.FloatData)) != n {
			return nil, fmt.Errorf("tensor %q: %d float_data values for %d elements", t.GetName(), len(t.FloatData), n)
		}
		return t.FloatData, nil
	}
	if int64(len(t.RawData))/4 != n || len(t.RawData)%4 != 0 {
		return nil, fmt.Errorf("tensor %q: %d raw bytes for %d float32 elements", t.GetName(), len(t.RawData), n)
	}
	return leview.Float32s(t.RawData), nil
}

// Int64s returns t's values (INT64 or INT32, widened), always a copy.
func Int64s(t *TensorProto) ([]int64, error) {
	n, err := checkedNumElements(t)
	if err != nil {
		return nil, err
	}
	switch TensorProto_DataType(t.GetDataType()) {
	case TensorProto_INT64:
		if len(t.Int64Data) > 0 {
			return append([]int64(nil), t.Int64Data...), nil
		}
		if int64(len(t.RawData))/8 != n || len(t.RawData)%8 != 0 {
			return nil, fmt.Errorf("tensor %q: %d raw bytes for %d int64 elements", t.GetName(), len(t.RawData), n)
		}
		out := make([]int64, n)
		for i := range out {
			out[i] = int64(binary.LittleEndian.Uint64(t.RawData[8*i:]))
		}
		return out, nil
	case TensorProto_INT32:
		if len(t.Int32Data) > 0 {
			out := make([]int64, len(t.Int32Data))
			for i, v := range t.Int32Data {
				out[i] = int64(v)
			}
			return out, nil
		}
		if int64(len(t.RawData))/4 != n || len(t.RawData)%4 != 0 {
			return nil, fmt.Errorf("tensor %q: %d raw bytes for %d int32 elements", t.GetName(), len(t.RawData), n)
		}
		out := make([]int64, n)
		for i := range out {
			out[i] = int64(int32(binary.LittleEndian.Uint32(t.RawData[4*i:])))
		}
		return out, nil
	}
	return nil, fmt.Errorf("tensor %q is %v, not an integer type", t.GetName(), TensorProto_DataType(t.GetDataType()))
}

// NewFloatTensor makes a FLOAT initializer whose raw data aliases data
// (no copy): the caller must not change data while the tensor is in use.
func NewFloatTensor(name string, dims []int64, data []float32) *TensorProto {
	return &TensorProto{Name: name, Dims: dims, DataType: int32(TensorProto_FLOAT), RawData: leview.Bytes(data)}
}

// NewInt64Tensor makes an INT64 initializer (a copy of data).
func NewInt64Tensor(name string, dims []int64, data []int64) *TensorProto {
	b := make([]byte, 8*len(data))
	for i, v := range data {
		binary.LittleEndian.PutUint64(b[8*i:], uint64(v))
	}
	return &TensorProto{Name: name, Dims: dims, DataType: int32(TensorProto_INT64), RawData: b}
}
