package sharding

import (
	"fmt"

	"github.com/prism-serve/prism/plan"
)

// Tables are the planner's view of p's tables: rows, dim, and the ids
// per sample of all their lookups; freq gives each table's row
// frequencies (nil, or a table missing from it: uniform).
func Tables(p *plan.Plan, freq func(table string) Freq) []Table {
	out := make([]Table, len(p.Tables))
	for i, t := range p.Tables {
		var looks float64
		for _, l := range t.Lookups {
			looks += float64(l.Bag)
		}
		out[i] = Table{Name: t.Name, Rows: t.Rows, Dim: t.Dim, Lookups: looks}
		if freq != nil {
			out[i].Freq = freq(t.Name)
		}
	}
	return out
}

// Section writes r as p's sharding section: each table's placement and
// each shard's rows, bytes, expected lookups, and the lookup outputs it
// answers in full (table-wise tables) or in part (row-wise: what the
// dense side combines, see plan.Combine). estimate names where the
// lookups came from. The result passes p.ValidateSharding.
func Section(p *plan.Plan, r *Result, estimate string) (*plan.Sharding, error) {
	if len(r.Placements) != len(p.Tables) {
		return nil, fmt.Errorf("sharding places %d tables, the plan has %d", len(r.Placements), len(p.Tables))
	}
	s := &plan.Sharding{Shards: r.Shards, ShardBytes: r.ShardBytes, Estimate: estimate,
		Tolerance: r.Tolerance, Imbalance: r.Imbalance, Shard: make([]plan.ShardInfo, r.Shards)}
	for i := range s.Shard {
		s.Shard[i] = plan.ShardInfo{Shard: i, Rows: r.Rows[i], Bytes: r.Bytes[i], Lookups: r.Lookups[i]}
	}
	for i, t := range p.Tables {
		pl := r.Placements[i]
		if pl.Table != t.Name {
			return nil, fmt.Errorf("sharding places table %q where the plan has %q", pl.Table, t.Name)
		}
		tp := plan.TablePlacement{Table: t.Name, Placement: plan.TableWise, Shards: append([]int(nil), pl.Shards...)}
		if len(pl.Shards) > 1 {
			tp.Placement = plan.RowWise
		}
		s.Tables = append(s.Tables, tp)
		for _, sh := range pl.Shards {
			si := &s.Shard[sh]
			for _, l := range t.Lookups {
				if tp.Placement == plan.TableWise {
					si.Full = append(si.Full, l.Output)
					continue
				}
				si.Partial = append(si.Partial, plan.PartialOutput{Output: l.Output, Table: t.Name,
					Pooling: l.Pooling, Combine: plan.CombineOf(l.Pooling), Weighted: l.Weights != ""})
			}
		}
	}
	q := *p
	q.Sharding = s
	if err := q.ValidateSharding(); err != nil {
		return nil, err
	}
	return s, nil
}
