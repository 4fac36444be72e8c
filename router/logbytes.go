package router

import (
	"reflect"
	"slices"
	"sync"

	"github.com/prism-serve/prism/api/prismv1"
)

// The update log's byte budget (--update-log-bytes, and
// --update-log-total-bytes over every log) bounds the router's memory,
// so it counts what an entry holds in the Go heap, not its wire size
// (proto.Size): the wire size counts an id as a varint (1 byte for a
// small one, where memory holds 8) and none of the message structs,
// the strings' and slices' headers, or the allocator's rounding. An
// update of one row of 16 floats is about 90 bytes on the wire and 360
// in memory; a log of them budgeted by wire size held 3.9 times its
// budget, of a shard's one-float rows 5.5 times
// (TestUpdateLogHeapWithinBudget).

// logSlotBytes is what the log's slice of entries holds per entry: a
// pointer, and as much again for the slice's spare capacity (a trim
// drops the oldest by reslicing, an append past the capacity copies to
// an array up to twice the length).
const logSlotBytes = 16

// mallocHeaderBytes is what the Go allocator adds to an object holding
// pointers that is larger than mallocHeaderAbove (its type's header).
const mallocHeaderBytes, mallocHeaderAbove = 8, 512

// pageBytes is the Go heap's page: an object larger than the largest
// size class takes whole pages.
const pageBytes = 8 << 10

// The message structs' sizes, the protobuf internal state (the message
// info pointer, the size cache, the unknown fields' slice header)
// included: read once, not per entry.
var (
	applyStructBytes  = scanAllocBytes(int(reflect.TypeFor[prismv1.ApplyUpdateRequest]().Size()))
	updateStructBytes = scanAllocBytes(int(reflect.TypeFor[prismv1.UpdateRequest]().Size()))
)

// heldBytes estimates the Go heap an update log entry holds: the
// entry's and its UpdateRequest's structs, their strings, the ids' and
// rows' arrays by their capacity (a split update's parts grow by
// append, up to twice their length), the unknown fields kept, each
// rounded up as the allocator does, and the log's slot. It reads no
// reflection per entry: it runs at every append and trim, and an entry
// is counted in and out by it alike (entries are never changed), so a
// log's count returns to zero as it empties. A request shared by several
// entries (a table-wise update every shard of an earlier release's
// workers numbers) is counted in each: the count errs high, never low.
func heldBytes(e *prismv1.ApplyUpdateRequest) int64 {
	n := logSlotBytes + applyStructBytes + allocBytes(len(e.GetSequence())) + allocBytes(cap(e.ProtoReflect().GetUnknown()))
	if t := e.GetSkippedTables(); cap(t) > 0 {
		n += scanAllocBytes(cap(t) * 16)
		for _, name := range t {
			n += allocBytes(len(name))
		}
	}
	if u := e.GetUpdate(); u != nil {
		n += updateMessageBytes(u)
	}
	return n
}

// updateMessageBytes estimates the Go heap an UpdateRequest holds: its
// struct, its strings, its ids' and rows' arrays by their capacity and
// the unknown fields kept, each rounded up as the allocator does: what
// proto.Unmarshal (gRPC's codec) allocates for one read off the wire.
func updateMessageBytes(u *prismv1.UpdateRequest) int64 {
	return updateStructBytes + allocBytes(len(u.GetModel())) + allocBytes(len(u.GetTable())) +
		allocBytes(8*cap(u.GetIds())) + allocBytes(cap(u.GetRows())) + allocBytes(cap(u.ProtoReflect().GetUnknown()))
}

// mergedHeldBytes is heldBytes of the entry merged (merged) from
// updates of first's model and table with ids ids and rows row bytes in
// all: merged allocates the ids and rows at their length and shares
// first's strings (counted all the same, as heldBytes counts them). A
// shard's sequence name, a few dozen bytes, is left out (gather does
// not know it yet).
func mergedHeldBytes(first *prismv1.UpdateRequest, ids, rows int) int64 {
	return logSlotBytes + applyStructBytes + updateStructBytes +
		allocBytes(len(first.GetModel())) + allocBytes(len(first.GetTable())) + allocBytes(8*ids) + allocBytes(rows)
}

// allocBytes is the heap the Go allocator takes for an object of n
// bytes holding no pointers: the size class it is rounded up to, or
// whole pages past the largest class.
func allocBytes(n int) int64 {
	if n <= 0 {
		return 0
	}
	classes := sizeClasses()
	if n > classes[len(classes)-1] {
		return int64((n + pageBytes - 1) / pageBytes * pageBytes)
	}
	i, _ := slices.BinarySearch(classes, n)
	return int64(classes[i])
}

// scanAllocBytes is allocBytes for an object holding pointers, which
// past mallocHeaderAbove bytes carries the allocator's header too.
func scanAllocBytes(n int) int64 {
	if n > mallocHeaderAbove {
		n += mallocHeaderBytes
	}
	return allocBytes(n)
}

// allocSink keeps sizeClasses' probes on the heap (a slice that does
// not escape may be given a buffer on the stack, which is not rounded).
var allocSink []byte

// sizeClasses are the Go allocator's small object sizes, ascending, as
// this runtime rounds them: append rounds a new array's capacity up to
// its size class, so the capacity of an array grown from nothing to n
// bytes is the class of n, and the next class is that of one byte more.
// Read once (about 70 allocations, 0.6 MB in all), rather than kept as a
// copy of the runtime's table that a later Go could change.
var sizeClasses = sync.OnceValue(func() []int {
	const largest = 32 << 10 // the runtime's largest small object
	var out []int
	for n := 1; n <= largest; {
		allocSink = append([]byte(nil), make([]byte, n)...)
		c := cap(allocSink)
		if c > largest {
			break
		}
		out = append(out, c)
		n = c + 1
	}
	allocSink = nil
	return out
})
