package arrowframe

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"
)

// TestFastEncodeDecodes: frames from AppendEncode read back through
// arrow-go's IPC reader to the same tensors as arrow-go's own writer's
// frames, for many shapes.
func TestFastEncodeDecodes(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{1, 2, 7, 64, 270, 513} {
		for _, widths := range [][]int{{1}, {13, 16, 16}, {3, 1, 128, 5}} {
			ts := make([]Tensor, len(widths))
			for i, w := range widths {
				d := make([]float32, n*w)
				for j := range d {
					d[j] = r.Float32()
				}
				ts[i] = Tensor{Name: fmt.Sprintf("t%d/x", i), Width: w, Data: d}
			}
			frame, err := AppendEncode(nil, n, ts)
			if err != nil {
				t.Fatal(err)
			}
			gotN, got, err := Decode(frame)
			if err != nil {
				t.Fatalf("n=%d widths=%v: %v", n, widths, err)
			}
			ref, err := encodeWithArrow(nil, n, ts)
			if err != nil {
				t.Fatal(err)
			}
			if refN, refT, err := Decode(ref); err != nil || refN != gotN || len(refT) != len(got) {
				t.Fatalf("arrow-go's frame decodes to %d samples, %d tensors (%v)", refN, len(refT), err)
			}
			if gotN != n || len(got) != len(ts) {
				t.Fatalf("n=%d: decoded %d samples, %d tensors", n, gotN, len(got))
			}
			for i := range ts {
				if got[i].Name != ts[i].Name || got[i].Width != ts[i].Width {
					t.Fatalf("tensor %d: %s/%d", i, got[i].Name, got[i].Width)
				}
				for j := range ts[i].Data {
					if got[i].Data[j] != ts[i].Data[j] {
						t.Fatalf("n=%d tensor %d value %d differs", n, i, j)
					}
				}
			}
		}
	}
	if _, err := AppendEncode(nil, 2, []Tensor{{Name: "a", Width: 2, Data: []float32{1}}}); err == nil {
		t.Error("short tensor encoded")
	}
}

func BenchmarkEncodeAppend270(b *testing.B) {
	ts := dlrmCut(270)
	b.SetBytes(int64(270 * (13 + 26*16) * 4))
	var buf []byte
	for b.Loop() {
		var err error
		if buf, err = AppendEncode(buf[:0], 270, ts); err != nil {
			b.Fatal(err)
		}
	}
}

// TestAppendFrameInPlace: a frame whose views are filled in place is the
// frame AppendEncode writes, byte for byte, even in a reused buffer full
// of garbage (padding is zeroed) or a misaligned one (reallocated).
func TestAppendFrameInPlace(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, n := range []int{1, 5, 270} {
		cols := []Column{{Name: "dense", Width: 13}, {Name: "emb/0", Width: 16}, {Name: "emb/1", Width: 3}}
		ts := make([]Tensor, len(cols))
		for i, c := range cols {
			d := make([]float32, n*c.Width)
			for j := range d {
				d[j] = r.Float32()
			}
			ts[i] = Tensor{Name: c.Name, Width: c.Width, Data: d}
		}
		want, err := AppendEncode(nil, n, ts)
		if err != nil {
			t.Fatal(err)
		}
		dirty := bytes.Repeat([]byte{0xAB}, len(want)+16)
		for _, dst := range [][]byte{nil, dirty[:0], dirty[3:3]} {
			got, views, err := AppendFrame(dst, n, cols)
			if err != nil {
				t.Fatal(err)
			}
			for i := range cols {
				if len(views[i]) != n*cols[i].Width {
					t.Fatalf("view %d holds %d floats", i, len(views[i]))
				}
				copy(views[i], ts[i].Data)
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("n=%d: in-place frame differs from AppendEncode's", n)
			}
		}
	}
	for _, bad := range []struct {
		n    int
		cols []Column
	}{{0, []Column{{Name: "a", Width: 1}}}, {3, []Column{{Name: "a", Width: 0}}}} {
		if _, _, err := AppendFrame(nil, bad.n, bad.cols); err == nil {
			t.Errorf("AppendFrame(%d, %v) accepted", bad.n, bad.cols)
		}
	}
}
