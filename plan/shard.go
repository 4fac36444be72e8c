package plan

import (
	"fmt"
	"hash/fnv"
	"math"
	"slices"
	"strings"
)

// Sharding is plan.json's optional "sharding" section, written by
// `prism shard`: how the model's tables spread over several embedding
// workers (shards), and what each shard answers. A plan without it is
// served whole by every embedding worker. Adding it changes nothing
// else in the plan, so it needs no new plan version: a build that does
// not know the section ignores it and ingests every table.
type Sharding struct {
	// Shards is the number of shards, numbered 0 to Shards-1.
	Shards int `json:"shards"`
	// ShardBytes is the budget of float32 table bytes per shard the
	// plan was made for.
	ShardBytes int64 `json:"shard_bytes"`
	// Estimate says where the expected lookups came from: "uniform",
	// "zipf:S" (row r drawn with weight 1/(r+1)^S) or "criteo:FILE".
	Estimate string `json:"estimate"`
	// Tolerance is the lookup balance the planner aimed at: every
	// shard's expected lookups within (1+Tolerance) of the mean.
	Tolerance float64 `json:"tolerance"`
	// Imbalance is the plan's: the most loaded shard's expected lookups
	// over the mean, minus 1 (0: perfectly balanced).
	Imbalance float64 `json:"imbalance"`
	// Tables places every table of the plan, in the plan's table order.
	Tables []TablePlacement `json:"tables"`
	// Shard describes each shard, by shard number.
	Shard []ShardInfo `json:"shard"`
}

// Placement is how a table is placed.
type Placement string

const (
	// TableWise: the whole table on one shard.
	TableWise Placement = "table"
	// RowWise: row r on shard Shards[r mod len(Shards)]. Modulo rather
	// than contiguous ranges: with ids in frequency order (the hottest
	// ids the lowest) a contiguous first range would take most lookups,
	// while modulo spreads the hot head over every shard; ingest streams
	// the table in row order either way.
	RowWise Placement = "row"
)

// TablePlacement is where one table's rows live.
type TablePlacement struct {
	Table     string    `json:"table"`
	Placement Placement `json:"placement"`
	// Shards holds the table: one shard table-wise; row-wise, row r is
	// on Shards[r mod len(Shards)] (distinct shards, at least two).
	Shards []int `json:"shards"`
}

// Combine is how the dense side assembles a lookup output from the
// shards' parts (see ShardInfo.Partial).
type Combine string

const (
	// CombineSum: add the parts elementwise. Sum pooling (each shard
	// sums w·row over the ids it holds), and unpooled lookups (each
	// shard writes the rows of the ids it holds and zeros elsewhere, so
	// every position is filled by exactly one shard).
	CombineSum Combine = "sum"
	// CombineSumCount: mean pooling. Each shard sends the sum of w·row
	// over the ids it holds and, per sample, the count of those ids; the
	// mean is the summed sums over the summed counts (zeros for an
	// empty bag), as the whole table gives.
	CombineSumCount Combine = "sum_count"
	// CombineMaxCount: max pooling. Each shard sends the elementwise
	// max of w·row over the ids it holds and, per sample, their count; a
	// part with count 0 takes no part in the max; a bag empty
	// everywhere gives zeros.
	CombineMaxCount Combine = "max_count"
)

// ShardInfo is one shard: its share, and the lookup outputs it answers.
type ShardInfo struct {
	Shard int `json:"shard"`
	// Rows and Bytes (float32) it holds.
	Rows  int64 `json:"rows"`
	Bytes int64 `json:"bytes"`
	// Lookups is its expected row lookups per sample.
	Lookups float64 `json:"lookups"`
	// Full lists the lookup outputs it answers whole: the lookups of
	// its table-wise tables, sent as columns of the frame.
	Full []string `json:"full,omitempty"`
	// Partial lists the lookup outputs of row-wise tables it holds part
	// of: it answers them over the ids in its rows only, and the dense
	// side combines the parts of every shard of the table.
	Partial []PartialOutput `json:"partial,omitempty"`
}

// PartialOutput is a lookup output a shard answers in part.
type PartialOutput struct {
	Output  string  `json:"output"`
	Table   string  `json:"table"`
	Pooling Pooling `json:"pooling"`
	Combine Combine `json:"combine"`
	// Weighted: per-sample weights multiply each row before the shard
	// sums or takes the max.
	Weighted bool `json:"weighted,omitempty"`
}

// TablesFingerprint identifies the embedding tables of p: each table's
// name and content (SHA256), 16 hex digits (FNV-1a 64); "" when a table
// has no recorded content. Every shard of a model ingested from one
// sharded plan has it, whichever tables the shard holds.
func (p *Plan) TablesFingerprint() string {
	h := fnv.New64a()
	tables := slices.Clone(p.Tables)
	slices.SortFunc(tables, func(a, b Table) int { return strings.Compare(a.Name, b.Name) })
	for _, t := range tables {
		if t.SHA256 == "" {
			return ""
		}
		fmt.Fprintf(h, "%q %s\n", t.Name, t.SHA256)
	}
	return fmt.Sprintf("%016x", h.Sum64())
}

// Fingerprint identifies the sharding's layout: its shard count and
// every table's placement and shards, 16 hex digits (FNV-1a 64). The
// planner's estimates and statistics do not count: two plans that put
// every row in the same shard have the same fingerprint.
func (s *Sharding) Fingerprint() string {
	if s == nil {
		return ""
	}
	h := fnv.New64a()
	fmt.Fprintf(h, "shards=%d\n", s.Shards)
	tables := slices.Clone(s.Tables)
	slices.SortFunc(tables, func(a, b TablePlacement) int { return strings.Compare(a.Table, b.Table) })
	for _, t := range tables {
		fmt.Fprintf(h, "%q %s %v\n", t.Table, t.Placement, t.Shards)
	}
	return fmt.Sprintf("%016x", h.Sum64())
}

// ShardOf is the shard holding row of the table (row within the table,
// after the table's unknown_ids rule).
func (t *TablePlacement) ShardOf(row int64) int {
	if len(t.Shards) == 1 {
		return t.Shards[0]
	}
	return t.Shards[row%int64(len(t.Shards))]
}

// Part is which rows of the table shard holds: rows r with
// r mod Mod == Rem (Mod 1, Rem 0 for all of them); ok is false when
// the shard holds none.
func (t *TablePlacement) Part(shard int) (mod, rem int64, ok bool) {
	i := slices.Index(t.Shards, shard)
	if i < 0 {
		return 0, 0, false
	}
	if t.Placement == TableWise {
		return 1, 0, true
	}
	return int64(len(t.Shards)), int64(i), true
}

// Placement returns the placement of the named table, nil if none.
func (s *Sharding) Placement(table string) *TablePlacement {
	for i := range s.Tables {
		if s.Tables[i].Table == table {
			return &s.Tables[i]
		}
	}
	return nil
}

// CombineOf is how the parts of a row-wise lookup with pooling combine.
func CombineOf(p Pooling) Combine {
	switch p {
	case PoolMean:
		return CombineSumCount
	case PoolMax:
		return CombineMaxCount
	}
	return CombineSum
}

// PartRows is how many of rows rows lie in the part r mod m == rem.
func PartRows(rows, m, rem int64) int64 {
	if m <= 1 {
		return rows
	}
	n := rows / m
	if rem < rows%m {
		n++
	}
	return n
}

// ValidateSharding checks p.Sharding, if any, against p: every table of
// the plan placed exactly once, on shards that exist, table-wise on one
// shard or row-wise on distinct shards; every shard listed once, its
// rows, bytes and outputs what the placements say. (Validate checks the
// rest of the plan; this needs it valid.)
func (p *Plan) ValidateSharding() error {
	s := p.Sharding
	if s == nil {
		return nil
	}
	switch {
	case s.Shards < 1:
		return fmt.Errorf("sharding: shards %d, want at least 1", s.Shards)
	case s.Shards > MaxShards:
		return fmt.Errorf("sharding: shards %d, want at most %d", s.Shards, MaxShards)
	case s.ShardBytes < 0:
		return fmt.Errorf("sharding: shard_bytes %d, want >= 0", s.ShardBytes)
	case len(s.Tables) != len(p.Tables):
		return fmt.Errorf("sharding: %d tables placed, the plan has %d", len(s.Tables), len(p.Tables))
	case len(s.Shard) != s.Shards:
		return fmt.Errorf("sharding: %d shards described, want %d", len(s.Shard), s.Shards)
	case math.IsNaN(s.Tolerance) || s.Tolerance < 0:
		return fmt.Errorf("sharding: tolerance %v, want >= 0", s.Tolerance)
	}
	tables := map[string]*Table{}
	for i := range p.Tables {
		tables[p.Tables[i].Name] = &p.Tables[i]
	}
	want := make([]ShardInfo, s.Shards)
	for i := range want {
		want[i].Shard = i
	}
	placed := map[string]bool{}
	for i, tp := range s.Tables {
		where := fmt.Sprintf("sharding: tables[%d] %q", i, tp.Table)
		t := tables[tp.Table]
		switch {
		case t == nil:
			return fmt.Errorf("%s: not a table of the plan", where)
		case placed[tp.Table]:
			return fmt.Errorf("%s: placed twice", where)
		}
		placed[tp.Table] = true
		switch tp.Placement {
		case TableWise:
			if len(tp.Shards) != 1 {
				return fmt.Errorf("%s: table-wise on %d shards, want 1", where, len(tp.Shards))
			}
		case RowWise:
			if len(tp.Shards) < 2 {
				return fmt.Errorf("%s: row-wise on %d shards, want at least 2", where, len(tp.Shards))
			}
			if int64(len(tp.Shards)) > t.Rows {
				return fmt.Errorf("%s: row-wise on %d shards, the table has %d rows", where, len(tp.Shards), t.Rows)
			}
		default:
			return fmt.Errorf("%s: placement %q, want table or row", where, tp.Placement)
		}
		seen := map[int]bool{}
		for j, sh := range tp.Shards {
			if sh < 0 || sh >= s.Shards {
				return fmt.Errorf("%s: shards[%d]=%d, want 0 to %d", where, j, sh, s.Shards-1)
			}
			if seen[sh] {
				return fmt.Errorf("%s: shard %d listed twice", where, sh)
			}
			seen[sh] = true
			mod, rem, _ := tp.Part(sh)
			n := PartRows(t.Rows, mod, rem)
			w := &want[sh]
			w.Rows += n
			w.Bytes += n * int64(t.Dim) * 4
			for _, l := range t.Lookups {
				if tp.Placement == TableWise {
					w.Full = append(w.Full, l.Output)
				} else {
					w.Partial = append(w.Partial, PartialOutput{Output: l.Output, Table: t.Name, Pooling: l.Pooling, Combine: CombineOf(l.Pooling), Weighted: l.Weights != ""})
				}
			}
		}
	}
	for i, sh := range s.Shard {
		w := want[i]
		where := fmt.Sprintf("sharding: shard[%d]", i)
		switch {
		case sh.Shard != i:
			return fmt.Errorf("%s: shard %d, want %d (in order)", where, sh.Shard, i)
		case sh.Rows != w.Rows || sh.Bytes != w.Bytes:
			return fmt.Errorf("%s: %d rows, %d bytes; its tables make %d rows, %d bytes", where, sh.Rows, sh.Bytes, w.Rows, w.Bytes)
		case s.ShardBytes > 0 && sh.Bytes > s.ShardBytes:
			return fmt.Errorf("%s: %d bytes, over the budget of %d", where, sh.Bytes, s.ShardBytes)
		case !slices.Equal(sortedCopy(sh.Full), sortedCopy(w.Full)):
			return fmt.Errorf("%s: full %v, its table-wise tables answer %v", where, sh.Full, w.Full)
		case len(sh.Partial) != len(w.Partial):
			return fmt.Errorf("%s: %d partial outputs, its row-wise tables answer %d", where, len(sh.Partial), len(w.Partial))
		case math.IsNaN(sh.Lookups) || sh.Lookups < 0:
			return fmt.Errorf("%s: lookups %v, want >= 0", where, sh.Lookups)
		}
		got := map[string]PartialOutput{}
		for _, po := range sh.Partial {
			got[po.Output] = po
		}
		for _, po := range w.Partial {
			if got[po.Output] != po {
				return fmt.Errorf("%s: partial output %q: %+v, want %+v", where, po.Output, got[po.Output], po)
			}
		}
	}
	return nil
}

// MaxShards bounds a sharding's shards.
const MaxShards = 1 << 12

func sortedCopy(s []string) []string {
	c := slices.Clone(s)
	slices.Sort(c)
	return c
}
