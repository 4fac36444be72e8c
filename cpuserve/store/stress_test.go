package store

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prism-serve/prism/cpuserve/store/hot"
)

// stressDur is how long each stress phase runs: short in the suite, as
// long as wanted by hand (go test ./cpuserve/store -race -run Stress
// -args -stress.dur 5s; the review that wrote these ran 2 s a phase).
var stressDur time.Duration

func init() {
	flag.DurationVar(&stressDur, "stress.dur", 300*time.Millisecond, "how long each stress phase runs")
}

// constRow is a row of dim copies of v.
func constRow(dim int, v float32) []float32 {
	r := make([]float32, dim)
	for i := range r {
		r[i] = v
	}
	return r
}

// checkConst: every float of row equal (untorn); returns it.
func checkConst(row []float32) (float32, bool) {
	for _, x := range row[1:] {
		if x != row[0] {
			return 0, false
		}
	}
	return row[0], true
}

// stored is v as a table of dtype dt stores it (in a row of copies).
func stored(dt DType, v float32) float32 {
	out := make([]float32, 8)
	dt.decode(out, dt.encode(nil, constRow(8, v)))
	return out[0]
}

// TestStressReadYourWrites: writers upsert rows of constant values
// (increasing per id); readers snapshot the acked value of each id
// before their lookup starts and check the row read is untorn and not
// older. The hot tier is small (admission, eviction churn).
func TestStressReadYourWrites(t *testing.T) {
	for _, dt := range []DType{Float32, Float16, Int8} {
		for _, hb := range []int64{16 << 10, 256 << 10, 8 << 20} {
			t.Run(fmt.Sprintf("%s/hot=%d", dt, hb), func(t *testing.T) {
				stressRYW(t, dt, hb)
			})
		}
	}
}

func TestStressReadYourWritesDisk(t *testing.T) {
	for _, hb := range []int64{16 << 10, 8 << 20} {
		t.Run(fmt.Sprint(hb), func(t *testing.T) {
			s, err := Open(t.TempDir(), &Options{HotBytes: hb, Preload: PreloadOn, DropBehind: true, DirectReads: true, CacheBytes: 64 << 10, MemTableBytes: 1 << 20})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			stressRYWOn(t, s, Float32, 30000)
		})
	}
}

func stressRYW(t *testing.T, dt DType, hotBytes int64) {
	s, _ := openMem(t, &Options{HotBytes: hotBytes, Preload: PreloadAuto})
	if hotBytes == 256<<10 {
		s.SetMissReads(MissPoint, 1)
	} else {
		s.SetMissReads(MissSorted, 8)
	}
	stressRYWOn(t, s, dt, 3000)
}

func stressRYWOn(t *testing.T, s *Store, dt DType, rows int64) {
	ctx := context.Background()
	tabs := []*testTable{{name: "a", rows: rows, dim: 8}, {name: "b", rows: rows, dim: 16}}
	for _, tt := range tabs {
		tt.data = make([]float32, rows*int64(tt.dim))
	}
	s.opts.NoSync = true
	if _, err := s.Ingest(ctx, writePlan(t, "m", tabs), IngestOptions{DType: dt}); err != nil {
		t.Fatal(err)
	}
	const hotIDs = 64
	var acked [2][hotIDs]atomic.Int64
	var stop atomic.Bool
	var wg sync.WaitGroup
	approxGE := func(got float32, want int64) bool {
		return got >= stored(dt, float32(want))
	}
	for ti := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(ti), 1))
			tt := tabs[ti]
			seq := int64(0)
			for v := int64(1); !stop.Load(); v++ {
				id := r.Int64N(hotIDs)
				var err error
				if ti == 0 {
					seq++
					_, err = s.UpsertSeq("m", tt.name, []int64{id}, constRow(tt.dim, float32(v)), seq)
				} else {
					err = s.Upsert("m", tt.name, []int64{id}, constRow(tt.dim, float32(v)))
				}
				if err != nil {
					t.Error(err)
					return
				}
				acked[ti][id].Store(v)
			}
		}()
	}
	for rd := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(rd), 9))
			for !stop.Load() {
				var reqs []TableLookup
				var want [2][]int64
				for ti, tt := range tabs {
					n := 1 + r.IntN(40)
					ids := make([]int64, n)
					want[ti] = make([]int64, n)
					for i := range ids {
						if r.IntN(2) == 0 {
							ids[i] = r.Int64N(hotIDs)
						} else {
							ids[i] = r.Int64N(rows)
						}
						if ids[i] < hotIDs {
							want[ti][i] = acked[ti][ids[i]].Load()
						}
					}
					reqs = append(reqs, TableLookup{Table: tt.name, IDs: ids, Pooling: PoolNone, Out: make([]float32, n*tt.dim)})
				}
				if err := s.Lookup("m", reqs); err != nil {
					t.Error(err)
					return
				}
				for ti, tt := range tabs {
					for i, id := range reqs[ti].IDs {
						row := reqs[ti].Out[i*tt.dim : (i+1)*tt.dim]
						v, ok := checkConst(row)
						if !ok {
							t.Errorf("table %s row %d torn: %v", tt.name, id, row)
							stop.Store(true)
							return
						}
						if !approxGE(v, want[ti][i]) {
							t.Errorf("table %s row %d reads %v, update %d was acked before the lookup", tt.name, id, v, want[ti][i])
							stop.Store(true)
							return
						}
					}
				}
			}
		}()
	}
	time.Sleep(stressDur)
	stop.Store(true)
	wg.Wait()
	t.Logf("metrics: %+v", s.Metrics())
}

// TestStressWarmRestore: a restart restores a tier of keys including
// ids that are upserted while the restore runs; every lookup after an
// ack sees it, and after the restore every row is the last acked.
func TestStressWarmRestore(t *testing.T) {
	for _, dt := range []DType{Float32, Int8} {
		t.Run(string(dt), func(t *testing.T) { stressWarm(t, dt) })
	}
}

func stressWarm(t *testing.T, dt DType) {
	ctx := context.Background()
	const rows = 20000
	tabs := []*testTable{{name: "a", rows: rows, dim: 8}}
	tabs[0].data = make([]float32, rows*8)
	opts := &Options{HotBytes: 512 << 10, Preload: PreloadOff, WarmRestart: true}
	s, fs := openMem(t, opts)
	if _, err := s.Ingest(ctx, writePlan(t, "m", tabs), IngestOptions{DType: dt}); err != nil {
		t.Fatal(err)
	}
	// Fill the tier with ids 0..N.
	for from := int64(0); from < rows; from += 1000 {
		ids := make([]int64, 1000)
		for i := range ids {
			ids[i] = from + int64(i)
		}
		if err := s.Lookup("m", []TableLookup{{Table: "a", IDs: ids, Pooling: PoolNone, Out: make([]float32, 8000)}}); err != nil {
			t.Fatal(err)
		}
	}
	w := 8
	if s.view.Load().tier.Class(8) == nil {
		w = hot.Int8Width(8)
	}
	held := resident(s, w)
	if len(held) < 1000 {
		t.Fatalf("%d resident", len(held))
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	var hooked atomic.Int64
	warmChunkHook = func() { hooked.Add(1); time.Sleep(time.Millisecond) }
	defer func() { warmChunkHook = nil }()
	for round := range 5 {
		opts.FS = fs
		s2, err := Open("db", opts)
		if err != nil {
			t.Fatal(err)
		}
		s2.opts.NoSync = true
		acked := map[int64]int64{}
		var mu sync.Mutex
		_, done := s2.Warmed()
		var wg sync.WaitGroup
		var stop atomic.Bool
		wg.Add(1)
		go func() { // readers
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(round), 3))
			for !stop.Load() {
				ids := make([]int64, 32)
				want := make([]int64, 32)
				mu.Lock()
				for i := range ids {
					ids[i] = int64(held[r.IntN(len(held))] & (1<<40 - 1))
					want[i] = acked[ids[i]]
				}
				mu.Unlock()
				req := TableLookup{Table: "a", IDs: ids, Pooling: PoolNone, Out: make([]float32, 32*8)}
				if err := s2.Lookup("m", []TableLookup{req}); err != nil {
					t.Error(err)
					return
				}
				for i, id := range ids {
					v, ok := checkConst(req.Out[i*8 : (i+1)*8])
					if !ok || v < stored(dt, float32(want[i])) {
						t.Errorf("row %d reads %v, acked %d before", id, req.Out[i*8:(i+1)*8], want[i])
						stop.Store(true)
						return
					}
				}
			}
		}()
		r := rand.New(rand.NewPCG(uint64(round), 4))
		base := int64(round+1) * 1000000
		for v := base; ; v++ {
			select {
			case <-done:
			default:
				id := int64(held[r.IntN(len(held))] & (1<<40 - 1))
				if err := s2.Upsert("m", "a", []int64{id}, constRow(8, float32(v))); err != nil {
					t.Fatal(err)
				}
				mu.Lock()
				acked[id] = v
				mu.Unlock()
				continue
			}
			break
		}
		stop.Store(true)
		wg.Wait()
		rep, _ := s2.Warmed()
		t.Logf("round %d: %d updates during the restore, report %+v", round, len(acked), rep)
		for id, v := range acked {
			got := lookupRow(t, s2, "m", "a", id, 8)
			if got[0] != stored(dt, float32(v)) {
				t.Fatalf("after the restore row %d reads %v, acked %d", id, got, v)
			}
		}
		if err := s2.Close(); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("chunks hooked %d", hooked.Load())
}

// TestStressSwitchCopyClose: lookups of two models sharing tables race
// version switches of one (with carried updates), the copy-on-first-
// update, and finally Close.
func TestStressSwitchCopyClose(t *testing.T) {
	ctx := context.Background()
	mk := func(c float32) []*testTable {
		tabs := []*testTable{{name: "a", rows: 500, dim: 4}, {name: "b", rows: 500, dim: 4}}
		for _, tt := range tabs {
			tt.data = make([]float32, 500*4)
			for i := range tt.data {
				tt.data[i] = c
			}
		}
		return tabs
	}
	for _, hb := range []int64{4 << 10, 1 << 20} {
		t.Run(fmt.Sprint(hb), func(t *testing.T) {
			s, _ := openMem(t, &Options{HotBytes: hb, Preload: PreloadAuto, WarmRestart: true, WarmSnapshotEvery: 5 * time.Millisecond})
			s.opts.NoSync = true
			p1, p2 := writePlan(t, "m", mk(1)), writePlan(t, "m", mk(2))
			for _, p := range []string{p1, p2} {
				if _, err := s.Ingest(ctx, p, IngestOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			// model o shares m's version 1 tables (same content).
			if _, err := s.Ingest(ctx, p1, IngestOptions{Model: "o"}); err != nil {
				t.Fatal(err)
			}
			for _, mn := range []string{"m", "o"} {
				ti, _ := s.Tables(mn)
				t.Logf("%s: %+v", mn, ti)
			}
			var stop atomic.Bool
			var wg sync.WaitGroup
			var lastAck atomic.Int64 // value of m's row 7 acked (both tables)
			closedOK := func(err error) bool { return err == nil || errors.Is(err, ErrClosed) }
			for rd := range 3 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					r := rand.New(rand.NewPCG(uint64(rd), 5))
					for !stop.Load() {
						model := "m"
						if rd == 2 {
							model = "o"
						}
						ids := []int64{r.Int64N(500), 7, r.Int64N(500)}
						want := lastAck.Load()
						a := TableLookup{Table: "a", IDs: ids, Pooling: PoolNone, Out: make([]float32, 12)}
						b := TableLookup{Table: "b", IDs: ids, Pooling: PoolNone, Out: make([]float32, 12)}
						err := s.Lookup(model, []TableLookup{a, b})
						if errors.Is(err, ErrClosed) {
							return
						}
						if err != nil {
							t.Error(err)
							return
						}
						for i, id := range ids {
							av, ok1 := checkConst(a.Out[i*4 : i*4+4])
							bv, ok2 := checkConst(b.Out[i*4 : i*4+4])
							if !ok1 || !ok2 {
								t.Errorf("torn: %v %v", a.Out, b.Out)
							}
							if model == "o" {
								if av != 1 || bv != 1 {
									t.Errorf("model o row %d reads a=%v b=%v: another model's update", id, av, bv)
									stop.Store(true)
								}
								continue
							}
							if id == 7 {
								if want > 0 && (int64(av) < want || int64(bv) < want) {
									t.Errorf("model m row 7: a=%v b=%v, acked %d", av, bv, want)
									stop.Store(true)
								}
								continue
							}
							if av != bv || (av != 1 && av != 2) {
								t.Errorf("model m row %d: a=%v b=%v: mixed versions", id, av, bv)
								stop.Store(true)
							}
						}
					}
				}()
			}
			wg.Add(1)
			go func() { // switches
				defer wg.Done()
				for i := 0; !stop.Load(); i++ {
					var err error
					if i%2 == 0 {
						err = s.Activate("m", 1)
					} else {
						err = s.Rollback("m")
					}
					if !closedOK(err) {
						t.Error(err)
						return
					}
				}
			}()
			wg.Add(1)
			go func() { // metrics and other readers
				defer wg.Done()
				for !stop.Load() {
					s.Metrics()
					s.Warmed()
					s.Preloaded()
					if _, err := s.AppliedSeq("m"); !closedOK(err) {
						t.Error(err)
						return
					}
				}
			}()
			seq := int64(0)
			deadline := time.Now().Add(stressDur)
			for v := int64(100); time.Now().Before(deadline) && !stop.Load(); v++ {
				seq++
				if _, err := s.UpsertSeq("m", "a", []int64{7}, constRow(4, float32(v)), seq); err != nil {
					t.Fatal(err)
				}
				seq++
				if _, err := s.UpsertSeq("m", "b", []int64{7}, constRow(4, float32(v)), seq); err != nil {
					t.Fatal(err)
				}
				lastAck.Store(v)
			}
			m := s.Metrics()
			t.Logf("copies %d carried %d upserts %d hits %d misses %d", m.TableCopies, m.CarriedRows, m.Upserts, m.HotHits, m.HotMisses)
			done := make(chan error)
			go func() { done <- s.Close() }()
			// Upserts and lookups racing Close: errors, never a panic.
			for i := 0; ; i++ {
				seq++
				_, err := s.UpsertSeq("m", "a", []int64{7}, constRow(4, 1e6), seq)
				if err != nil {
					if !errors.Is(err, ErrClosed) {
						t.Fatal(err)
					}
					break
				}
			}
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			stop.Store(true)
			wg.Wait()
			if err := s.Lookup("m", []TableLookup{{Table: "a", IDs: []int64{1}, Out: make([]float32, 4)}}); !errors.Is(err, ErrClosed) {
				t.Fatalf("lookup after close: %v", err)
			}
			if _, _, err := s.IndexBytes(); !errors.Is(err, ErrClosed) {
				t.Fatalf("IndexBytes after close: %v", err)
			}
		})
	}
}
