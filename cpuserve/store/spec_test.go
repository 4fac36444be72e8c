package store

import (
	"bytes"
	"maps"
	"strings"
	"testing"
	"time"
)

func TestSetHotBytes(t *testing.T) {
	for _, tc := range []struct {
		spec         string
		mem          int64
		hot, autoMax int64
		bad          bool
	}{
		{"auto", 8 << 30, 0, 4 << 30, false},
		{" auto ", 8 << 30, 0, 4 << 30, false},
		{"auto", 0, 0, 0, false}, // memory unknown: the recorded size
		{"", 8 << 30, 0, 0, false},
		{"512MiB", 8 << 30, 512 << 20, 0, false},
		{"1g", 0, 1 << 30, 0, false},
		{"-1", 8 << 30, -1, 0, false},
		{"-512MiB", 8 << 30, -1, 0, false},
		{"lots", 8 << 30, 0, 0, true},
		// Read leniently, these disabled the tier or gave it the
		// recorded size.
		{"-lots", 8 << 30, 0, 0, true},
		{"-", 8 << 30, 0, 0, true},
		{"0", 8 << 30, 0, 0, true},
		{"0MiB", 8 << 30, 0, 0, true},
		{"-0", 8 << 30, -1, 0, false},
	} {
		var o Options
		err := o.SetHotBytes(tc.spec, tc.mem)
		if (err != nil) != tc.bad || o.HotBytes != tc.hot || o.HotBytesAutoMax != tc.autoMax {
			t.Errorf("SetHotBytes(%q, %d): HotBytes %d, HotBytesAutoMax %d, err %v; want %d, %d, error %v",
				tc.spec, tc.mem, o.HotBytes, o.HotBytesAutoMax, err, tc.hot, tc.autoMax, tc.bad)
		}
	}
}

func TestParseDTypes(t *testing.T) {
	for _, tc := range []struct {
		spec string
		def  DType
		per  map[string]DType
		bad  bool
	}{
		{"", "", map[string]DType{}, false},
		{"int8", Int8, map[string]DType{}, false},
		{"emb_l.2.weight=int8,float16", Float16, map[string]DType{"emb_l.2.weight": Int8}, false},
		{" a=float16 , b=float32 ", "", map[string]DType{"a": Float16, "b": Float32}, false},
		{"int4", "", nil, true},
		{"a=int4", "", nil, true},
	} {
		def, per, err := ParseDTypes(tc.spec)
		if (err != nil) != tc.bad || def != tc.def || (!tc.bad && !maps.Equal(per, tc.per)) {
			t.Errorf("ParseDTypes(%q) = %q, %v, %v; want %q, %v, error %v", tc.spec, def, per, err, tc.def, tc.per, tc.bad)
		}
	}
}

func TestReportText(t *testing.T) {
	var b bytes.Buffer
	r := &IngestReport{Model: "m", Version: 2, Activated: true, Rows: 1000, Bytes: 64000, Elapsed: time.Second,
		Tables: []TableReport{{Name: "a", Rows: 1000, Dim: 16, DType: Float32, Phys: 1}, {Name: "b", Rows: 10, Dim: 4, DType: Int8, Phys: 2, Shared: true}}}
	r.WriteText(&b)
	for _, want := range []string{"table a ", "shared (same content already stored)", `model "m" version 2 (active: true): 1000 rows written`, "; 10 rows of 1 of its 2 tables shared with content already stored\n"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, b.String())
		}
	}
	if strings.Contains(b.String(), "float32 source") {
		t.Errorf("a float32 ingest (its int8 table shared) says its bytes are of float32 source rows:\n%s", b.String())
	}
	// An int8 table written: the bytes are the float32 rows read.
	b.Reset()
	r.Tables[1].Shared = false
	r.WriteText(&b)
	if !strings.Contains(b.String(), "(of float32 source rows) in") {
		t.Errorf("an int8 ingest's bytes not said to be of float32 rows:\n%s", b.String())
	}
	b.Reset()
	WriteVersions(&b, []VersionInfo{{N: 1, Previous: true, Tables: 2}, {N: 2, Active: true, Tables: 2}})
	if lines := strings.Split(strings.TrimSpace(b.String()), "\n"); len(lines) != 2 || lines[0][0] != '<' || lines[1][0] != '*' {
		t.Errorf("versions:\n%s", b.String())
	}
}
