package store

import (
	"context"
	"errors"
	"fmt"
	"github.com/prism-serve/prism/plan"
	"testing"
)

func TestBadInput(t *testing.T) {
	tables := []*testTable{
		{name: "a", rows: 100, dim: 4, seed: 1},
		{name: "h", rows: 10, dim: 4, seed: 2, unknown: plan.UnknownHash},
		{name: "z", rows: 10, dim: 4, seed: 3, unknown: plan.UnknownZero},
	}
	plan := writePlan(t, "m", tables)
	s, _ := openMem(t, nil)
	if _, err := s.Ingest(context.Background(), plan, IngestOptions{}); err != nil {
		t.Fatal(err)
	}
	out := func(n int) []float32 { return make([]float32, n) }
	lookupCases := []struct {
		name  string
		model string
		req   TableLookup
		want  error
	}{
		{"unknown model", "nope", TableLookup{Table: "a", IDs: []int64{1}, Out: out(4)}, ErrUnknownModel},
		{"unknown table", "m", TableLookup{Table: "b", IDs: []int64{1}, Out: out(4)}, ErrUnknownTable},
		{"id out of range", "m", TableLookup{Table: "a", IDs: []int64{1, 100}, Out: out(8)}, ErrIDOutOfRange},
		{"negative id", "m", TableLookup{Table: "a", IDs: []int64{-1}, Out: out(4)}, ErrNegativeID},
		{"negative id, hash policy", "m", TableLookup{Table: "h", IDs: []int64{-5}, Out: out(4)}, ErrNegativeID},
		{"offsets not monotone", "m", TableLookup{Table: "a", IDs: []int64{1, 2, 3}, Offsets: []int64{0, 2, 1, 3}, Out: out(12)}, ErrBadOffsets},
		{"offsets not starting at 0", "m", TableLookup{Table: "a", IDs: []int64{1, 2}, Offsets: []int64{1, 2}, Out: out(4)}, ErrBadOffsets},
		{"offsets not ending at len", "m", TableLookup{Table: "a", IDs: []int64{1, 2}, Offsets: []int64{0, 1}, Out: out(4)}, ErrBadOffsets},
		{"out too small", "m", TableLookup{Table: "a", IDs: []int64{1, 2}, Out: out(7)}, ErrDimMismatch},
		{"bag does not divide", "m", TableLookup{Table: "a", IDs: []int64{1, 2, 3}, Bag: 2, Out: out(8)}, ErrBadRequest},
		{"weights length", "m", TableLookup{Table: "a", IDs: []int64{1, 2}, Weights: []float32{1}, Out: out(8)}, ErrBadRequest},
		{"pooling", "m", TableLookup{Table: "a", IDs: []int64{1}, Pooling: "median", Out: out(4)}, ErrBadRequest},
	}
	good := TableLookup{Table: "a", IDs: []int64{3}, Out: out(4)}
	for _, c := range lookupCases {
		t.Run(c.name, func(t *testing.T) {
			err := s.Lookup(c.model, []TableLookup{good, c.req})
			if !errors.Is(err, c.want) || !IsInputError(err) {
				t.Fatalf("got %v, want %v", err, c.want)
			}
			// The store keeps serving.
			if err := s.Lookup("m", []TableLookup{good}); err != nil {
				t.Fatalf("after %v: %v", c.want, err)
			}
		})
	}

	upsertCases := []struct {
		name  string
		table string
		ids   []int64
		rows  []float32
		want  error
	}{
		{"dim mismatch", "a", []int64{1}, out(5), ErrDimMismatch},
		{"unknown table", "q", []int64{1}, out(4), ErrUnknownTable},
		{"out of range", "a", []int64{100}, out(4), ErrIDOutOfRange},
		{"negative", "a", []int64{-1}, out(4), ErrNegativeID},
	}
	for _, c := range upsertCases {
		t.Run("upsert "+c.name, func(t *testing.T) {
			if err := s.Upsert("m", c.table, c.ids, c.rows); !errors.Is(err, c.want) {
				t.Fatalf("got %v, want %v", err, c.want)
			}
		})
	}

	t.Run("unknown id policies", func(t *testing.T) {
		h := TableLookup{Table: "h", IDs: []int64{13}, Out: out(4)}
		z := TableLookup{Table: "z", IDs: []int64{2, 99}, Bag: 2, Pooling: PoolSum, Out: out(4)}
		if err := s.Lookup("m", []TableLookup{h, z}); err != nil {
			t.Fatal(err)
		}
		for k := range 4 {
			if h.Out[k] != tables[1].data[3*4+k] {
				t.Fatalf("hash policy: id 13 of 10 rows should read row 3: %v", h.Out)
			}
			if z.Out[k] != tables[2].data[2*4+k] {
				t.Fatalf("zero policy: unknown id should add a zero row: %v", z.Out)
			}
		}
	})
	if m := s.Metrics(); m.Errors != int64(len(lookupCases)) {
		t.Errorf("error counter %d, want %d", m.Errors, len(lookupCases))
	}
}

// A bad input's error is ErrBadRequest, and an input error, without
// saying "bad request"; one wrapping another error is that one too.
func TestBadRequestf(t *testing.T) {
	err := badRequestf("table %q: %d weights for %d ids", "t", 3, 4)
	if !errors.Is(err, ErrBadRequest) || !IsInputError(err) {
		t.Fatalf("%v is not ErrBadRequest", err)
	}
	if got, want := err.Error(), `table "t": 3 weights for 4 ids`; got != want {
		t.Fatalf("%q, want %q", got, want)
	}
	inner := errors.New("plan: bad sharding")
	wrapped := fmt.Errorf("ingest: %w", badRequestf("%w", inner))
	if !errors.Is(wrapped, inner) || !errors.Is(wrapped, ErrBadRequest) || wrapped.Error() != "ingest: plan: bad sharding" {
		t.Fatalf("%q: is inner %v, is ErrBadRequest %v", wrapped, errors.Is(wrapped, inner), errors.Is(wrapped, ErrBadRequest))
	}
}
