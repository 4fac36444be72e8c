package store

import (
	"slices"
	"testing"

	"github.com/prism-serve/prism/cpuserve/store/hot"
	"github.com/prism-serve/prism/models"
)

// terabyteCapped is dlrm-terabyte's table sizes capped at 1,911,047 rows,
// the model of scripts/bench-ltm-e2e.sh (12.6M rows, 4x its cgroup).
var terabyteCapped = func() []int64 {
	rows := []int64{227605432, 39060, 17295, 7424, 20265, 3, 7122, 1543, 63, 130229467, 3067956, 405282, 10, 2209, 11938, 155, 4, 976, 14, 292775614, 40790948, 187188510, 590152, 12973, 108, 36}
	for i := range rows {
		rows[i] = min(rows[i], 1911047)
	}
	return rows
}()

// simAdmission drives a hot class the way Lookup does (Gather, counting
// by recordStride, or 1 in lookupRecordEvery ids in every batch when
// sampled is set, as before recordStride; the distinct misses admitted in
// key order) with requests of 270 synthetic samples over tables (fresh
// ones, stream 7), and returns the hit ratio of each window of win
// requests.
func simAdmission(cls *hot.Class, tables []int64, requests, win int, sampled bool) []float64 {
	sig := models.Signature{}
	for i, n := range tables {
		sig.Inputs = append(sig.Inputs, models.InputSpec{Name: string(rune('a' + i)), Kind: models.SparseKind, Width: 1, Rows: n})
	}
	src, err := models.NewSynthetic(sig, models.SyntheticOptions{Seed: 1, Stream: 7})
	if err != nil {
		panic(err)
	}
	dim := cls.Dim()
	const n = 270
	out := make([]float32, n*dim)
	slots := make([]int32, n)
	row := make([]float32, dim)
	var miss []int32
	var missIDs []int64
	var hashes []uint64
	phase := 0
	var ratios []float64
	var hits, total int64
	for r := 0; r < requests; r++ {
		b, _ := src.Next(n)
		for t := range tables {
			ids := b.Columns[t].I64
			table := uint32(t + 1)
			cls.RLock()
			miss = cls.Gather(table, ids, out, slots, miss[:0])
			cls.RUnlock()
			hits += int64(n - len(miss))
			total += n
			from, every := recordStride(&phase, len(miss) > 0)
			if sampled {
				from, every = phase, lookupRecordEvery
			}
			hashes = hashes[:0]
			for i := from; i < n; i += every {
				hashes = append(hashes, hot.Hash(hot.Key(table, ids[i])))
			}
			missIDs = missIDs[:0]
			for _, p := range miss {
				missIDs = append(missIDs, ids[p])
			}
			slices.Sort(missIDs)
			cls.Lock()
			cls.Count(hashes)
			for k, id := range missIDs {
				if k > 0 && id == missIDs[k-1] {
					continue
				}
				key := hot.Key(table, id)
				cls.Admit(key, hot.Hash(key), row)
			}
			cls.Unlock()
		}
		if (r+1)%win == 0 {
			ratios = append(ratios, float64(hits)/float64(total))
			hits, total = 0, 0
		}
	}
	return ratios
}

// BenchmarkAdmissionZipf: the hot tier's hit ratio on bench-ltm-e2e's
// model and skew (a 320 MiB tier of dim-64 rows, Zipf 1.05, fresh
// requests of 270 samples), window by window of 750 requests (30 s at
// bench-ltm-e2e's 25 req/s), counting as Lookup does and, for
// comparison, sampling 1 in 16 ids of every batch (the rule before).
// Compare with scripts/hit-bound.py's bound for the tier's rows.
//
//	go test ./cpuserve/store -run '^$' -bench AdmissionZipf -benchtime 1x
func BenchmarkAdmissionZipf(b *testing.B) {
	for _, v := range []struct {
		name    string
		sampled bool
	}{{"lookup", false}, {"sampled-1-in-16", true}} {
		b.Run(v.name, func(b *testing.B) {
			for range b.N {
				cls := hot.NewClass(64, 320<<20)
				w := simAdmission(cls, terabyteCapped, 15000, 750, v.sampled)
				b.Logf("%s: %d rows, hit ratio by window of 750 requests: %.4f", v.name, cls.Stats().Slots, w)
				b.ReportMetric(w[2], "hit@1500-2250")
				b.ReportMetric(w[len(w)-1], "hit@last")
			}
		})
	}
}

// TestAdmissionLearnsTheTail: on a small model of the same skew, a tier
// of 40,000 of its 700,550 rows counting as Lookup does ends with a hit
// ratio at least a point above what sampling every batch (the rule
// before) reaches (0.879 against 0.859 when written).
func TestAdmissionLearnsTheTail(t *testing.T) {
	tables := []int64{400000, 200000, 100000, 500, 50}
	run := func(sampled bool) float64 {
		cls := hot.NewClass(4, 40000*(4*4+48))
		w := simAdmission(cls, tables, 4000, 500, sampled)
		return w[len(w)-1]
	}
	lookup, sampled := run(false), run(true)
	t.Logf("hit ratio after 4000 requests: %.4f counting as Lookup does, %.4f sampling every batch", lookup, sampled)
	if lookup < sampled+0.01 {
		t.Errorf("counting batches with misses in full: hit ratio %.4f, not above sampling's %.4f", lookup, sampled)
	}
}
