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
// content hash. A table read under another name too (another model's,
// or another table of the model's) is copied before its first update,
// and the updated table reads the copy from then on (cow.go): no model
// sees another's updates. Versions of one model share freely.
//
// Updates belong to the model, not to a version: AppliedSeq numbers them
// per model, and the router trusts it. So a version switch (Activate,
// Rollback, an activating Ingest) carries them forward: every upsert
// also keeps the row as sent in the model's overlay, and the switch
// writes the overlay into the new version's tables in the same atomic
// batch as the catalog change (carry.go). We chose this over resetting
// AppliedSeq on a switch because a reset can only be repaired by a
// replay from the router's log, which (in memory, bounded) often no
// longer reaches update 1: every worker that switched would be out of
// serving, the whole model if all did. Rows that do not fit the new
// version (another dim, fewer rows, no such table) are not carried, as a
// replay of them would be refused there.
package store
