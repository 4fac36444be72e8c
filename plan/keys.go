package plan

import (
	"fmt"
	"math"
	"slices"
)

// MaxKeyRanges bounds TensorInfo.Keys: the partitioner keeps the
// largest ranges of a key set that has more (a sample of the valid
// keys, every one of them valid), so that plan.json stays small
// whatever the vocabulary.
const MaxKeyRanges = 256

// KeyRange is the keys [Lo, Hi).
type KeyRange struct {
	Lo int64 `json:"lo"`
	Hi int64 `json:"hi"`
}

// Len is the number of keys in r.
func (r KeyRange) Len() int64 { return r.Hi - r.Lo }

// HasKey says whether ks (sorted, disjoint) holds k.
func HasKey(ks []KeyRange, k int64) bool {
	i, _ := slices.BinarySearchFunc(ks, k, func(r KeyRange, k int64) int {
		switch {
		case r.Hi <= k:
			return -1
		case r.Lo > k:
			return 1
		}
		return 0
	})
	return i < len(ks) && ks[i].Lo <= k && k < ks[i].Hi
}

// checkKeys checks an input's keys: on an integer input, at most
// MaxKeyRanges ranges, each non-empty, sorted and disjoint.
func checkKeys(where string, in TensorInfo) error {
	if in.Keys == nil {
		return nil
	}
	switch {
	case in.DType != "int64" && in.DType != "int32":
		return fmt.Errorf("%s %q: keys on a %s input (keys are ids of an int64 or int32 input)", where, in.Name, in.DType)
	case in.Offsets != "":
		return fmt.Errorf("%s %q: keys on a jagged input", where, in.Name)
	case len(in.Keys) == 0:
		return fmt.Errorf("%s %q: keys is empty (leave it out when any id of the tables is a valid key)", where, in.Name)
	case len(in.Keys) > MaxKeyRanges:
		return fmt.Errorf("%s %q: %d key ranges, want at most %d", where, in.Name, len(in.Keys), MaxKeyRanges)
	}
	n := int64(0)
	for i, r := range in.Keys {
		if r.Hi <= r.Lo {
			return fmt.Errorf("%s %q: keys[%d] [%d, %d) is empty", where, in.Name, i, r.Lo, r.Hi)
		}
		if i > 0 && r.Lo <= in.Keys[i-1].Hi {
			return fmt.Errorf("%s %q: keys[%d] [%d, %d) does not start after keys[%d] [%d, %d) (ranges sorted, disjoint and apart)", where, in.Name, i, r.Lo, r.Hi, i-1, in.Keys[i-1].Lo, in.Keys[i-1].Hi)
		}
		if r.Len() <= 0 || n > math.MaxInt64-r.Len() {
			return fmt.Errorf("%s %q: keys: the count of keys overflows", where, in.Name)
		}
		n += r.Len()
	}
	return nil
}
