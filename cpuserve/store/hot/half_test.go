package hot

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestHalfRoundTrip: every half but the NaNs widens to a float32 that
// rounds back to itself, so a half class holds a float16 table's rows
// exactly.
func TestHalfRoundTrip(t *testing.T) {
	for h := range 1 << 16 {
		f := F16ToF32(uint16(h))
		if math.IsNaN(float64(f)) {
			continue
		}
		if got := F32ToF16(f); got != uint16(h) {
			t.Fatalf("half %#04x widens to %v, which rounds to %#04x", h, f, got)
		}
		if F16Table[h] != f || widen(uint32(h)) != f {
			t.Fatalf("half %#04x: F16Table %v, widen %v, want %v", h, F16Table[h], widen(uint32(h)), f)
		}
	}
}

// BenchmarkGather64: a hit's cost, float32 rows (a copy) against halves
// and int8 rows (widened in place), dim 64, 270 random resident ids a
// batch from a class of 256 MiB.
func BenchmarkGather64(b *testing.B) {
	for _, c := range []struct {
		name  string
		width int
	}{{"float32", 64}, {"half", HalfWidth(64)}, {"int8", Int8Width(64)}} {
		b.Run(c.name, func(b *testing.B) {
			cls := NewClass(c.width, 256<<20)
			row := make([]float32, 64) // an embedding's values: halves, normal
			for i := range row {
				row[i] = F16ToF32(F32ToF16(0.01 * float32(i-32)))
			}
			row[32] = 0.003
			if c.width == Int8Width(64) {
				row = int8Row(row)
			}
			cls.Lock()
			n := int64(0)
			for ; !cls.Full(); n++ {
				k := Key(1, n)
				cls.Admit(k, Hash(k), row)
			}
			cls.Unlock()
			r := rand.New(rand.NewPCG(1, 1))
			ids := make([]int64, 270)
			out := make([]float32, 270*64)
			slots := make([]int32, 270)
			b.ResetTimer()
			for range b.N {
				for i := range ids {
					ids[i] = r.Int64N(n)
				}
				cls.RLock()
				cls.Gather(1, ids, out, slots, nil)
				cls.RUnlock()
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*270), "ns/row")
			b.ReportMetric(float64(n), "rows")
		})
	}
}
