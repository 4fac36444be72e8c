package arrowframe

import (
	"errors"
	"math"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"github.com/apache/arrow-go/v18/arrow"

	"github.com/prism-serve/prism/internal/threadcpu"
)

// expandAll writes every tensor of a decode out in full (Tensor.Expand).
func expandAll(n int, ts []Tensor) [][]float32 {
	out := make([][]float32, len(ts))
	for i, t := range ts {
		rows := n
		if t.Context {
			rows = 1
		}
		out[i] = make([]float32, rows*t.Width)
		if t.Context {
			copy(out[i], t.Data)
			continue
		}
		t.Expand(out[i], n)
	}
	return out
}

// sameBits reports whether two expansions hold the same floats, bit for
// bit.
func sameBits(a, b [][]float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if len(a[i]) != len(b[i]) {
			return false
		}
		for j := range a[i] {
			if math.Float32bits(a[i][j]) != math.Float32bits(b[i][j]) {
				return false
			}
		}
	}
	return true
}

// TestDecodeIndexed: DecodeIndexed's tensors, expanded, are Decode's bit
// for bit, for Prism's frames (fast path: Index set, views of the frame)
// and other writers' (arrow-go's int8 indices: expanded, Index nil), on
// a schema's first frame (arrow-go's reader) and later ones (the fast
// path).
func TestDecodeIndexed(t *testing.T) {
	const n = 270
	r := rand.New(rand.NewPCG(9, 10))
	ts := dlrmCutDict(n)
	for _, t := range ts {
		for j := range t.Data {
			t.Data[j] = r.Float32()
		}
	}
	ts = append(ts, Tensor{Name: "ctx", Width: 3, Data: []float32{1, 2, 3}, Context: true})
	prism, err := Encode(n, ts)
	if err != nil {
		t.Fatal(err)
	}
	other := dictFrame(t, arrow.PrimitiveTypes.Int8, 3, []float32{1, 2, 3, 4, 5, 6}, []int64{1, 0, 1, 1})
	for name, frame := range map[string][]byte{"prism": prism, "int8 indices": other} {
		for round := range 3 {
			wn, want, err := Decode(frame)
			if err != nil {
				t.Fatalf("%s: Decode: %v", name, err)
			}
			gn, got, err := DecodeIndexed(frame)
			if err != nil {
				t.Fatalf("%s, round %d: DecodeIndexed: %v", name, round, err)
			}
			if gn != wn || len(got) != len(want) {
				t.Fatalf("%s: %d samples, %d tensors; Decode %d, %d", name, gn, len(got), wn, len(want))
			}
			indexed := 0
			for i, g := range got {
				if g.Name != want[i].Name || g.Width != want[i].Width || g.Context != want[i].Context {
					t.Fatalf("%s: tensor %d is %q width %d, Decode's %q width %d", name, i, g.Name, g.Width, want[i].Name, want[i].Width)
				}
				if g.Index != nil {
					indexed++
					if len(g.Index) != gn {
						t.Fatalf("%s: %q has %d indices for %d samples", name, g.Name, len(g.Index), gn)
					}
				}
			}
			if !sameBits(expandAll(gn, got), expandAll(wn, want)) {
				t.Fatalf("%s, round %d: DecodeIndexed's tensors expand to other values than Decode's", name, round)
			}
			if name == "prism" && round > 0 && indexed != 26 {
				t.Errorf("prism frame, round %d: %d columns left indexed, want 26", round, indexed)
			}
			if name != "prism" && indexed != 0 {
				t.Errorf("%s: %d columns indexed; only int32 indices are", name, indexed)
			}
		}
	}
}

// TestDecodeIndexedRefused: an index outside its dictionary is refused
// as Decode refuses it, on the first frame of a schema and once the fast
// path knows it.
func TestDecodeIndexedRefused(t *testing.T) {
	dict := []float32{1, 2, 3, 4}
	good := dictFrame(t, arrow.PrimitiveTypes.Int32, 2, dict, []int64{0, 1, 1})
	bad := dictFrame(t, arrow.PrimitiveTypes.Int32, 2, dict, []int64{0, 2, 1})
	for round := range 2 {
		if _, _, err := DecodeIndexed(good); err != nil {
			t.Fatal(err)
		}
		if _, _, err := DecodeIndexed(bad); !errors.Is(err, ErrMalformed) {
			t.Errorf("round %d: index past the dictionary: %v, want ErrMalformed", round, err)
		}
	}
}

// BenchmarkDecodeIndexedGather270: a 270-sample dlrm-kaggle dictionary
// frame (43% distinct rows) made into its expanded tensors, as the dense
// worker does for a batch: decoded and expanded into reused memory
// (DecodeWith), against decoded unexpanded (DecodeIndexed) and gathered
// into the batch's memory, in the same loop; thread CPU ns per frame.
func BenchmarkDecodeIndexedGather270(b *testing.B) {
	const n = 270
	buf, _ := Encode(n, dlrmCutDict(n))
	if _, _, err := Decode(buf); err != nil { // the schema learnt
		b.Fatal(err)
	}
	pool := make([][]float32, 27)
	for i := range pool {
		pool[i] = make([]float32, n*16)
	}
	batch := make([]float32, n*(13+26*16))
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var expand, indexed time.Duration
	b.ResetTimer()
	for range b.N {
		t0 := threadcpu.Now()
		k := 0
		_, ts, err := DecodeWith(buf, func(m int) []float32 { k++; return pool[k-1][:m] })
		if err != nil {
			b.Fatal(err)
		}
		off := 0
		for _, t := range ts {
			off += copy(batch[off:], t.Data)
		}
		t1 := threadcpu.Now()
		_, ts, err = DecodeIndexed(buf)
		if err != nil {
			b.Fatal(err)
		}
		off = 0
		for _, t := range ts {
			t.Expand(batch[off:off+n*t.Width], n)
			off += n * t.Width
		}
		t2 := threadcpu.Now()
		expand, indexed = expand+t1-t0, indexed+t2-t1
	}
	b.ReportMetric(float64(expand)/float64(b.N), "expand+copy-ns/op")
	b.ReportMetric(float64(indexed)/float64(b.N), "indexed+gather-ns/op")
	b.ReportMetric(float64(indexed)/float64(expand), "ratio")
}

// BenchmarkGather16: Gather's fixed-size rows of 16 floats against a
// copy per row, in the same loop (thread CPU ns per 270-row column).
func BenchmarkGather16(b *testing.B) {
	const n, rows = 270, 116
	dict := make([]float32, rows*16)
	index := make([]int32, n)
	for s := range index {
		index[s] = int32((s * 7) % rows)
	}
	dst := make([]float32, n*16)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var fixed, copies time.Duration
	b.ResetTimer()
	for range b.N {
		t0 := threadcpu.Now()
		for range 26 {
			Gather(dst, dict, index, 16)
		}
		t1 := threadcpu.Now()
		for range 26 {
			for s, k := range index {
				copy(dst[s*16:(s+1)*16], dict[int(k)*16:(int(k)+1)*16])
			}
		}
		t2 := threadcpu.Now()
		fixed, copies = fixed+t1-t0, copies+t2-t1
	}
	b.ReportMetric(float64(fixed)/26/float64(b.N), "fixed-ns/op")
	b.ReportMetric(float64(copies)/26/float64(b.N), "copy-ns/op")
}
