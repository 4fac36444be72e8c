// Package leview views float32 slices as their little-endian bytes and
// back without copying: the byte form of ONNX raw tensor data, Arrow
// buffers, table files and update rows. It imports nothing of Prism, so
// every layer can use it.
package leview

import "unsafe"

func init() {
	// The views below are only right on little-endian machines, which is
	// every machine Prism runs on.
	x := uint16(1)
	if *(*byte)(unsafe.Pointer(&x)) != 1 {
		panic("leview: big-endian machines are not supported")
	}
}

// Bytes views a float32 slice as its little-endian bytes. The caller owns
// both views of the one array.
func Bytes(f []float32) []byte {
	if len(f) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&f[0])), 4*len(f))
}

// Float32s views little-endian bytes as float32s (len(b)/4 of them; a
// trailing partial value is left out). If b is not 4-byte aligned it is
// copied first, so the result may or may not share b's array.
func Float32s(b []byte) []float32 {
	if len(b) < 4 {
		return nil
	}
	if uintptr(unsafe.Pointer(&b[0]))%4 != 0 {
		b = append([]byte(nil), b...)
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(&b[0])), len(b)/4)
}
