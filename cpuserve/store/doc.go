// Package store is Prism's embedding store: every row of every table in
// Pebble, a byte-bounded hot tier (package hot) in front, lookups that
// pool rows into a caller-owned buffer, online upserts that are durable
// before they are acknowledged, and model versions switched atomically.
//
// Keys are 12 bytes, big-endian (physical table id uint32, row id
// uint64), so a table is one contiguous key range and a batch's misses,
// sorted, are read in key order through one iterator per table, or per
// key range when a large miss set is split among concurrent readers
// (missread.go). Table id 0 holds the store's own metadata (the catalog).
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
// writes the overlay into the new version's tables, atomically with the
// catalog change (carry.go), and marks those tables mutated. We chose
// this over resetting
// AppliedSeq on a switch because a reset can only be repaired by a
// replay from the router's log, which (in memory, bounded) often no
// longer reaches update 1: every worker that switched would be out of
// serving, the whole model if all did. Rows that do not fit the new
// version (another dim, fewer rows, no such table) are not carried, as a
// replay of them would be refused there. A sharded model's AppliedSeq
// counts the sequence of the shard its active version holds (the router
// numbers each shard's updates apart), so a switch to a version of
// another shard, another sharding or the whole model sets it to 0
// (carry.go): the router replays that shard's updates.
//
// The overlay's cost. It holds one key per distinct (model, table, row)
// ever updated: 18+len(model)+len(table) bytes of key and 4*dim of value
// (float32 as sent, whatever the table's dtype), 276 B at dim 64 with
// one-letter names, plus Pebble's per-key overhead: about 0.28 GB per
// million distinct updated rows at dim 64. Updating a row again replaces
// its key; nothing else shrinks the overlay but DropVersion, which
// deletes the overlay of every table name no remaining version of the
// model names (those updates are forgotten: a later version with that
// table name again starts from its ingested rows), and, with a model's
// last version, the model's whole overlay and its update seq (AppliedSeq
// 0 again). Every switch rewrites the whole overlay of the tables it
// activates that the old version does not share: it reads each overlay
// row and writes it into the new table, in Pebble batches of at most
// about 64 MiB (carryBatchBytes; some 240,000 rows at dim 64, float32),
// holding one batch and its decoded rows (about twice that) in memory.
// The switch holds the catalog and update locks throughout, so upserts
// and other catalog changes wait for it (lookups go on, on the old
// version): its time grows linearly with the overlay. Nothing yet folds
// the overlay into a new base version to bound it.
package store
