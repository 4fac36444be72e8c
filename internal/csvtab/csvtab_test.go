package csvtab

import (
	"io"
	"math"
	"strings"
	"testing"
)

func TestReader(t *testing.T) {
	in := "\ufeff a ,B,c\n1,2.5,x\n\n-3,NaN\n4.0,,\n"
	r, err := NewReader("f.csv", strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if h := strings.Join(r.Header(), "|"); h != "a|B|c" {
		t.Fatalf("header %q", h)
	}
	if err := r.Require("a", "B"); err != nil {
		t.Fatal(err)
	}
	if err := r.Require("a", "d"); err == nil || err.Error() != `f.csv:1: missing column "d"` {
		t.Fatalf("require: %v", err)
	}
	if col, ok := r.Find("x", "b", "a"); !ok || col != "B" {
		t.Fatalf("find: %q %v", col, ok)
	}

	row, err := r.Next()
	if err != nil || row.Line() != 2 || row.Len() != 3 {
		t.Fatalf("row 1: %v %+v", err, row)
	}
	if v, err := row.Uint("a"); err != nil || v != 1 {
		t.Fatalf("a: %v %v", v, err)
	}
	if v, err := row.Float("B"); err != nil || v != 2.5 {
		t.Fatalf("B: %v %v", v, err)
	}
	if _, err := row.Int("B"); err == nil || err.Error() != `f.csv:2: column "B": "2.5" is not an integer` {
		t.Fatalf("B as int: %v", err)
	}
	if _, err := row.Float("c"); err == nil || err.Error() != `f.csv:2: column "c": "x" is not a number` {
		t.Fatalf("c as float: %v", err)
	}
	if row.Str("nope") != "" {
		t.Fatal("unknown column not empty")
	}

	row, err = r.Next() // the empty line is skipped
	if err != nil || row.Line() != 4 {
		t.Fatalf("row 2: %v line %d", err, row.Line())
	}
	if _, err := row.Uint("a"); err == nil || err.Error() != `f.csv:4: column "a": negative value -3` {
		t.Fatalf("negative: %v", err)
	}
	if v, err := row.Int("a"); err != nil || v != -3 {
		t.Fatalf("int: %v %v", v, err)
	}
	if _, err := row.Float("B"); err == nil || !strings.Contains(err.Error(), `"NaN" is not a number`) {
		t.Fatalf("NaN: %v", err)
	}
	if v, err := row.FloatOr("B", math.Inf(1)); err != nil || !math.IsInf(v, 1) {
		t.Fatalf("NaN as missing: %v %v", v, err)
	}
	if v, err := row.FloatOr("c", 7); err != nil || v != 7 { // short record
		t.Fatalf("short record: %v %v", v, err)
	}

	row, err = r.Next()
	if err != nil {
		t.Fatal(err)
	}
	if v, err := row.Int("a"); err != nil || v != 4 {
		t.Fatalf("4.0: %v %v", v, err)
	}
	if _, err := row.Int("B"); err == nil || err.Error() != `f.csv:5: column "B" is empty` {
		t.Fatalf("empty: %v", err)
	}
	if !(&Row{rec: []string{"  "}}).Blank() || (&Row{rec: []string{" ", ""}}).Blank() || row.Blank() {
		t.Fatal("Blank")
	}
	if _, err := r.Next(); err != io.EOF {
		t.Fatalf("end: %v", err)
	}
}

func TestReaderErrors(t *testing.T) {
	if _, err := NewReader("e.csv", strings.NewReader("")); err == nil || err.Error() != "e.csv: empty file, want a header row" {
		t.Fatalf("empty: %v", err)
	}
	if _, err := NewReader("q.csv", strings.NewReader("a,\"b\n")); err == nil || !strings.HasPrefix(err.Error(), "q.csv:1: ") {
		t.Fatalf("bad header: %v", err)
	}
	if r, err := NewReader("q.csv", strings.NewReader("a,b\n1,2\n3,x\"y\n")); err != nil {
		t.Fatal(err)
	} else if _, err := r.Next(); err != nil {
		t.Fatal(err)
	} else if _, err := r.Next(); err == nil || !strings.HasPrefix(err.Error(), "q.csv:3: ") {
		t.Fatalf("bad quote: %v", err)
	}
	// The lenient reader keeps stray quotes as text (free-text columns
	// of real traces), and the line of the record still names errors.
	r, err := NewLenientReader("q.csv", strings.NewReader("a,b\n1,2\n3,x\"y\n"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Next(); err != nil {
		t.Fatal(err)
	}
	row, err := r.Next()
	if err != nil || row.Str("b") != `x"y` {
		t.Fatalf("stray quote: %v %q", err, row.Str("b"))
	}
	if _, err := row.Int("b"); err == nil || !strings.HasPrefix(err.Error(), "q.csv:3: ") {
		t.Fatalf("error line: %v", err)
	}
}
