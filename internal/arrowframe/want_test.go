package arrowframe

import (
	"errors"
	"fmt"
	"runtime"
	"slices"
	"testing"

	"github.com/apache/arrow-go/v18/arrow"
)

// TestDecodeWantBeforeExpanding: DecodeWant and DecodeIndexedWant refuse
// a frame of other rows than wanted, or whose column Want.Column refuses,
// on the fast path and on arrow-go's (which expands every dictionary
// column, DecodeIndexedWant's too), before expanding a dictionary column;
// a frame that is what it wants decodes as Decode (DecodeIndexed) does.
func TestDecodeWantBeforeExpanding(t *testing.T) {
	const n, w = 4096, 256
	idx := make([]int32, n)
	dict := make([]float32, w)
	prism, err := Encode(n, []Tensor{{Name: "want_d", Width: w, Data: dict, Index: idx}, {Name: "want_c", Width: 2, Data: []float32{1, 2}, Context: true}})
	if err != nil {
		t.Fatal(err)
	}
	// int8 indices: arrow-go's path only (Decode expands them with make).
	int8s := dictFrame(t, arrow.PrimitiveTypes.Int8, w, dict, make([]int64, n))
	if _, _, err := Decode(prism); err != nil { // caches the schema
		t.Fatal(err)
	}
	if _, _, ok := decodeCached(prism); !ok {
		t.Fatal("the fast path declines the frame: the case tests nothing")
	}
	errColumn := errors.New("not this column")
	type decodeFn func(b []byte, want Want, alloc func(int) []float32) (int, []Tensor, error)
	decoders := []struct {
		name   string
		decode decodeFn
		plain  func(b []byte) (int, []Tensor, error)
	}{
		{"DecodeWant", DecodeWant, Decode},
		{"DecodeIndexedWant", func(b []byte, want Want, alloc func(int) []float32) (int, []Tensor, error) {
			// alloc is not DecodeIndexedWant's: count arrow-go's
			// expansions by the bytes allocated alone.
			return DecodeIndexedWant(b, want)
		}, DecodeIndexed},
	}
	for _, d := range decoders {
		for name, frame := range map[string][]byte{"fast": prism, "arrow-go": int8s} {
			name := d.name + "/" + name
			for _, c := range []struct {
				name string
				want Want
				is   func(error) bool
			}{
				{"rows", Want{Rows: 3}, func(err error) bool {
					var re *RowsError
					return errors.As(err, &re) && re.Got == n && re.Want == 3
				}},
				{"column", Want{Rows: n, Column: func(name string, width int) error {
					if width == w {
						return fmt.Errorf("column %q: %w", name, errColumn)
					}
					return nil
				}}, func(err error) bool { return errors.Is(err, errColumn) }},
			} {
				t.Run(name+"/"+c.name, func(t *testing.T) {
					allocs := 0
					alloc := func(k int) []float32 { allocs++; return make([]float32, k) }
					var err error
					bytes := allocated(func() { _, _, err = d.decode(frame, c.want, alloc) })
					if !c.is(err) {
						t.Fatalf("DecodeWant: %v", err)
					}
					if allocs != 0 || bytes > n*w*4/4 {
						t.Errorf("refused after expanding: %d allocs, %d bytes (expansion %d)", allocs, bytes, n*w*4)
					}
				})
			}
			t.Run(name+"/wanted", func(t *testing.T) {
				var cols []string
				gn, ts, err := d.decode(frame, Want{Rows: n, Column: func(name string, width int) error {
					cols = append(cols, fmt.Sprint(name, width))
					return nil
				}}, nil)
				rn, rts, rerr := d.plain(frame)
				if err != nil || rerr != nil || !sameValues(gn, ts, rn, rts) {
					t.Fatalf("DecodeWant: %d %s %v; Decode: %d %s %v", gn, describe(ts), err, rn, describe(rts), rerr)
				}
				for i := range ts {
					if !slices.Equal(ts[i].Index, rts[i].Index) {
						t.Errorf("column %q: indices %d, want %d", ts[i].Name, len(ts[i].Index), len(rts[i].Index))
					}
				}
				if len(cols) != len(ts) {
					t.Errorf("Column saw %v for %d tensors", cols, len(ts))
				}
			})
		}
	}
}

// allocated is the bytes the Go heap handed out while f ran.
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}
