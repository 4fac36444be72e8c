//go:build cgo

package store

// pebbleOffHeap: with cgo, Pebble allocates its block cache and
// memtables with C's calloc (its internal/manual package), outside the
// Go heap and Go's memory limit.
const pebbleOffHeap = true
