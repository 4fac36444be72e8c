package gpuserve

import (
	"bytes"
	"context"
	"log/slog"
	"runtime"
	"strings"
	"testing"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/ipc"
	"github.com/apache/arrow-go/v18/arrow/memory"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/internal/arrowframe"
)

// dictColumn is one column of dictFrame: width floats per row, every
// sample indexing the dictionary's only row.
type dictColumn struct {
	name  string
	width int
}

// dictFrame writes with arrow-go's IPC writer (as another Arrow producer
// would) a frame of rows samples whose columns are all dictionary-encoded
// with int16 indices into a one-row dictionary: two bytes a sample and
// column on the wire, width floats each once expanded.
func dictFrame(t testing.TB, rows int, cols []dictColumn) []byte {
	t.Helper()
	mem := memory.NewGoAllocator()
	var fields []arrow.Field
	var arrs []arrow.Array
	for _, c := range cols {
		lt := arrow.FixedSizeListOfNonNullable(int32(c.width), arrow.PrimitiveTypes.Float32)
		dt := &arrow.DictionaryType{IndexType: arrow.PrimitiveTypes.Int16, ValueType: lt}
		lb := array.NewBuilder(mem, lt).(*array.FixedSizeListBuilder)
		lb.Append(true)
		lb.ValueBuilder().(*array.Float32Builder).AppendValues(make([]float32, c.width), nil)
		ib := array.NewInt16Builder(mem)
		ib.AppendValues(make([]int16, rows), nil)
		fields = append(fields, arrow.Field{Name: c.name, Type: dt})
		arrs = append(arrs, array.NewDictionaryArray(dt, ib.NewArray(), lb.NewArray()))
	}
	schema := arrow.NewSchema(fields, nil)
	var buf bytes.Buffer
	w := ipc.NewWriter(&buf, ipc.WithSchema(schema), ipc.WithAllocator(mem))
	if err := w.Write(array.NewRecordBatch(schema, arrs, int64(rows))); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// allocated is the bytes the Go heap handed out while f ran.
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// TestScoreRefusesBeforeExpanding: a frame whose dictionary columns would
// expand to tens of megabytes, but which holds other than num_samples
// samples, or a column of another width than the plan's, is refused
// before any column is expanded: a small wrong frame costs the worker
// about its own bytes, not the expansion. Whole requests and parts of
// sharded fan-outs alike; frames arrowframe's fast path declines (int16
// indices: arrow-go's reader, which expands every dictionary column,
// even for DecodeIndexed) and frames it reads (int32 indices: a part's
// columns expand there).
func TestScoreRefusesBeforeExpanding(t *testing.T) {
	s, err := New(Options{Plans: []string{tinyPlan(t)}, Threads: 1, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	m := s.models[s.names[0]]
	var cols []dictColumn
	perRow := 0
	for _, sp := range m.spec {
		cols = append(cols, dictColumn{sp.Name, sp.Width})
		perRow += 4 * sp.Width
	}
	const rows = 20000
	tooMany := dictFrame(t, rows, cols)
	// 512 samples, as num_samples says, but the first column 16,384
	// floats wide: one 64 KiB dictionary row, 32 MiB expanded.
	const n = 512
	wide := append([]dictColumn{{cols[0].name, 1 << 14}}, cols[1:]...)
	wideFrame := dictFrame(t, n, wide)

	// The same frames as Prism's embedding tier writes them (int32
	// indices), their schemas cached: arrowframe's fast path reads them,
	// keeping dictionary columns unexpanded for a whole request but
	// expanding them for a part of a fan-out.
	prismFrame := func(rows int, cols []dictColumn) []byte {
		var ts []arrowframe.Tensor
		for _, c := range cols {
			ts = append(ts, arrowframe.Tensor{Name: c.name, Width: c.width, Data: make([]float32, c.width), Index: make([]int32, rows)})
		}
		b, err := arrowframe.Encode(rows, ts)
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := arrowframe.Decode(b); err != nil { // caches the schema
			t.Fatal(err)
		}
		return b
	}
	tooManyFast, wideFast := prismFrame(rows, cols), prismFrame(n, wide)

	cases := []struct {
		name      string
		req       *prismv1.ScoreRequest
		expansion int
		msg       string
	}{
		{"rows", &prismv1.ScoreRequest{Model: m.name, NumSamples: 3, Tensors: tooMany}, rows * perRow, "hold 20000 samples, num_samples says 3"},
		{"rows, part", &prismv1.ScoreRequest{Model: m.name, NumSamples: 3, Tensors: tooMany, FanoutKey: "k", Shard: 0, Shards: 2}, rows * perRow, "hold 20000 samples, num_samples says 3"},
		{"width", &prismv1.ScoreRequest{Model: m.name, NumSamples: n, Tensors: wideFrame}, n * 4 << 14, "has width 16384; the plan says 13"},
		{"width, part", &prismv1.ScoreRequest{Model: m.name, NumSamples: n, Tensors: wideFrame, FanoutKey: "k", Shard: 1, Shards: 2}, n * 4 << 14, "has width 16384; the plan says 13"},
		{"rows, fast", &prismv1.ScoreRequest{Model: m.name, NumSamples: 3, Tensors: tooManyFast}, rows * perRow, "hold 20000 samples, num_samples says 3"},
		{"rows, fast part", &prismv1.ScoreRequest{Model: m.name, NumSamples: 3, Tensors: tooManyFast, FanoutKey: "k", Shard: 0, Shards: 2}, rows * perRow, "hold 20000 samples, num_samples says 3"},
		{"width, fast", &prismv1.ScoreRequest{Model: m.name, NumSamples: n, Tensors: wideFast}, n * 4 << 14, "has width 16384; the plan says 13"},
		{"width, fast part", &prismv1.ScoreRequest{Model: m.name, NumSamples: n, Tensors: wideFast, FanoutKey: "k", Shard: 1, Shards: 2}, n * 4 << 14, "has width 16384; the plan says 13"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if len(c.req.Tensors)*8 > c.expansion {
				t.Fatalf("frame of %d bytes expands to only %d", len(c.req.Tensors), c.expansion)
			}
			var err error
			got := allocated(func() { _, err = s.Score(context.Background(), c.req) })
			if st := status.Convert(err); st.Code() != codes.InvalidArgument || !strings.Contains(st.Message(), c.msg) {
				t.Fatalf("Score: %v, want InvalidArgument containing %q", err, c.msg)
			}
			if got > uint64(c.expansion/4) {
				t.Errorf("refusing a %d-byte frame allocated %d bytes (its columns expand to %d): want it refused before expanding", len(c.req.Tensors), got, c.expansion)
			}
		})
	}
}
