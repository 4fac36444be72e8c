//go:build !cgo

package store

// pebbleOffHeap: without cgo, Pebble's block cache and memtables are Go
// slices, inside the Go heap and Go's memory limit.
const pebbleOffHeap = false
