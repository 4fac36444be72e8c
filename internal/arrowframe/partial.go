package arrowframe

import "strings"

// A row-wise shard's part of a lookup output (plan.json sharding,
// shard[K].partial) travels in the shard's frame under names of its own,
// so that the parts of several shards never collide with each other or
// with a whole cut tensor, and the dense worker knows to combine them:
//
//   - PartialName(output), "prism.partial/" + output: the shard's
//     partial sums or maxima, as wide as the cut tensor output;
//   - CountName(output), "prism.count/" + output: width 1, per sample
//     the number of ids the shard held (for the sum_count and max_count
//     combines only).
//
// The dense worker combines the parts by the plan's combine rule into the
// cut tensor output before scoring (gpuserve/assemble.go).
const (
	partialPrefix = "prism.partial/"
	countPrefix   = "prism.count/"
)

// PartialName is the column of a shard's partial pools of output.
func PartialName(output string) string { return partialPrefix + output }

// CountName is the column of a shard's per-sample id counts of output.
func CountName(output string) string { return countPrefix + output }

// ParsePartial says whether name is a PartialName or a CountName
// (count) column, and of which output.
func ParsePartial(name string) (output string, count, ok bool) {
	if o, ok := strings.CutPrefix(name, partialPrefix); ok {
		return o, false, true
	}
	if o, ok := strings.CutPrefix(name, countPrefix); ok {
		return o, true, true
	}
	return "", false, false
}
