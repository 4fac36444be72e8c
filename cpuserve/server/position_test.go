package server

import (
	"errors"
	"fmt"
	"testing"

	"github.com/prism-serve/prism/cpuserve/store"
	"github.com/prism-serve/prism/internal/prelookup"
	"github.com/prism-serve/prism/plan"
)

// TestPrePosition: an id outside its table that a lookup's pre-lookup
// ops made is reported with the input and the sample it came from, not
// as ids[k] of the ops' output, which read as the request's k-th id
// named another sample (or another column of a packed input); the error
// is still the store's bad-id error (errors.Is, IsInputError).
func TestPrePosition(t *testing.T) {
	info := plan.TensorInfo{Name: "sparse", DType: "int64", Shape: []int64{4}}
	compile := func(ops ...plan.PreOp) *prelookup.Program {
		p, err := prelookup.Compile(info, ops)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	m := &model{name: "m", lookups: []lookupSpec{
		{table: "shared", rows: 200, l: plan.Lookup{Input: "sparse", Bag: 1, Rank1: true}, pre: compile(plan.PreOp{Op: plan.PreColumn, Index: 1})},
		{table: "shared", rows: 200, l: plan.Lookup{Input: "sparse", Bag: 1, Rank1: true},
			pre: compile(plan.PreOp{Op: plan.PreColumn, Index: 2}, plan.PreOp{Op: plan.PreAdd, Values: []int64{100}})},
		{table: "bags", rows: 50, l: plan.Lookup{Input: "sparse", Bag: 2}, pre: compile(plan.PreOp{Op: plan.PreSlice, Start: 2, End: 4})},
		{table: "plain", rows: 10, l: plan.Lookup{Input: "ids", Bag: 1, Rank1: true}},
	}}
	// Three samples of sparse; the lookups' ids after their ops.
	sparse := []int64{0, 1, 2, 3, 10, 11, 12, 13, 20, 21, 150, 60}
	vals := map[string]*value{"sparse": {width: 4, i64: sparse}, "ids": {width: 1, i64: []int64{1, 2, 30}}}
	batch := []store.TableLookup{
		{Table: "shared", IDs: []int64{1, 11, 21}},
		{Table: "shared", IDs: []int64{102, 112, 250}},
		{Table: "bags", IDs: []int64{2, 3, 12, 13, 150, 60}},
		{Table: "plain", IDs: []int64{1, 2, 30}},
	}
	for _, c := range []struct {
		name string
		bad  *store.IDError
		want string
	}{
		{"offset column", &store.IDError{Table: "shared", Index: 2, ID: 250, Rows: 200, Err: store.ErrIDOutOfRange},
			`model "m": input "sparse", sample 2: the lookup's pre-lookup ops make id 250 for table "shared", which has 200 rows: id out of range`},
		{"bag", &store.IDError{Table: "bags", Index: 5, ID: 60, Rows: 50, Err: store.ErrIDOutOfRange},
			`model "m": input "sparse", sample 2: the lookup's pre-lookup ops make id 60 (bag position 1) for table "bags", which has 50 rows: id out of range`},
		{"no ops", &store.IDError{Table: "plain", Index: 2, ID: 30, Rows: 10, Err: store.ErrIDOutOfRange},
			`model "m": table "plain": ids[2]=30, table has 10 rows: id out of range`},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := requestPosition(storeErr(c.bad), m, vals, batch, nil)
			if err == nil || err.Error() != c.want {
				t.Fatalf("error\n %v\nwant\n %s", err, c.want)
			}
			if !errors.Is(err, store.ErrIDOutOfRange) || !store.IsInputError(err) {
				t.Errorf("%v is not the store's bad-id error", err)
			}
		})
	}
	neg := requestPosition(storeErr(&store.IDError{Table: "shared", Index: 0, ID: -5, Err: store.ErrNegativeID}), m, vals,
		[]store.TableLookup{{Table: "shared", IDs: []int64{-5, 11, 21}}, batch[1], batch[2], batch[3]}, nil)
	if want := `model "m": input "sparse", sample 0: the lookup's pre-lookup ops make id -5 for table "shared": negative id`; neg == nil || neg.Error() != want || !errors.Is(neg, store.ErrNegativeID) {
		t.Errorf("error\n %v\nwant\n %s", neg, want)
	}
}

// storeErr wraps a bad id's error as the store's Lookup does.
func storeErr(bad *store.IDError) error { return fmt.Errorf("model %q: %w", "m", bad) }
