package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"

	"github.com/prism-serve/prism/plan"

	"github.com/cockroachdb/pebble/v2"
)

// catalog is the store's metadata, one JSON value under catalogKey,
// rewritten (synced) on every change, so each change is atomic: a
// version switch, a table becoming ready, an ingest's progress.
type catalog struct {
	NextTable uint32                 `json:"next_table"`
	HotBytes  int64                  `json:"hot_bytes,omitempty"`
	Tables    map[uint32]*physTable  `json:"tables"`
	Models    map[string]*modelEntry `json:"models"`
}

type tableState string

const (
	stateIngesting tableState = "ingesting" // never served
	stateReady     tableState = "ready"
	// stateCopying is a copy-on-write copy being written (cow.go): never
	// served, and deleted by Open if a crash left it.
	stateCopying tableState = "copying"
)

// physTable is one stored copy of a table's content in one dtype.
type physTable struct {
	ID     uint32     `json:"id"`
	SHA256 string     `json:"sha256"`
	Rows   int64      `json:"rows"`
	Dim    int        `json:"dim"`
	DType  DType      `json:"dtype"`
	State  tableState `json:"state"`
	// NextRow is the ingest's progress: rows [0, NextRow) are in Pebble.
	NextRow int64 `json:"next_row"`
	// Mutated is set by the first upsert: the rows no longer match SHA256,
	// so a later ingest of that content gets its own copy.
	Mutated bool   `json:"mutated,omitempty"`
	Loss    *Loss  `json:"loss,omitempty"`
	Source  string `json:"source,omitempty"`
	// Part, if set, is the rows of a row-wise sharded table it holds
	// (shard.go); NextRow still counts rows of the whole table.
	Part *RowPart `json:"part,omitempty"`
}

// modelEntry is a model's versions. Active serves; Previous is what
// Rollback returns to.
type modelEntry struct {
	Active   int              `json:"active"`
	Previous int              `json:"previous,omitempty"`
	Versions map[int]*version `json:"versions"`
}

type version struct {
	N       int                      `json:"n"`
	Plan    string                   `json:"plan,omitempty"`
	Created string                   `json:"created,omitempty"`
	Tables  map[string]*versionTable `json:"tables"`
	// Shard, if set, is the shard of the plan's sharding it holds.
	Shard *ShardRef `json:"shard,omitempty"`
}

type versionTable struct {
	Phys       uint32          `json:"phys"`
	UnknownIDs plan.UnknownIDs `json:"unknown_ids,omitempty"`
}

func newCatalog() *catalog {
	return &catalog{NextTable: 1, Tables: map[uint32]*physTable{}, Models: map[string]*modelEntry{}}
}

func (c *catalog) clone() *catalog {
	buf, err := json.Marshal(c)
	if err != nil {
		panic(err)
	}
	var out catalog
	if err := json.Unmarshal(buf, &out); err != nil {
		panic(err)
	}
	if out.Tables == nil {
		out.Tables = map[uint32]*physTable{}
	}
	if out.Models == nil {
		out.Models = map[string]*modelEntry{}
	}
	return &out
}

func loadCatalog(db *pebble.DB) (*catalog, error) {
	v, closer, err := db.Get(catalogKey)
	if err == pebble.ErrNotFound {
		return newCatalog(), nil
	}
	if err != nil {
		return nil, fmt.Errorf("read catalog: %w", err)
	}
	defer closer.Close()
	c := newCatalog()
	if err := json.Unmarshal(v, c); err != nil {
		return nil, fmt.Errorf("read catalog: %w: %w", ErrCorrupt, err)
	}
	return c, nil
}

// notUpdateLog refuses a folder that holds a router's update log
// (router/updatelog.go: keys "e...", "o..." and "s...", where every store key
// starts with a 4-byte table id) and no catalog: given a router's
// --update-log-dir as --db, a worker would otherwise start with an empty
// store and write its tables beside the log.
func notUpdateLog(db *pebble.DB) error {
	it, err := db.NewIter(&pebble.IterOptions{LowerBound: []byte("e"), UpperBound: []byte("t")})
	if err != nil {
		return err
	}
	defer it.Close()
	for _, prefix := range []byte("eos") {
		if it.SeekGE([]byte{prefix}) && it.Key()[0] == prefix {
			return errors.New("the folder holds a router's update log (serve router --update-log-dir), not an embedding store: give the store a folder of its own")
		}
	}
	return it.Error()
}

func (c *catalog) save(db *pebble.DB) error {
	buf, err := json.Marshal(c)
	if err != nil {
		return fmt.Errorf("write catalog: %w", err)
	}
	if err := db.Set(catalogKey, buf, pebble.Sync); err != nil {
		return fmt.Errorf("write catalog: %w", err)
	}
	return nil
}

// referenced is the set of physical tables some model version names.
func (c *catalog) referenced() map[uint32]bool {
	ref := map[uint32]bool{}
	for _, m := range c.Models {
		for _, v := range m.Versions {
			for _, t := range v.Tables {
				ref[t.Phys] = true
			}
		}
	}
	return ref
}

// sharedBeyond says whether physical table id is read under a name other
// than model's table (another model's, or another table of model's): an
// update of model's table must then copy it first (cow.go). Versions of
// one model share a table freely: they hold the same updates.
func (c *catalog) sharedBeyond(id uint32, model, table string) bool {
	for mn, m := range c.Models {
		for _, v := range m.Versions {
			for tn, vt := range v.Tables {
				if vt.Phys == id && (mn != model || tn != table) {
					return true
				}
			}
		}
	}
	return false
}

// findReady is a ready, unmutated copy of content sha in dtype, if any.
func (c *catalog) findReady(sha string, dt DType, part *RowPart) *physTable {
	return c.find(sha, dt, part, stateReady)
}

func (c *catalog) find(sha string, dt DType, part *RowPart, st tableState) *physTable {
	ids := make([]uint32, 0, len(c.Tables))
	for id := range c.Tables {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	for _, id := range ids {
		t := c.Tables[id]
		if t.SHA256 == sha && t.DType == dt && t.State == st && !t.Mutated && t.Part.equal(part) {
			return t
		}
	}
	return nil
}

// same is the version of m that reads the tables of v (each name the
// same physical table, with the same unknown-ids rule) and holds the same
// shard, 0 if none does.
func (m *modelEntry) same(v *version) int {
	for _, n := range slices.Sorted(maps.Keys(m.Versions)) {
		o := m.Versions[n]
		if len(o.Tables) != len(v.Tables) || !sameShardRef(o.Shard, v.Shard) {
			continue
		}
		eq := true
		for tn, vt := range v.Tables {
			if ot := o.Tables[tn]; ot == nil || *ot != *vt {
				eq = false
				break
			}
		}
		if eq {
			return n
		}
	}
	return 0
}

// sameShardRef says whether two versions record the same shard (both nil:
// the whole model).
func sameShardRef(a, b *ShardRef) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

func (m *modelEntry) latest() int {
	n := 0
	for v := range m.Versions {
		n = max(n, v)
	}
	return n
}
