package hot

import (
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestStressClass: readers Gather under RLock while writers Admit,
// Put, Load and Delete under Lock. Every value of a row written is the
// same number, id*16 + a version (int8: the id): a row read is never
// torn and always its own id's.
func TestStressClass(t *testing.T) {
	for _, mk := range []struct {
		name string
		new  func() *Class
	}{
		{"hashed", func() *Class { return NewClass(8, 8<<10) }},
		{"direct", func() *Class { return NewDirectClass(8, 32<<10, 2000) }},
		{"half", func() *Class { return NewClass(HalfWidth(8), 8<<10) }},
		{"int8", func() *Class { return NewDirectClass(Int8Width(8), 32<<10, 2000) }},
	} {
		t.Run(mk.name, func(t *testing.T) {
			c := mk.new()
			const rows = 1000
			for tb := uint32(1); tb <= 2; tb++ {
				c.Lock()
				c.Attach(tb, rows)
				c.Unlock()
			}
			maxID := int64(rows)
			if mk.name == "half" {
				maxID = 120
			}
			val := func(id int64, v int) float32 { return float32(id*16 + int64(v%16)) }
			if mk.name == "int8" {
				val = func(id int64, v int) float32 { return float32(id) }
			}
			var stop atomic.Bool
			var wg sync.WaitGroup
			for w := range 2 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					r := rand.New(rand.NewPCG(uint64(w), 1))
					row := make([]float32, 8)
					for v := 0; !stop.Load(); v++ {
						tb := uint32(1 + r.IntN(2))
						id := r.Int64N(maxID)
						k := Key(tb, id)
						h := Hash(k)
						for i := range row {
							row[i] = val(id, v)
						}
						c.Lock()
						switch r.IntN(6) {
						case 0:
							c.Put(k, h, row)
						case 1:
							c.Load(k, h, row)
						case 2:
							c.Delete(k, h)
						default:
							c.Count([]uint64{h, h})
							c.Admit(k, h, row)
						}
						c.Unlock()
					}
				}()
			}
			for g := range 3 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					r := rand.New(rand.NewPCG(uint64(g), 2))
					ids := make([]int64, 64)
					out := make([]float32, 64*8)
					slots := make([]int32, 64)
					for !stop.Load() {
						tb := uint32(1 + r.IntN(2))
						for i := range ids {
							ids[i] = r.Int64N(maxID)
						}
						for i := range out {
							out[i] = -1
						}
						c.RLock()
						miss := c.Gather(tb, ids, out, slots, nil)
						c.RUnlock()
						isMiss := map[int32]bool{}
						for _, m := range miss {
							isMiss[m] = true
						}
						for i, id := range ids {
							if isMiss[int32(i)] {
								continue
							}
							rw := out[i*8 : (i+1)*8]
							for _, x := range rw {
								if x != rw[0] {
									t.Errorf("torn row %d: %v", id, rw)
									stop.Store(true)
									return
								}
							}
							if got := int64(rw[0]) / 16; mk.name != "int8" && got != id {
								t.Errorf("row %d holds row %d's values %v", id, got, rw)
								stop.Store(true)
								return
							}
							if mk.name == "int8" && (rw[0] < float32(id)*0.99-0.01 || rw[0] > float32(id)*1.01+0.01) {
								t.Errorf("row %d holds %v", id, rw)
								stop.Store(true)
								return
							}
						}
					}
				}()
			}
			time.Sleep(300 * time.Millisecond)
			stop.Store(true)
			wg.Wait()
			st := c.Stats()
			t.Logf("%+v", st)
		})
	}
}
