package hot

import (
	"errors"
	"slices"
	"testing"
)

func TestSnapshotRoundTrip(t *testing.T) {
	c := NewClass(4, 64<<10)
	row := []float32{1, 2, 3, 4}
	c.Lock()
	for i := range int64(300) {
		k := Key(uint32(1+i%3), i*7)
		c.Admit(k, Hash(k), row)
	}
	// Key(2, 7) is read far more often than the rest.
	hot := Key(2, 7)
	for range 12 {
		c.Count([]uint64{Hash(hot)})
	}
	snap := c.Snapshot()
	c.Unlock()
	snap.SortKeys()
	if len(snap.Keys) != 300 || !slices.IsSorted(snap.Keys) || snap.Dim != 4 || len(snap.Sketch) == 0 {
		t.Fatalf("snapshot: %d keys, sorted %v, dim %d, %d sketch words", len(snap.Keys), slices.IsSorted(snap.Keys), snap.Dim, len(snap.Sketch))
	}
	b, err := snap.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	var got Snapshot
	if err := got.UnmarshalBinary(b); err != nil {
		t.Fatal(err)
	}
	if got.Dim != snap.Dim || got.Slots != snap.Slots || got.Additions != snap.Additions ||
		!slices.Equal(got.Keys, snap.Keys) || !slices.Equal(got.Sketch, snap.Sketch) {
		t.Fatal("decoded snapshot differs")
	}
	if h := got.Hottest(); h[0] != hot || len(h) != 300 {
		t.Fatalf("hottest first: %x, want %x", h[0], hot)
	}
	// The sketch goes to a class of the same size only.
	same, other := NewClass(4, 64<<10), NewClass(4, 16<<10)
	same.Lock()
	// A key counted since the (new) class opened keeps its count.
	fresh := Key(3, 999999)
	for range 3 {
		same.Count([]uint64{Hash(fresh)})
	}
	if !same.RestoreSketch(&got) || same.sk.estimate(Hash(hot)) != c.sk.estimate(Hash(hot)) {
		t.Fatal("sketch not restored into a class of the same size")
	}
	if e := same.sk.estimate(Hash(fresh)); e < 3 {
		t.Fatalf("a count made before the restore: %d after it, want at least 3", e)
	}
	same.Unlock()
	if other.RestoreSketch(&got) {
		t.Fatal("sketch restored into a class of another size")
	}
	// Every truncation and every flipped byte is refused.
	for n := range len(b) {
		if err := new(Snapshot).UnmarshalBinary(b[:n]); !errors.Is(err, ErrSnapshot) {
			t.Fatalf("truncated to %d bytes: %v", n, err)
		}
	}
	for i := range b {
		bad := slices.Clone(b)
		bad[i] ^= 0x40
		if err := new(Snapshot).UnmarshalBinary(bad); !errors.Is(err, ErrSnapshot) {
			t.Fatalf("byte %d flipped: %v", i, err)
		}
	}
}

// FuzzSnapshot: no input panics the decoder or makes it allocate past
// its bytes, and what it accepts encodes to bytes that decode the same.
func FuzzSnapshot(f *testing.F) {
	c := NewClass(8, 16<<10)
	c.Lock()
	for i := range int64(20) {
		k := Key(1, i*i)
		c.Admit(k, Hash(k), make([]float32, 8))
	}
	s := c.Snapshot()
	c.Unlock()
	s.SortKeys()
	b, _ := s.MarshalBinary()
	f.Add(b)
	empty, _ := (&Snapshot{Dim: 1}).MarshalBinary()
	f.Add(empty)
	f.Add([]byte("PHS1"))
	f.Fuzz(func(t *testing.T, b []byte) {
		var s Snapshot
		if err := s.UnmarshalBinary(b); err != nil {
			if !errors.Is(err, ErrSnapshot) {
				t.Fatalf("error %v does not wrap ErrSnapshot", err)
			}
			return
		}
		out, err := s.MarshalBinary()
		if err != nil {
			t.Fatal(err)
		}
		var again Snapshot
		if err := again.UnmarshalBinary(out); err != nil || !slices.Equal(again.Keys, s.Keys) || !slices.Equal(again.Sketch, s.Sketch) {
			t.Fatalf("re-encoded snapshot does not decode the same: %v", err)
		}
	})
}

// TestWriteSnapshot: a class's snapshot written in parts is, joined,
// MarshalBinary's encoding of the same snapshot, every part but the last
// is partBytes long, an error from emit ends the write, and a class
// holding no row emits nothing.
func TestWriteSnapshot(t *testing.T) {
	c := NewClass(8, 64<<10)
	row := make([]float32, 8)
	c.Lock()
	for i := range int64(500) {
		k := Key(uint32(1+i%4), i*i*31)
		c.Admit(k, Hash(k), row)
		c.Count([]uint64{Hash(k)})
	}
	snap := c.Snapshot()
	c.Unlock()
	snap.SortKeys()
	want, err := snap.MarshalBinary()
	if err != nil {
		t.Fatal(err)
	}
	for _, size := range []int{1, 10, 100, 4096, 8 * snapshotSketchChunk, 1 << 20} {
		var got []byte
		var parts []int
		n, err := c.WriteSnapshot(size, func(p []byte) error {
			got = append(got, p...)
			parts = append(parts, len(p))
			return nil
		})
		if err != nil || n != len(snap.Keys) || !slices.Equal(got, want) {
			t.Fatalf("parts of %d: %d keys, err %v, %d bytes equal %v; want %d keys, %d bytes", size, n, err, len(got), slices.Equal(got, want), len(snap.Keys), len(want))
		}
		for i, l := range parts {
			if l > size || i < len(parts)-1 && l != size {
				t.Fatalf("parts of %d: part %d of %d is %d bytes", size, i, len(parts), l)
			}
		}
	}
	stop := errors.New("stop")
	calls := 0
	if _, err := c.WriteSnapshot(100, func([]byte) error { calls++; return stop }); err != stop || calls != 1 {
		t.Fatalf("emit failing: err %v after %d calls, want stop after 1", err, calls)
	}
	empty := NewClass(8, 64<<10)
	if n, err := empty.WriteSnapshot(100, func([]byte) error { t.Fatal("emitted for an empty class"); return nil }); n != 0 || err != nil {
		t.Fatalf("empty class: %d keys, %v", n, err)
	}
}

// BenchmarkSnapshot1M: a periodic save's CPU and memory for a tier of
// about a million dim-64 rows (bench-ltm-e2e's 320 MiB): WriteSnapshot
// in 4 MiB parts, the keys copied under the read lock, sorted, and
// encoded with the sketch a chunk at a time.
func BenchmarkSnapshot1M(b *testing.B) {
	c := NewClass(64, 320<<20)
	row := make([]float32, 64)
	c.Lock()
	for i := int64(0); !c.Full(); i++ {
		k := Key(uint32(1+i%26), (i*2654435761)%1911047)
		c.Admit(k, Hash(k), row)
	}
	c.Unlock()
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		total := 0
		n, err := c.WriteSnapshot(4<<20, func(p []byte) error { total += len(p); return nil })
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(total)/(1<<20), "MiB")
		b.ReportMetric(float64(n), "keys")
	}
}
