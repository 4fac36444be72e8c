package store

import (
	"fmt"
	"io"
	"strings"

	"github.com/prism-serve/prism/internal/flagval"
	"github.com/prism-serve/prism/internal/progress"
)

// HotBytesAuto is the hot tier size spec that sizes the tier to the
// served tables (SetHotBytes).
const HotBytesAuto = "auto"

// SetHotBytes sets the hot tier's size from a spec as people write it:
// "auto" holds every row of the active tables when that needs at most
// half of physicalMemory (bytes; 0 when unknown), else the store's
// recorded size; any negative size ("-1") disables the tier; "" is the
// recorded size (or DefaultHotBytes); anything else is a positive byte
// size ("512MiB", see flagval.Bytes). A size of 0 is refused: it read
// as "" and gave the recorded size to one who asked for none.
func (o *Options) SetHotBytes(spec string, physicalMemory int64) error {
	switch hb := strings.TrimSpace(spec); {
	case hb == HotBytesAuto:
		// Half: the rest of the machine is the process, Pebble's block
		// cache and memtables, and the OS's page cache under them.
		if physicalMemory > 0 {
			o.HotBytesAutoMax = physicalMemory / 2
		}
	case strings.HasPrefix(hb, "-"):
		// A size after the sign: "-lots" disabled the tier too.
		if _, err := flagval.Bytes(hb[1:]); err != nil || hb == "-" {
			return fmt.Errorf("%q is not a size", spec)
		}
		o.HotBytes = -1
	case hb == "":
	default:
		n, err := flagval.Bytes(hb)
		if err != nil {
			return err
		}
		if n == 0 {
			return fmt.Errorf("%q: want a positive size (a negative one disables the hot tier)", spec)
		}
		o.HotBytes = n
	}
	return nil
}

// ParseDTypes reads a stored-dtype spec: one dtype for every table
// ("int8"), or per table with an optional default
// ("emb_l.2.weight=int8,float16"). def is "" when the spec names no
// default (IngestOptions then uses float32).
func ParseDTypes(spec string) (def DType, perTable map[string]DType, err error) {
	perTable = map[string]DType{}
	for _, part := range strings.Split(spec, ",") {
		if part = strings.TrimSpace(part); part == "" {
			continue
		}
		name, dt, ok := strings.Cut(part, "=")
		if !ok {
			name, dt = "", part
		}
		d, err := ParseDType(dt)
		if err != nil {
			return "", nil, err
		}
		if name == "" {
			def = d
		} else {
			perTable[name] = d
		}
	}
	return def, perTable, nil
}

// WriteText prints the report as prism ingest does: a line per table
// (with its accuracy loss when quantized), then the totals.
func (r *IngestReport) WriteText(w io.Writer) {
	for _, t := range r.Tables {
		how := "ingested"
		switch {
		case t.Shared:
			how = "shared (same content already stored)"
		case t.ResumedAt > 0:
			how = fmt.Sprintf("resumed at row %d", t.ResumedAt)
		}
		if t.Part != nil {
			how += fmt.Sprintf(" (rows r mod %d = %d)", t.Part.Mod, t.Part.Rem)
		}
		fmt.Fprintf(w, "table %-24s %10d x %-4d %-8s phys %-4d %s\n", t.Name, t.Rows, t.Dim, t.DType, t.Phys, how)
		if t.Loss != nil {
			fmt.Fprintf(w, "    accuracy loss %s\n", t.Loss)
		}
	}
	sec := r.Elapsed.Seconds()
	if r.Shard != nil {
		fmt.Fprintf(w, "shard %d of %d\n", r.Shard.Shard, r.Shard.Shards)
	}
	// Bytes count the float32 rows read from the table files (the
	// stored rows are smaller in a narrower dtype): say so when they are.
	src := ""
	for _, t := range r.Tables {
		if !t.Shared && t.DType != "" && t.DType != Float32 {
			src = " (of float32 source rows)"
		}
	}
	fmt.Fprintf(w, "model %q version %d (active: %v): %d rows written, %s%s in %.1fs: %.0f rows/s, %.1f MB/s",
		r.Model, r.Version, r.Activated, r.Rows, progress.Bytes(r.Bytes), src, sec, float64(r.Rows)/sec, float64(r.Bytes)/sec/1e6)
	// Tables whose content was already stored are shared, not written:
	// say so, or an ingest run again after it finished reads as a
	// version of 0 rows.
	var shared, sharedRows int64
	for _, t := range r.Tables {
		if t.Shared {
			shared++
			sharedRows += t.Rows
		}
	}
	if shared > 0 {
		fmt.Fprintf(w, "; %d rows of %d of its %d tables shared with content already stored", sharedRows, shared, len(r.Tables))
	}
	if r.Existing {
		fmt.Fprintf(w, "; the store held these tables as version %d already: no version added", r.Version)
	}
	fmt.Fprintln(w)
}

// WriteVersions prints a model's versions, one a line: "*" marks the
// active one, "<" the one Rollback returns to.
func WriteVersions(w io.Writer, vs []VersionInfo) {
	for _, v := range vs {
		mark := " "
		if v.Active {
			mark = "*"
		} else if v.Previous {
			mark = "<"
		}
		shard := ""
		if v.Shard != nil {
			// Versions of one plan differ only by it: a version of
			// another shard switches the worker to that shard.
			shard = fmt.Sprintf(" (shard %d of %d)", v.Shard.Shard, v.Shard.Shards)
		}
		fmt.Fprintf(w, "%s %3d  %2d tables%s  %s  %s\n", mark, v.N, v.Tables, shard, v.Created, v.Plan)
	}
}

// WriteDiverged writes what `prism store versions` says of a model whose
// copy the store records diverged at update seq (Store.Diverged).
func WriteDiverged(w io.Writer, model string, seq int64) {
	fmt.Fprintf(w, "diverged at update %d: a router found this store's copy of %q differing from its other workers' (it answered an update otherwise than they did), so no router sends its worker the model's lookups or updates; stop the worker and give it a copy of an up-to-date worker's store (prism store copy --from A_SERVING_WORKER --db DIR)\n", seq, model)
}
