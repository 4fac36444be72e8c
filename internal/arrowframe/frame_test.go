package arrowframe

import (
	"errors"

	"github.com/apache/arrow-go/v18/arrow"
	"strings"
	"testing"
)

func TestRoundTrip(t *testing.T) {
	ts := []Tensor{{Name: "a", Width: 3, Data: []float32{1, 2, 3, 4, 5, 6}}, {Name: "b", Width: 1, Data: []float32{-1, 0.5}}}
	buf, err := Encode(2, ts)
	if err != nil {
		t.Fatal(err)
	}
	n, got, err := Decode(buf)
	if err != nil {
		t.Fatal(err)
	}
	if n != 2 || len(got) != 2 || got[0].Name != "a" || got[0].Width != 3 || got[1].Data[1] != 0.5 || got[0].Data[5] != 6 {
		t.Fatalf("n=%d %+v", n, got)
	}
}

func TestMalformed(t *testing.T) {
	buf, _ := Encode(2, []Tensor{{Name: "a", Width: 2, Data: []float32{1, 2, 3, 4}}})
	for name, b := range map[string][]byte{
		"empty":     nil,
		"garbage":   []byte("not arrow at all, not at all"),
		"truncated": buf[:len(buf)/2],
	} {
		if _, _, err := Decode(b); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: err = %v", name, err)
		}
	}
	if _, err := Encode(3, []Tensor{{Name: "a", Width: 2, Data: []float32{1}}}); err == nil {
		t.Error("short tensor encoded")
	}
}

// TestCompressedRefused: a compressed frame claiming a huge uncompressed
// size is refused before arrow-go allocates it (it used to kill the
// process with an out-of-memory fatal error).
func TestCompressedRefused(t *testing.T) {
	if _, _, err := Decode(compressedFrame(t)); !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), "compressed") {
		t.Fatalf("err = %v", err)
	}
}

func FuzzDecode(f *testing.F) {
	buf, _ := Encode(2, []Tensor{{Name: "a", Width: 2, Data: []float32{1, 2, 3, 4}}})
	f.Add(buf)
	f.Add(dictFrame(f, arrow.PrimitiveTypes.Int16, 2, []float32{1, 2, 3, 4}, []int64{1, 0, 1}))
	f.Fuzz(func(t *testing.T, b []byte) {
		Decode(b) // must not panic
	})
}
