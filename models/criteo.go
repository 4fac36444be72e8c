package models

import (
	"bufio"
	"fmt"
	"hash/fnv"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
)

// CriteoDense and CriteoSparse are the Criteo display-advertising columns.
const (
	CriteoDense  = 13
	CriteoSparse = 26
)

// Criteo reads rows of the Criteo data sets: label, I1..I13, C1..C26,
// either tab-separated without a header, exactly those 40 columns (the
// original day_N and train.txt files), or comma/tab-separated with a
// header line naming the columns (in any order; columns it does not
// name are skipped). As Meta's DLRM preprocessing does, a dense value x becomes
// log(1+max(x,0)) and an empty one 0; a categorical hex string is hashed to
// an id modulo its table's rows. For a multi-hot input the bag holds the
// id and Width-1 further ids derived from it deterministically.
type Criteo struct {
	sig *Signature
	// dense are the 13 dense values, cats the 26 categorical ones, in
	// the order of the file's columns.
	dense []slot
	cats  []slot
	// keys of the sparse inputs with Keys (by input; nil for the others)
	keys   []*keySet
	sc     *bufio.Scanner
	name   string
	line   int
	sep    byte
	order  []int // column index in the file of label, I1..I13, C1..C26
	labels []float32
	// pending holds the first line when it was data, not a header.
	pending string
	// header says the first line named the columns; without one a row
	// has exactly the 40 columns, in Criteo's order.
	header bool
}

var _ Source = (*Criteo)(nil)

// slot is where one Criteo column goes: value pos of input in (pos -1:
// every value of a sparse input, its bag).
type slot struct{ in, pos int }

// NewCriteo reads Criteo rows from r for a model with sig: 13 dense
// values and 26 categorical features, in that order, however the model
// packs them: one dense input of width 13 and 26 sparse inputs (the
// zoo's layout), a packed [batch, 26] id input (one value per feature,
// each hashed into its own range, sig's Ranges), or one float input
// carrying dense values and ids together. name is used in error
// messages.
func NewCriteo(r io.Reader, name string, sig Signature) (*Criteo, error) {
	c := &Criteo{sig: &sig, name: name}
	for i, in := range sig.Inputs {
		switch {
		case in.Offsets != "" || in.Kind == OffsetsKind:
			return nil, fmt.Errorf("criteo %s: input %q is jagged (an EmbeddingBag's ids, weights or offsets): Criteo rows have one id per feature, not bags of any length", name, in.Name)
		case in.Ranges != nil:
			for j, rg := range in.Ranges {
				if rg.IsID() {
					c.cats = append(c.cats, slot{i, j})
				} else if in.Kind == DenseKind {
					c.dense = append(c.dense, slot{i, j})
				}
			}
		case in.Kind == DenseKind:
			for j := range in.Width {
				c.dense = append(c.dense, slot{i, j})
			}
		default:
			c.cats = append(c.cats, slot{i, -1})
			if in.Keys != nil {
				if c.keys == nil {
					c.keys = make([]*keySet, len(sig.Inputs))
				}
				k, err := newKeySet(in.Name, in.Keys)
				if err != nil {
					return nil, fmt.Errorf("criteo %s: %w", name, err)
				}
				c.keys[i] = k
			}
		}
	}
	if len(c.dense) != CriteoDense {
		return nil, fmt.Errorf("criteo %s: the model has %d dense values, Criteo rows have %d", name, len(c.dense), CriteoDense)
	}
	if len(c.cats) != CriteoSparse {
		return nil, fmt.Errorf("criteo %s: the model has %d sparse inputs, Criteo rows have %d", name, len(c.cats), CriteoSparse)
	}
	c.sc = bufio.NewScanner(r)
	c.sc.Buffer(make([]byte, 64<<10), 1<<20)
	c.order = make([]int, 1+CriteoDense+CriteoSparse)
	for i := range c.order {
		c.order[i] = i
	}
	// Peek at the first line for a header.
	if !c.sc.Scan() {
		if err := c.sc.Err(); err != nil {
			return nil, fmt.Errorf("criteo %s: %w", name, err)
		}
		return nil, fmt.Errorf("criteo %s: empty file", name)
	}
	c.line = 1
	// A UTF-8 byte order mark (CSV files saved by spreadsheet tools
	// start with one) is not part of the first column's name or value.
	first := strings.TrimPrefix(c.sc.Text(), "\ufeff")
	c.sep = '\t'
	if !strings.Contains(first, "\t") && strings.Contains(first, ",") {
		c.sep = ','
	}
	fields := strings.Split(first, string(c.sep))
	// A header names a column "label" wherever it stands (readHeader maps
	// every column by name); no data value can be "label" (not a
	// number, not hex).
	if slices.ContainsFunc(fields, func(f string) bool { return strings.EqualFold(strings.TrimSpace(f), "label") }) {
		if err := c.readHeader(fields); err != nil {
			return nil, err
		}
		c.header = true
		first = ""
	}
	c.pending = first
	return c, nil
}

func (c *Criteo) readHeader(fields []string) error {
	pos := map[string]int{}
	for i, f := range fields {
		pos[strings.ToUpper(strings.TrimSpace(f))] = i
	}
	want := []string{"LABEL"}
	for i := 1; i <= CriteoDense; i++ {
		want = append(want, fmt.Sprintf("I%d", i))
	}
	for i := 1; i <= CriteoSparse; i++ {
		want = append(want, fmt.Sprintf("C%d", i))
	}
	for i, w := range want {
		p, ok := pos[w]
		if !ok {
			return fmt.Errorf("criteo %s:1: header has no column %s", c.name, w)
		}
		c.order[i] = p
	}
	return nil
}

// Labels returns the labels of the rows the last Next returned.
func (c *Criteo) Labels() []float32 { return c.labels }

// Next reads up to n rows; io.EOF after the last one.
func (c *Criteo) Next(n int) (*Batch, error) {
	b := &Batch{Sig: c.sig, Columns: make([]Column, len(c.sig.Inputs))}
	c.labels = c.labels[:0]
	for b.N < n {
		text, ok, err := c.nextLine()
		if err != nil {
			return nil, err
		}
		if !ok {
			break
		}
		if strings.TrimSpace(text) == "" {
			continue
		}
		if err := c.parse(b, text); err != nil {
			return nil, err
		}
		b.N++
	}
	if b.N == 0 {
		return nil, io.EOF
	}
	return b, nil
}

func (c *Criteo) nextLine() (string, bool, error) {
	if c.pending != "" {
		s := c.pending
		c.pending = ""
		return s, true, nil
	}
	if !c.sc.Scan() {
		if err := c.sc.Err(); err != nil {
			return "", false, fmt.Errorf("criteo %s:%d: %w", c.name, c.line+1, err)
		}
		return "", false, nil
	}
	c.line++
	return c.sc.Text(), true, nil
}

func (c *Criteo) parse(b *Batch, text string) error {
	fields := strings.Split(text, string(c.sep))
	need := 0
	for _, p := range c.order {
		need = max(need, p+1)
	}
	if len(fields) < need {
		return fmt.Errorf("criteo %s:%d: %d columns, want %d (label, I1-I13, C1-C26)", c.name, c.line, len(fields), need)
	}
	// Without a header the columns are known by position only: a row
	// with more (an id column first, say) would be read shifted, every
	// value under another feature's name. Empty trailing columns (a
	// separator at the end of the line) are harmless.
	if !c.header && len(fields) > need && strings.TrimSpace(strings.Join(fields[need:], "")) != "" {
		return fmt.Errorf("criteo %s:%d: %d columns, want %d (label, I1-I13, C1-C26): a file with other columns needs a header line naming them", c.name, c.line, len(fields), need)
	}
	label, err := strconv.ParseFloat(strings.TrimSpace(fields[c.order[0]]), 32)
	if err != nil {
		return fmt.Errorf("criteo %s:%d: label %q is not a number", c.name, c.line, fields[c.order[0]])
	}
	c.labels = append(c.labels, float32(label))
	row := make([]Column, len(c.sig.Inputs))
	for i, in := range c.sig.Inputs {
		if in.Kind == DenseKind {
			row[i].F32 = make([]float32, in.Width)
		} else {
			row[i].I64 = make([]int64, in.Width)
		}
	}
	for i, sl := range c.dense {
		s := strings.TrimSpace(fields[c.order[1+i]])
		v := 0.0
		if s != "" {
			v, err = strconv.ParseFloat(s, 64)
			// "inf" parses without error; log1p(+Inf) would score NaN.
			if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
				return fmt.Errorf("criteo %s:%d: I%d value %q is not a finite number", c.name, c.line, i+1, s)
			}
		}
		row[sl.in].F32[sl.pos] = float32(math.Log1p(max(v, 0)))
	}
	for k, sl := range c.cats {
		in := c.sig.Inputs[sl.in]
		h := hashCategory(strings.TrimSpace(fields[c.order[1+CriteoDense+k]]))
		if sl.pos >= 0 {
			rg := in.Ranges[sl.pos]
			id := rg.Lo + int64(h%uint64(rg.Hi-rg.Lo))
			if in.Kind == DenseKind {
				row[sl.in].F32[sl.pos] = float32(id)
			} else {
				row[sl.in].I64[sl.pos] = id
			}
			continue
		}
		for j := range in.Width {
			v := h
			if j > 0 {
				v = splitmix64(h + uint64(j))
			}
			if c.keys != nil && c.keys[sl.in] != nil {
				k := c.keys[sl.in]
				row[sl.in].I64[j] = k.at(int64(v % uint64(k.n)))
				continue
			}
			row[sl.in].I64[j] = int64(v % uint64(in.Rows))
		}
	}
	for i := range row {
		b.Columns[i].F32 = append(b.Columns[i].F32, row[i].F32...)
		b.Columns[i].I64 = append(b.Columns[i].I64, row[i].I64...)
	}
	return nil
}

// hashCategory turns a Criteo categorical value into a 64-bit number: the
// value itself when it is the usual 8-digit hex string, else its FNV hash;
// the empty value is 0.
func hashCategory(s string) uint64 {
	if s == "" {
		return 0
	}
	if v, err := strconv.ParseUint(s, 16, 64); err == nil {
		return v
	}
	h := fnv.New64a()
	h.Write([]byte(s))
	return h.Sum64()
}

func splitmix64(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}
