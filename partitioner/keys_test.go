package partitioner

import (
	"reflect"
	"testing"

	"github.com/prism-serve/prism/plan"
)

// TestKeySets: the keys a map sends into a set of rows (negative keys
// and keys past the map left out), the intersection of two key sets,
// and the largest ranges kept of a set of more than plan.json holds.
func TestKeySets(t *testing.T) {
	r := func(lo, hi int64) plan.KeyRange { return plan.KeyRange{Lo: lo, Hi: hi} }
	type kr = []plan.KeyRange
	for _, c := range []struct {
		name string
		got  []plan.KeyRange
		want []plan.KeyRange
	}{
		{"preimage", preimage([]int64{0, 3, 9, 2, 2, -1, 4, 7}, kr{r(0, 5)}), kr{r(0, 2), r(3, 5), r(6, 7)}},
		{"preimage of ranges", preimage([]int64{1, 6, 8, 3}, kr{r(0, 2), r(6, 9)}), kr{r(0, 3)}},
		{"preimage of nothing", preimage([]int64{7, 8}, kr{r(0, 5)}), nil},
		{"intersect", intersectKeys(kr{r(0, 10), r(20, 30)}, kr{r(5, 22), r(25, 26), r(29, 40)}), kr{r(5, 10), r(20, 22), r(25, 26), r(29, 30)}},
		{"intersect apart", intersectKeys(kr{r(0, 3)}, kr{r(3, 9)}), nil},
		{"trim keeps the largest in order", trimKeys(kr{r(0, 1), r(2, 6), r(7, 8), r(10, 13), r(20, 21)}, 3), kr{r(0, 1), r(2, 6), r(10, 13)}},
		{"trim under the bound", trimKeys(kr{r(0, 1), r(2, 6)}, 3), kr{r(0, 1), r(2, 6)}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if !reflect.DeepEqual(c.got, c.want) {
				t.Fatalf("got %v, want %v", c.got, c.want)
			}
		})
	}
}
