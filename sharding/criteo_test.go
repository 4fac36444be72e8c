package sharding

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/prism-serve/prism/models"
	"github.com/prism-serve/prism/partitioner"
	"github.com/prism-serve/prism/plan"
)

// criteoRows is a Criteo sample in the day files' CSV form (as the one
// in ../shared/data): rows 1 and 3 share every categorical value, row 2
// misses some.
const criteoRows = `label,I1,I2,I3,I4,I5,I6,I7,I8,I9,I10,I11,I12,I13,C1,C2,C3,C4,C5,C6,C7,C8,C9,C10,C11,C12,C13,C14,C15,C16,C17,C18,C19,C20,C21,C22,C23,C24,C25,C26
0,,3,260.0,,17668.0,,,33.0,,,,0.0,,05db9164,08d6d899,9143c832,f56b7dd5,25c83c98,7e0ccccf,df5c2d18,0b153874,a73ee510,8f48ce11,a7b606c4,ae1bb660,eae197fd,b28479f6,bfef54b3,bad5ee18,e5ba7672,87c6f83c,0429f84b,b0530c50,32c7478e,c3dc6cef,3a171ecb,c9f3bea7,001f3601,c9e4ae3f
1,1,-1,19.0,35.0,30251.0,247.0,1.0,35.0,160.0,,1.0,,35.0,68fd1e64,04e09220,95e13fd4,a1e6a194,25c83c98,fe6b92e5,f819e175,062b5529,a73ee510,ab9456b4,6153cf57,8882c6cd,769a1844,b28479f6,69f825dd,23056e4f,,,,,,,,,,
0,,3,260.0,,17668.0,,,33.0,,,,0.0,,05db9164,08d6d899,9143c832,f56b7dd5,25c83c98,7e0ccccf,df5c2d18,0b153874,a73ee510,8f48ce11,a7b606c4,ae1bb660,eae197fd,b28479f6,bfef54b3,bad5ee18,e5ba7672,87c6f83c,0429f84b,b0530c50,32c7478e,c3dc6cef,3a171ecb,c9f3bea7,001f3601,c9e4ae3f
`

// TestCriteoCounts: per table, the rows the plan's lookups read on a
// Criteo sample are counted where the load generator's Criteo source
// puts its ids (hashed into the table), once per row read: the row the
// two equal samples read counts twice.
func TestCriteoCounts(t *testing.T) {
	dir := t.TempDir()
	part := partitionedPreset(t, dir, "dlrm-tiny")
	p, err := plan.Read(part)
	if err != nil {
		t.Fatal(err)
	}
	got, err := CriteoFrom(p, strings.NewReader(criteoRows), "three")
	if err != nil {
		t.Fatal(err)
	}
	// What the load generator's Criteo source sends for the same rows.
	sig, err := models.PlanSignature(p)
	if err != nil {
		t.Fatal(err)
	}
	src, err := models.NewCriteo(strings.NewReader(criteoRows), "three", sig)
	if err != nil {
		t.Fatal(err)
	}
	b, err := src.Next(3)
	if err != nil || b.N != 3 {
		t.Fatalf("the sample: %d rows, %v", b.N, err)
	}
	col := map[string]int{}
	for i, in := range sig.Inputs {
		col[in.Name] = i
	}
	checked := 0
	for _, tb := range p.Tables {
		c := got[tb.Name]
		if c.Source != "criteo:three" {
			t.Fatalf("table %q: source %q", tb.Name, c.Source)
		}
		want := map[int64]float64{}
		for _, l := range tb.Lookups {
			if len(l.Pre) > 0 {
				continue // counted after the pre-lookup ops: not this check's
			}
			for _, id := range b.Columns[col[l.Input]].I64 {
				if id >= tb.Rows && tb.UnknownIDs == plan.UnknownHash {
					id %= tb.Rows
				}
				if id >= 0 && id < tb.Rows {
					want[id]++
				}
			}
			checked++
		}
		for id, n := range want {
			if c.Rows[id] != n {
				t.Fatalf("table %q row %d: counted %v, want %v (counts %v)", tb.Name, id, c.Rows[id], n, c.Rows)
			}
		}
		if len(c.Rows) != len(want) {
			t.Fatalf("table %q: %d rows counted, want %d", tb.Name, len(c.Rows), len(want))
		}
	}
	if checked == 0 {
		t.Fatal("no lookup of the plan was checked")
	}
	// The first table: rows 1 and 3 read one row, twice.
	twice := false
	for _, n := range got[p.Tables[0].Name].Rows {
		twice = twice || n == 2
	}
	if !twice {
		t.Fatalf("table %q: no row counted twice: %v", p.Tables[0].Name, got[p.Tables[0].Name].Rows)
	}
}

func mustPreset(t *testing.T, name string) models.Config {
	t.Helper()
	pr, err := models.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	return pr.Config
}

// partitionedPreset builds the zoo preset name (seed 5) in dir and
// partitions it; it returns the partition folder.
func partitionedPreset(t *testing.T, dir, name string) string {
	t.Helper()
	m, err := models.New(mustPreset(t, name), 5)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Write(filepath.Join(dir, "model"), models.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	part := filepath.Join(dir, "part")
	if _, err := partitioner.Partition(filepath.Join(dir, "model", models.ModelFile), part, partitioner.Options{}); err != nil {
		t.Fatal(err)
	}
	return part
}
