package leview

import (
	"encoding/binary"
	"math"
	"testing"
)

func TestRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name string
		in   []float32
	}{
		{"empty", nil},
		{"one", []float32{1.5}},
		{"specials", []float32{0, -0, float32(math.Inf(1)), float32(math.NaN()), math.MaxFloat32, math.SmallestNonzeroFloat32}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := Bytes(tc.in)
			if len(b) != 4*len(tc.in) {
				t.Fatalf("len %d, want %d", len(b), 4*len(tc.in))
			}
			for i, v := range tc.in {
				if got := binary.LittleEndian.Uint32(b[4*i:]); got != math.Float32bits(v) {
					t.Errorf("value %d: bytes %08x, want %08x", i, got, math.Float32bits(v))
				}
			}
			back := Float32s(b)
			if len(back) != len(tc.in) {
				t.Fatalf("back: len %d, want %d", len(back), len(tc.in))
			}
			for i := range back {
				if math.Float32bits(back[i]) != math.Float32bits(tc.in[i]) {
					t.Errorf("back %d: %v, want %v", i, back[i], tc.in[i])
				}
			}
		})
	}
}

func TestFloat32sUnalignedAndShort(t *testing.T) {
	buf := make([]byte, 13)
	binary.LittleEndian.PutUint32(buf[1:], math.Float32bits(2.5))
	binary.LittleEndian.PutUint32(buf[5:], math.Float32bits(-1))
	got := Float32s(buf[1:]) // unaligned, 12 bytes, last 4 zero
	if len(got) != 3 || got[0] != 2.5 || got[1] != -1 || got[2] != 0 {
		t.Fatalf("unaligned view: %v", got)
	}
	if got := Float32s(buf[:3]); got != nil {
		t.Fatalf("3 bytes: %v, want nil", got)
	}
	if got := Float32s(buf[1:7]); len(got) != 1 {
		t.Fatalf("6 bytes: %d values, want 1 (partial value left out)", len(got))
	}
}
