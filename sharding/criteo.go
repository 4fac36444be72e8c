package sharding

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/prism-serve/prism/internal/prelookup"
	"github.com/prism-serve/prism/models"
	"github.com/prism-serve/prism/plan"
)

// CriteoSample is the Criteo sample in ../shared/data
// (internal/shareddata), the default of `prism shard --criteo`.
const CriteoSample = "criteo/criteo_sample.txt"

// Criteo counts the rows p's lookups read on the Criteo rows in file
// (hashed into each table as `prism score --criteo` and `prism loadgen`
// hash them, pre-lookup ops applied, ids outside a table folded by its
// unknown_ids rule or left out): per table, lookups per row.
func Criteo(p *plan.Plan, file string) (map[string]Counts, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, fmt.Errorf("criteo sample: %w", err)
	}
	defer f.Close()
	return CriteoFrom(p, bufio.NewReader(f), filepath.Base(file))
}

// CriteoFrom is Criteo on a reader; name is the sample's name in errors
// and in the estimate ("criteo:NAME").
func CriteoFrom(p *plan.Plan, r io.Reader, name string) (map[string]Counts, error) {
	sig, err := models.PlanSignature(p)
	if err != nil {
		return nil, fmt.Errorf("criteo sample %s: %w", name, err)
	}
	src, err := models.NewCriteo(r, name, sig)
	if err != nil {
		return nil, err
	}
	col := map[string]int{}
	for i, in := range sig.Inputs {
		col[in.Name] = i
	}
	infos := map[string]plan.TensorInfo{}
	for _, in := range p.Inputs {
		infos[in.Name] = in
	}
	type prog struct {
		t   *plan.Table
		in  int
		pre *prelookup.Program
	}
	var progs []prog
	out := map[string]Counts{}
	for i := range p.Tables {
		t := &p.Tables[i]
		out[t.Name] = Counts{Rows: map[int64]float64{}, Source: "criteo:" + name}
		for _, l := range t.Lookups {
			c, ok := col[l.Input]
			if !ok {
				return nil, fmt.Errorf("criteo sample %s: table %q: input %q is not in the plan's signature", name, t.Name, l.Input)
			}
			pg := prog{t: t, in: c}
			if len(l.Pre) > 0 {
				if pg.pre, err = prelookup.Compile(infos[l.Input], l.Pre); err != nil {
					return nil, fmt.Errorf("criteo sample %s: table %q: %w", name, t.Name, err)
				}
			}
			progs = append(progs, pg)
		}
	}
	for {
		b, err := src.Next(256)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		for _, pg := range progs {
			ids := b.Columns[pg.in].I64
			if pg.pre != nil {
				if ids, err = pg.pre.Run(b.N, b.Columns[pg.in].F32, b.Columns[pg.in].I64); err != nil {
					return nil, fmt.Errorf("criteo sample %s: table %q: %w", name, pg.t.Name, err)
				}
			}
			counts := out[pg.t.Name].Rows
			for _, id := range ids {
				if id >= pg.t.Rows && pg.t.UnknownIDs == plan.UnknownHash {
					id %= pg.t.Rows
				}
				if id >= 0 && id < pg.t.Rows {
					counts[id]++
				}
			}
		}
	}
	return out, nil
}
