// Package store is Prism's embedding store: every row of every table in
// Pebble, a byte-bounded hot tier (package hot) in front, lookups that
// pool rows into a caller-owned buffer, online upserts that are durable
// before they are acknowledged, and model versions switched atomically.
//
// Keys are 12 bytes, big-endian (physical table id uint32, row id
// uint64), so a table is one contiguous key range and a batch's misses,
// sorted, are read in key order through one iterator. Table id 0 holds the
// store's own metadata (the catalog).
//
// A physical table is a table's content (its SHA-256 from
// internal/tablefile) in one dtype; model versions name physical tables,
// so two models, or two versions of one model, whose plans hold the same
// table read one copy. Upserts change the physical table in place and
// mark it mutated, after which it no longer stands for the original
// content hash.
package store
