// Package csvtab reads a CSV file with a header row: columns are looked up
// by name, and every error names the file, the line and the column, as in
// "nodes.csv:12: column "gpu": "x" is not an integer".
//
// The traces this project reads (openb, the Prism DLRM trace, QPS series)
// are CSV with a header; their readers share this one so they agree on
// quoting, blank lines, a UTF-8 byte order mark and error text.
package csvtab

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
)

// Reader reads the records after the header. It is not safe for
// concurrent use.
type Reader struct {
	name   string
	r      *csv.Reader
	header []string
	cols   map[string]int
}

// NewReader reads the header row of r. name is what errors call the
// input, usually its path. Header names are trimmed of spaces (and a
// leading byte order mark); the first of two equal names wins.
func NewReader(name string, r io.Reader) (*Reader, error) {
	return newReader(name, r, false)
}

// NewLenientReader is NewReader for files whose other columns hold free
// text the caller never reads: a stray quote is kept as text (and an
// unterminated quoted field runs to the end of the input) instead of
// failing the file.
func NewLenientReader(name string, r io.Reader) (*Reader, error) {
	return newReader(name, r, true)
}

func newReader(name string, r io.Reader, lazy bool) (*Reader, error) {
	cr := csv.NewReader(r)
	cr.ReuseRecord = true
	cr.FieldsPerRecord = -1
	cr.LazyQuotes = lazy
	head, err := cr.Read()
	if err == io.EOF {
		return nil, fmt.Errorf("%s: empty file, want a header row", name)
	}
	if err != nil {
		return nil, parseErr(name, err)
	}
	t := &Reader{name: name, r: cr, cols: map[string]int{}}
	for i, h := range head {
		h = strings.TrimSpace(strings.TrimPrefix(h, "\ufeff"))
		t.header = append(t.header, h)
		if _, dup := t.cols[h]; !dup {
			t.cols[h] = i
		}
	}
	return t, nil
}

// Name is the input's name as errors give it.
func (t *Reader) Name() string { return t.name }

// Header returns the trimmed header names in file order; the caller must
// not change it.
func (t *Reader) Header() []string { return t.header }

// Has reports whether the header names col (exactly).
func (t *Reader) Has(col string) bool {
	_, ok := t.cols[col]
	return ok
}

// Require reports the first of cols the header lacks, as an error on
// line 1.
func (t *Reader) Require(cols ...string) error {
	for _, c := range cols {
		if !t.Has(c) {
			return t.Errorf(1, "missing column %q", c)
		}
	}
	return nil
}

// Find returns the header name that matches the first of names, compared
// case-insensitively, in the order names are given.
func (t *Reader) Find(names ...string) (string, bool) {
	for _, w := range names {
		for _, h := range t.header {
			if strings.EqualFold(h, w) {
				return h, true
			}
		}
	}
	return "", false
}

// Errorf returns an error prefixed with the input's name and line.
func (t *Reader) Errorf(line int, format string, a ...any) error {
	return fmt.Errorf("%s:%d: %s", t.name, line, fmt.Sprintf(format, a...))
}

// Next returns the next record, or io.EOF after the last. Empty lines are
// skipped. The Row is valid until the next call.
func (t *Reader) Next() (*Row, error) {
	rec, err := t.r.Read()
	if err == io.EOF {
		return nil, io.EOF
	}
	if err != nil {
		return nil, parseErr(t.name, err)
	}
	line, _ := t.r.FieldPos(0)
	return &Row{t: t, rec: rec, line: line}, nil
}

func parseErr(name string, err error) error {
	var pe *csv.ParseError
	if errors.As(err, &pe) {
		return fmt.Errorf("%s:%d: %w", name, pe.Line, pe.Err)
	}
	return fmt.Errorf("%s: %w", name, err)
}

// Row is one record and the line it starts on.
type Row struct {
	t    *Reader
	rec  []string
	line int
}

// Line is the 1-based line the record starts on.
func (r *Row) Line() int { return r.line }

// Len is the number of fields in the record.
func (r *Row) Len() int { return len(r.rec) }

// Blank reports a line of nothing but spaces (one field of spaces). A
// line of empty fields ("," or ",,") is not blank: it is a record
// whose values are missing, and the caller says so.
func (r *Row) Blank() bool {
	return len(r.rec) == 1 && strings.TrimSpace(r.rec[0]) == ""
}

// Str returns the trimmed field of column col; "" when the header lacks
// col or the record is short.
func (r *Row) Str(col string) string {
	i, ok := r.t.cols[col]
	if !ok || i >= len(r.rec) {
		return ""
	}
	return strings.TrimSpace(r.rec[i])
}

// Errorf returns an error prefixed with the input's name and this row's
// line.
func (r *Row) Errorf(format string, a ...any) error {
	return r.t.Errorf(r.line, format, a...)
}

// Int returns column col as an integer. A float with no fractional part
// ("12000.0", as some exports write integers) is accepted.
func (r *Row) Int(col string) (int64, error) {
	s := r.Str(col)
	if s == "" {
		return 0, r.Errorf("column %q is empty", col)
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		f, ferr := strconv.ParseFloat(s, 64)
		if ferr != nil || f != math.Trunc(f) || math.Abs(f) >= 1<<63 {
			return 0, r.Errorf("column %q: %q is not an integer", col, s)
		}
		v = int64(f)
	}
	return v, nil
}

// Uint is Int for a column that must not be negative.
func (r *Row) Uint(col string) (int64, error) {
	v, err := r.Int(col)
	if err != nil {
		return 0, err
	}
	if v < 0 {
		return 0, r.Errorf("column %q: negative value %d", col, v)
	}
	return v, nil
}

// Float returns column col as a finite number.
func (r *Row) Float(col string) (float64, error) {
	s := r.Str(col)
	if s == "" {
		return 0, r.Errorf("column %q is empty", col)
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
		return 0, r.Errorf("column %q: %q is not a number", col, s)
	}
	return v, nil
}

// FloatOr is Float with def for an empty field or NaN, which is how
// pandas writes a missing value.
func (r *Row) FloatOr(col string, def float64) (float64, error) {
	if s := r.Str(col); s == "" || strings.EqualFold(s, "nan") {
		return def, nil
	}
	return r.Float(col)
}
