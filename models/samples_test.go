package models_test

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/prism-serve/prism/internal/shareddata/sharedtest"
	"github.com/prism-serve/prism/models"
)

// sharedData finds ../shared/data beside the repository, or skips.
func sharedData(t *testing.T, rel string) string {
	t.Helper()
	return sharedtest.Path(t, rel)
}

func tinySig(t *testing.T, name string) models.Signature {
	t.Helper()
	p, err := models.Lookup(name)
	if err != nil {
		t.Fatal(err)
	}
	return p.Config.Signature()
}

// TestZipfFrequencies: rank frequencies follow k^-s for s below, at and
// above 1 (a chi-square-like bound on the head ranks, fixed seed).
func TestZipfFrequencies(t *testing.T) {
	for _, s := range []float64{0.8, 1.0, 1.2} {
		const n, draws = 1000, 400000
		z, err := models.NewZipf(rand.New(rand.NewPCG(1, 2)), s, n)
		if err != nil {
			t.Fatal(err)
		}
		counts := make([]int, n+1)
		for range draws {
			k := z.Rank()
			if k < 1 || k > n {
				t.Fatalf("rank %d out of [1,%d]", k, n)
			}
			counts[k]++
		}
		var h float64
		for k := 1; k <= n; k++ {
			h += math.Pow(float64(k), -s)
		}
		for _, k := range []int{1, 2, 3, 10, 100} {
			want := draws * math.Pow(float64(k), -s) / h
			sd := math.Sqrt(want)
			if math.Abs(float64(counts[k])-want) > 5*sd {
				t.Errorf("s=%v rank %d: %d draws, want %.0f ± %.0f", s, k, counts[k], want, 5*sd)
			}
		}
	}
}

func TestZipfBadArgs(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 1))
	for _, c := range []struct {
		s float64
		n int64
	}{{0, 10}, {-1, 10}, {math.NaN(), 10}, {1, 0}} {
		if _, err := models.NewZipf(r, c.s, c.n); err == nil {
			t.Errorf("NewZipf(%v, %d): no error", c.s, c.n)
		}
	}
}

func TestSyntheticDeterministicAndInRange(t *testing.T) {
	sig := tinySig(t, "dcnv2-tiny")
	a, _ := models.NewSynthetic(sig, models.SyntheticOptions{Seed: 9})
	b, _ := models.NewSynthetic(sig, models.SyntheticOptions{Seed: 9})
	x, _ := a.Next(100)
	y, _ := b.Next(100)
	if err := x.Check(); err != nil {
		t.Fatal(err)
	}
	for i := range x.Columns {
		if len(x.Columns[i].I64) > 0 && x.Columns[i].I64[7] != y.Columns[i].I64[7] {
			t.Fatal("same seed gave different ids")
		}
	}
	// Skew: the hottest id of a table takes a clearly larger share than uniform.
	c, _ := models.NewSynthetic(sig, models.SyntheticOptions{Seed: 3, ZipfS: 1.1})
	big, _ := c.Next(20000)
	freq := map[int64]int{}
	for _, id := range big.Columns[len(sig.Inputs)-1].I64 {
		freq[id]++
	}
	top := 0
	for _, n := range freq {
		top = max(top, n)
	}
	rows := sig.Inputs[len(sig.Inputs)-1].Rows
	if float64(top) < 20*float64(20000)/float64(rows) {
		t.Errorf("hottest id drawn %d times of 20000 over %d rows: no skew", top, rows)
	}
}

func TestCriteoSample(t *testing.T) {
	path := sharedData(t, "criteo/criteo_sample.txt")
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sig := tinySig(t, "dcnv2-tiny")
	src, err := models.NewCriteo(f, path, sig)
	if err != nil {
		t.Fatal(err)
	}
	total := 0
	for {
		b, err := src.Next(64)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Check(); err != nil {
			t.Fatal(err)
		}
		total += b.N
	}
	if total != 200 {
		t.Fatalf("read %d rows, want 200", total)
	}
}

func TestCriteoFormats(t *testing.T) {
	sig := tinySig(t, "dlrm-tiny")
	row := func(sep string, dense []string, cats []string) string {
		return strings.Join(append(append([]string{"1"}, dense...), cats...), sep)
	}
	dense := []string{"3", "", "-1", "0", "1", "2", "3", "4", "5", "6", "7", "8", "9"}
	cats := make([]string, 26)
	for i := range cats {
		cats[i] = "68fd1e64"
	}
	cats[3] = ""
	tsv := row("\t", dense, cats) + "\n"
	b, err := mustCriteo(t, tsv, sig).Next(10)
	if err != nil {
		t.Fatal(err)
	}
	if b.N != 1 {
		t.Fatalf("N = %d", b.N)
	}
	if got := b.Columns[0].F32[0]; math.Abs(float64(got)-math.Log(4)) > 1e-6 {
		t.Errorf("I1 = %v, want log(1+3)", got)
	}
	if b.Columns[0].F32[1] != 0 || b.Columns[0].F32[2] != 0 {
		t.Errorf("empty and negative dense values must be 0, got %v %v", b.Columns[0].F32[1], b.Columns[0].F32[2])
	}
	if want := int64(0x68fd1e64 % sig.Inputs[1].Rows); b.Columns[1].I64[0] != want {
		t.Errorf("C1 id = %d, want %d", b.Columns[1].I64[0], want)
	}
	if b.Columns[4].I64[0] != 0 {
		t.Errorf("empty category must be id 0, got %d", b.Columns[4].I64[0])
	}
	// A header with reordered columns reads the same values.
	var hdr []string
	hdr = append(hdr, "label")
	for i := 1; i <= 13; i++ {
		hdr = append(hdr, "I"+itoa(i))
	}
	for i := 1; i <= 26; i++ {
		hdr = append(hdr, "C"+itoa(i))
	}
	csv := strings.Join(hdr, ",") + "\n" + row(",", dense, cats) + "\n"
	b2, err := mustCriteo(t, csv, sig).Next(10)
	if err != nil || b2.Columns[1].I64[0] != b.Columns[1].I64[0] || b2.Columns[0].F32[0] != b.Columns[0].F32[0] {
		t.Fatalf("CSV with header differs from TSV: %v", err)
	}
}

// TestCriteoHeaderAnyOrder: a header is recognised wherever its label
// column stands (an Id column first, as Kaggle's CSV copies have, or the
// label last), and every column is read by its name.
func TestCriteoHeaderAnyOrder(t *testing.T) {
	sig := tinySig(t, "dlrm-tiny")
	names := []string{"label"}
	vals := []string{"1"}
	for i := 1; i <= 13; i++ {
		names = append(names, "I"+itoa(i))
		vals = append(vals, itoa(i))
	}
	for i := 1; i <= 26; i++ {
		names = append(names, "C"+itoa(i))
		vals = append(vals, fmt.Sprintf("%08x", 0x68fd1e64+i))
	}
	plain, err := mustCriteo(t, strings.Join(vals, "\t")+"\n", sig).Next(1)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, text string }{
		{"id first", "Id," + strings.Join(names, ",") + "\n7," + strings.Join(vals, ",") + "\n"},
		{"label last", strings.Join(append(names[1:], "Label"), "\t") + "\n" + strings.Join(append(vals[1:], vals[0]), "\t") + "\n"},
		// Spreadsheet tools save CSV with a UTF-8 byte order mark: the
		// header was taken for a data row ("label" is not a number).
		{"byte order mark", "\ufeff" + strings.Join(names, ",") + "\n" + strings.Join(vals, ",") + "\n"},
		{"byte order mark, no header", "\ufeff" + strings.Join(vals, "\t") + "\n"},
		// A separator at the end of the line adds an empty column.
		{"trailing tab", strings.Join(vals, "\t") + "\t\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := mustCriteo(t, tc.text, sig)
			b, err := c.Next(10)
			if err != nil {
				t.Fatal(err)
			}
			if b.N != 1 || c.Labels()[0] != 1 || !reflect.DeepEqual(b.Columns, plain.Columns) {
				t.Fatalf("read %d rows, labels %v, columns differ from the headerless row: %v", b.N, c.Labels(), !reflect.DeepEqual(b.Columns, plain.Columns))
			}
		})
	}
}

func itoa(i int) string { return strconv.Itoa(i) }

func mustCriteo(t *testing.T, text string, sig models.Signature) *models.Criteo {
	t.Helper()
	c, err := models.NewCriteo(strings.NewReader(text), "in.txt", sig)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestCriteoErrors(t *testing.T) {
	sig := tinySig(t, "dlrm-tiny")
	good := "0" + strings.Repeat("\t1", 13) + strings.Repeat("\tab", 26)
	cases := []struct {
		name, text, want string
	}{
		{"short row", good + "\n0\t1\t2\n", "in.txt:2: 3 columns"},
		{"bad label", good + "\nx" + good[1:] + "\n", "in.txt:2: label \"x\""},
		{"bad dense", "0\tzz" + strings.Repeat("\t1", 12) + strings.Repeat("\tab", 26) + "\n", "in.txt:1: I1 value \"zz\""},
		// ParseFloat takes "inf" without an error; log(1+inf) scores NaN.
		{"infinite dense", "0\t1\tinf" + strings.Repeat("\t1", 11) + strings.Repeat("\tab", 26) + "\n", "in.txt:1: I2 value \"inf\""},
		{"header missing column", "label,I1\n0,1\n", "in.txt:1: header has no column I2"},
		// Without a header, a 41st column (an id first, as Kaggle's
		// copies have) shifted every value onto the next feature.
		{"extra column without header", "7\t" + good + "\n", "in.txt:1: 41 columns, want 40"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := models.NewCriteo(strings.NewReader(tc.text), "in.txt", sig)
			if err == nil {
				_, err = c.Next(10)
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to contain %q", err, tc.want)
			}
		})
	}
	if _, err := models.NewCriteo(strings.NewReader(""), "in.txt", sig); err == nil || !strings.Contains(err.Error(), "empty") {
		t.Errorf("empty file: %v", err)
	}
	wrong := models.Signature{Inputs: sig.Inputs[:5]}
	if _, err := models.NewCriteo(strings.NewReader(good), "in.txt", wrong); err == nil {
		t.Error("a model with 4 sparse inputs accepted Criteo rows")
	}
}

// TestSyntheticStreams: two streams of one seed draw different samples
// over the same popular ids (the hottest ids of a table agree), and
// another seed makes other ids popular.
func TestSyntheticStreams(t *testing.T) {
	sig := tinySig(t, "dcnv2-tiny")
	last := len(sig.Inputs) - 1
	ids := func(seed, stream uint64) []int64 {
		s, err := models.NewSynthetic(sig, models.SyntheticOptions{Seed: seed, Stream: stream})
		if err != nil {
			t.Fatal(err)
		}
		b, err := s.Next(20000)
		if err != nil {
			t.Fatal(err)
		}
		return b.Columns[last].I64
	}
	// top is the table's k most drawn ids.
	top := func(v []int64, k int) map[int64]bool {
		freq := map[int64]int{}
		for _, id := range v {
			freq[id]++
		}
		keys := make([]int64, 0, len(freq))
		for id := range freq {
			keys = append(keys, id)
		}
		slices.SortFunc(keys, func(a, b int64) int { return cmp.Or(freq[b]-freq[a], cmp.Compare(a, b)) })
		out := map[int64]bool{}
		for _, id := range keys[:min(k, len(keys))] {
			out[id] = true
		}
		return out
	}
	overlap := func(a, b map[int64]bool) int {
		n := 0
		for id := range a {
			if b[id] {
				n++
			}
		}
		return n
	}
	a, b, c := ids(9, 1), ids(9, 2), ids(10, 1)
	same := 0
	for i := range a {
		if a[i] == b[i] {
			same++
		}
	}
	if same > len(a)/5 {
		t.Errorf("streams 1 and 2 drew the same id at %d of %d positions", same, len(a))
	}
	if got := overlap(top(a, 5), top(b, 5)); got < 4 {
		t.Errorf("streams 1 and 2 share %d of their 5 hottest ids, want the same popular ids", got)
	}
	if got := overlap(top(a, 5), top(c, 5)); got > 1 {
		t.Errorf("seeds 9 and 10 share %d of their 5 hottest ids, want other popular ids", got)
	}
	// Stream 0 is the seed's one sequence, as before streams.
	if z, old := ids(9, 0), ids(9, 0); !slices.Equal(z, old) {
		t.Error("stream 0 is not deterministic")
	}
}
