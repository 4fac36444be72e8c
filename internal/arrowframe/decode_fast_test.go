package arrowframe

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"unsafe"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/endian"
	"github.com/apache/arrow-go/v18/arrow/ipc"
	"github.com/apache/arrow-go/v18/arrow/memory"
)

// checkFastAgainstSlow decodes b through arrow-go's path, the fast path
// and Decode, and fails if the fast path accepts a frame arrow-go's path
// refuses, or if any result differs from arrow-go's path's (samples, names,
// widths, and the very same data slices). It reports whether the fast path
// took b (after Decode, which may have learnt b's schema).
func checkFastAgainstSlow(t testing.TB, b []byte) (fast bool) {
	t.Helper()
	sn, sts, serr := decodeWithArrow(b)
	if serr != nil && !errors.Is(serr, ErrMalformed) {
		t.Fatalf("arrow-go's path: error %v is not ErrMalformed", serr)
	}
	check := func(stage string) bool {
		fn, fts, ok := decodeCached(b)
		if !ok {
			return false
		}
		if serr != nil {
			t.Fatalf("%s: fast path accepted a frame arrow-go's path refuses (%v): n=%d %d tensors", stage, serr, fn, len(fts))
		}
		if !sameDecode(fn, fts, sn, sts) {
			t.Fatalf("%s: fast path decodes to n=%d %s, arrow-go's path to n=%d %s", stage, fn, describe(fts), sn, describe(sts))
		}
		return true
	}
	check("before Decode")
	n, ts, err := Decode(b)
	if (err == nil) != (serr == nil) {
		t.Fatalf("Decode: err %v, arrow-go's path: err %v", err, serr)
	}
	if err != nil && !errors.Is(err, ErrMalformed) {
		t.Fatalf("Decode: error %v is not ErrMalformed", err)
	}
	if err == nil && !sameDecode(n, ts, sn, sts) && !(expanded(b, ts) && sameValues(n, ts, sn, sts)) {
		t.Fatalf("Decode gives n=%d %s, arrow-go's path n=%d %s", n, describe(ts), sn, describe(sts))
	}
	return check("after Decode")
}

func describe(ts []Tensor) string {
	var s strings.Builder
	s.WriteByte('[')
	for _, t := range ts {
		fmt.Fprintf(&s, " %q/%d len %d cap %d", t.Name, t.Width, len(t.Data), cap(t.Data))
		if t.Context {
			s.WriteString(" context")
		}
		if len(t.Data) > 0 {
			fmt.Fprintf(&s, " at %p", &t.Data[0])
		}
	}
	s.WriteString(" ]")
	return s.String()
}

// shapes are the layouts the tests frame.
var shapes = []struct {
	n      int
	widths []int
}{
	{1, []int{1}}, {2, []int{3, 1}}, {7, []int{13, 16, 16}}, {64, []int{3, 1, 128, 5}}, {270, []int{13, 16, 16, 16}}, {513, []int{1}},
}

func shapeTensors(r *rand.Rand, n int, widths []int) []Tensor {
	ts := make([]Tensor, len(widths))
	for i, w := range widths {
		d := make([]float32, n*w)
		for j := range d {
			d[j] = r.Float32()
		}
		ts[i] = Tensor{Name: fmt.Sprintf("t%d/x", i), Width: w, Data: d}
	}
	return ts
}

// batchAt locates the record batch message of a frame whose schema message
// ends at schemaEnd: absolute positions in the frame of the fields the
// mutations below change.
type batchAt struct {
	meta, body, end         int
	version, headerType     int // -1 where absent
	bodyLength, rows        int
	nodes, bufs             int
	nNodes, nBufs, bodyLenV int
}

func locateBatch(t testing.TB, b []byte) batchAt {
	t.Helper()
	r := &bytesMessages{b: b}
	if _, err := r.Message(); err != nil {
		t.Fatal(err)
	}
	meta, body, end, ok := messageAt(b, r.off)
	if !ok {
		t.Fatal("no batch message")
	}
	m0 := body - len(meta)
	msg := root(meta)
	at := batchAt{meta: m0, body: body, end: end, bodyLenV: end - body}
	abs := func(pos uint32, o uint16) int {
		if o == 0 {
			return -1
		}
		return m0 + int(pos) + int(o)
	}
	at.version = abs(uint32(msg.Pos), uint16(msg.Offset(slotMsgVersion)))
	at.headerType = abs(uint32(msg.Pos), uint16(msg.Offset(slotMsgHeaderType)))
	at.bodyLength = abs(uint32(msg.Pos), uint16(msg.Offset(slotMsgBodyLength)))
	var rb = *msg
	if !union(msg, slotMsgHeader, &rb) {
		t.Fatal("no header")
	}
	at.rows = abs(uint32(rb.Pos), uint16(rb.Offset(slotRBLength)))
	nodes, nn := vectorAt(&rb, slotRBNodes, 16)
	bufs, nb := vectorAt(&rb, slotRBBuffers, 16)
	at.nodes, at.nNodes, at.bufs, at.nBufs = m0+nodes, nn, m0+bufs, nb
	return at
}

func put64(b []byte, pos int, v int64) []byte {
	c := bytes.Clone(b)
	binary.LittleEndian.PutUint64(c[pos:], uint64(v))
	return c
}

// shifted copies b to an address k bytes past a 64-byte boundary.
func shifted(b []byte, k int) []byte {
	raw := make([]byte, len(b)+64+k)
	start := 0
	for uintptrOf(raw[start:])%64 != 0 {
		start++
	}
	c := raw[start+k : start+k+len(b)]
	copy(c, b)
	return c
}

type frameCase struct {
	name string
	b    []byte
	fast int // 1: the fast path must take it (once its schema is known), 0: must not, -1: either
}

// frameCases are the existing tests' frames, arrow-go's and AppendEncode's
// frames of many shapes, the fuzz corpus, and odd-but-valid and broken
// variants of the plain frame.
func frameCases(t testing.TB) []frameCase {
	t.Helper()
	var cs []frameCase
	add := func(name string, b []byte, fast int) { cs = append(cs, frameCase{name, b, fast}) }

	// TestRoundTrip's and TestMalformed's frames.
	rt, err := Encode(2, []Tensor{{Name: "a", Width: 3, Data: []float32{1, 2, 3, 4, 5, 6}}, {Name: "b", Width: 1, Data: []float32{-1, 0.5}}})
	if err != nil {
		t.Fatal(err)
	}
	add("roundtrip", rt, 1)
	mal, _ := Encode(2, []Tensor{{Name: "a", Width: 2, Data: []float32{1, 2, 3, 4}}})
	add("malformed/valid", mal, 1)
	add("malformed/empty", nil, 0)
	add("malformed/garbage", []byte("not arrow at all, not at all"), 0)
	add("malformed/truncated", mal[:len(mal)/2], 0)
	add("compressed", compressedFrame(t), 0)
	add("arrow-go nullable, no nulls", builtFrame(t, builtPlain), 1)
	add("arrow-go list null", builtFrame(t, builtListNull), 0)
	add("arrow-go value null", builtFrame(t, builtValueNull), 0)
	add("arrow-go batch metadata", builtFrame(t, builtBatchMeta), 0)
	add("arrow-go sliced batch", builtFrame(t, builtSliced), -1)
	add("arrow-go dictionary column", dictFrame(t, arrow.PrimitiveTypes.Int32, 2, []float32{1, 2, 3, 4}, []int64{1, 0, 1}), 1)
	add("arrow-go dictionary, int8 indices", dictFrame(t, arrow.PrimitiveTypes.Int8, 2, []float32{1, 2, 3, 4}, []int64{1, 0}), 0)
	add("arrow-go dictionary, index past it", dictFrame(t, arrow.PrimitiveTypes.Int32, 2, []float32{1, 2, 3, 4}, []int64{1, 2}), 0)
	dictTs := dlrmCutDict(40)
	dictFast, err := AppendEncode(nil, 40, dictTs)
	if err != nil {
		t.Fatal(err)
	}
	add("AppendEncode dictionary columns", dictFast, 1)
	dictRef, err := encodeWithArrow(nil, 40, dictTs)
	if err != nil {
		t.Fatal(err)
	}
	add("arrow-go dictionary columns", dictRef, -1)
	bad := bytes.Clone(dictFast)
	binary.LittleEndian.PutUint32(bad[len(bad)-8-4*40+4*7:], 1<<20) // an index far past its dictionary
	add("AppendEncode dictionary, index corrupted", bad, 0)
	if be := bigEndianFrame(t); be != nil {
		add("big-endian schema", be, 0)
	}

	r := rand.New(rand.NewPCG(3, 4))
	for _, s := range shapes {
		ts := shapeTensors(r, s.n, s.widths)
		name := fmt.Sprintf("n=%d widths=%v", s.n, s.widths)
		fast, err := AppendEncode(nil, s.n, ts)
		if err != nil {
			t.Fatal(err)
		}
		add("append "+name, fast, 1)
		ref, err := encodeWithArrow(nil, s.n, ts)
		if err != nil {
			t.Fatal(err)
		}
		add("arrow-go "+name, ref, 1)
		cs = append(cs, variants(t, name, fast)...)
	}
	// Zero samples: valid, but left to arrow-go.
	zero, err := encodeWithArrow(nil, 0, []Tensor{{Name: "a", Width: 2}})
	if err != nil {
		t.Fatal(err)
	}
	add("zero samples", zero, 0)
	dlrm, err := Encode(270, dlrmCut(270))
	if err != nil {
		t.Fatal(err)
	}
	add("dlrm 270", dlrm, 1)
	cs = append(cs, contextFrameCases(t)...)

	for _, dir := range []string{"FuzzDecode", "FuzzDecodeFast"} {
		files, _ := filepath.Glob(filepath.Join("testdata", "fuzz", dir, "*"))
		for _, f := range files {
			add("corpus "+dir+"/"+filepath.Base(f), readCorpus(t, f), -1)
		}
	}
	return cs
}

// variants are odd-but-valid and broken versions of a plain frame.
func variants(t testing.TB, name string, b []byte) []frameCase {
	t.Helper()
	at := locateBatch(t, b)
	var cs []frameCase
	add := func(v string, c []byte, fast int) { cs = append(cs, frameCase{name + " " + v, c, fast}) }
	cols := at.nBufs / 3
	n := int64(binary.LittleEndian.Uint64(b[at.rows:]))
	node := func(i int) int { return at.nodes + 16*i }
	buf := func(i int) int { return at.bufs + 16*i }
	w := func(i int) int64 { return int64(binary.LittleEndian.Uint64(b[node(2*i+1):])) / n }

	// Framing and the end of the stream.
	add("no end-of-stream", b[:at.end], 1)
	add("legacy end-of-stream", append(bytes.Clone(b[:at.end]), 0, 0, 0, 0), 1)
	add("bytes after end-of-stream", append(bytes.Clone(b), "trailing junk"...), 1)
	for k := 1; k < 4; k++ {
		add(fmt.Sprintf("%d bytes after the body", k), append(bytes.Clone(b[:at.end]), make([]byte, k)...), 0)
	}
	add("continuation, no length", append(bytes.Clone(b[:at.end]), 0xff, 0xff, 0xff, 0xff), 0)
	add("two batches", append(bytes.Clone(b[:at.end]), b[at.meta-8:]...), 0)
	add("batch twice, junk", append(bytes.Clone(b[:at.end]), b[at.meta-8:at.meta+4]...), 0)
	add("no batch", append(bytes.Clone(b[:at.meta-8]), 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0), 0)
	add("schema twice", append(bytes.Clone(b[:at.meta-8]), b...), 0)
	for _, k := range []int{1, 2, 3, 4, 8} {
		want := 0
		if k%4 == 0 || unalignedFloats {
			want = 1
		}
		add(fmt.Sprintf("at +%d", k), shifted(b, k), want)
	}
	for cut := 0; cut < len(b); cut += max(1, len(b)/97) {
		want := 0
		if cut >= at.end {
			want = -1 // the batch is whole: arrow-go may well accept
		}
		add(fmt.Sprintf("truncated to %d", cut), b[:cut], want)
	}
	add("truncated body", b[:at.end-1], 0)

	// Message fields.
	if at.version >= 0 {
		v4 := bytes.Clone(b)
		binary.LittleEndian.PutUint16(v4[at.version:], 3)
		add("metadata V4", v4, 0)
	}
	if at.headerType >= 0 {
		d := bytes.Clone(b)
		d[at.headerType] = 2
		add("dictionary batch", d, 0)
	}
	if at.bodyLength >= 0 {
		for _, d := range []int64{-8, -1, 1, 8, 1 << 40, -1 << 40} {
			add(fmt.Sprintf("bodyLength%+d", d), put64(b, at.bodyLength, int64(at.bodyLenV)+d), -1)
		}
	}
	if at.rows >= 0 {
		for _, v := range []int64{0, -1, n - 1, n + 1, 1 << 40, -1 << 62} {
			add(fmt.Sprintf("rows=%d", v), put64(b, at.rows, v), 0)
		}
	}
	// Nodes and buffers, column by column.
	for i := range cols {
		c := fmt.Sprintf("col %d ", i)
		add(c+"list nulls=1", put64(b, node(2*i)+8, 1), 0)
		add(c+"list nulls=-1", put64(b, node(2*i)+8, -1), 0)
		add(c+"values nulls=1", put64(b, node(2*i+1)+8, 1), 0)
		for _, d := range []int64{-1, 1, n} {
			add(fmt.Sprintf("%slist length%+d", c, d), put64(b, node(2*i), n+d), 0)
			add(fmt.Sprintf("%svalues length%+d", c, d), put64(b, node(2*i+1), n*w(i)+d), 0)
		}
		for j := range 3 {
			p := buf(3*i + j)
			off := int64(binary.LittleEndian.Uint64(b[p:]))
			length := int64(binary.LittleEndian.Uint64(b[p+8:]))
			bc := fmt.Sprintf("%sbuffer %d ", c, j)
			add(bc+"offset past the body", put64(b, p, int64(at.bodyLenV)+8), 0)
			add(bc+"offset -8", put64(b, p, -8), 0)
			add(bc+"offset huge", put64(b, p, 1<<62), 0)
			add(bc+"length huge", put64(b, p+8, 1<<62), 0)
			add(bc+"length -1", put64(b, p+8, -1), 0)
			if j == 2 {
				add(bc+"offset +4", put64(b, p, off+4), -1)
				if unalignedFloats {
					add(bc+"offset +2", put64(b, p, off+2), -1)
				} else {
					add(bc+"offset +2", put64(b, p, off+2), 0)
				}
				add(bc+"length -4", put64(b, p+8, length-4), 0)
				add(bc+"length 0", put64(b, p+8, 0), 0)
				add(bc+"length +4", put64(b, p+8, length+4), -1)
				add(bc+"offset of column 0", put64(b, p, int64(binary.LittleEndian.Uint64(b[buf(2):]))), -1)
			} else {
				add(bc+"length 8", put64(b, p+8, 8), 1) // no nulls: never read
			}
		}
	}
	return cs
}

func uintptrOf(b []byte) uintptr { return uintptr(unsafe.Pointer(unsafe.SliceData(b))) }

// compressedFrame is TestCompressedRefused's frame.
func compressedFrame(t testing.TB) []byte {
	var buf bytes.Buffer
	schema := arrow.NewSchema([]arrow.Field{{Name: "a", Type: arrow.FixedSizeListOfNonNullable(2, arrow.PrimitiveTypes.Float32)}}, nil)
	w := ipc.NewWriter(&buf, ipc.WithSchema(schema), ipc.WithZstd())
	b := array.NewRecordBuilder(memory.NewGoAllocator(), schema)
	lb := b.Field(0).(*array.FixedSizeListBuilder)
	vb := lb.ValueBuilder().(*array.Float32Builder)
	for range 4 {
		lb.Append(true)
		vb.AppendValues([]float32{1, 2}, nil)
	}
	rec := b.NewRecordBatch()
	if err := w.Write(rec); err != nil {
		t.Fatal(err)
	}
	w.Close()
	return buf.Bytes()
}

const (
	builtPlain = iota
	builtListNull
	builtValueNull
	builtBatchMeta
	builtSliced
)

// builtFrame is a frame from arrow-go's builders and writer, of 4 rows of
// a nullable FixedSizeList<float32>[2] column: plain, with a null list, a
// null value, custom metadata on the batch, or a slice of a bigger batch.
func builtFrame(t testing.TB, kind int) []byte {
	t.Helper()
	var buf bytes.Buffer
	schema := arrow.NewSchema([]arrow.Field{{Name: "a", Type: arrow.FixedSizeListOf(2, arrow.PrimitiveTypes.Float32), Nullable: true}}, nil)
	w := ipc.NewWriter(&buf, ipc.WithSchema(schema))
	b := array.NewRecordBuilder(memory.NewGoAllocator(), schema)
	lb := b.Field(0).(*array.FixedSizeListBuilder)
	vb := lb.ValueBuilder().(*array.Float32Builder)
	for i := range 6 {
		lb.Append(!(kind == builtListNull && i == 1))
		vb.AppendValues([]float32{float32(i), -1}, []bool{!(kind == builtValueNull && i == 2), true})
	}
	rec := b.NewRecordBatch()
	switch kind {
	case builtBatchMeta:
		rec = array.NewRecordBatchWithMetadata(schema, rec.Columns(), rec.NumRows(), arrow.NewMetadata([]string{"k"}, []string{"v"}))
	case builtSliced:
		rec = rec.NewSlice(1, 5)
	}
	if err := w.Write(rec); err != nil {
		t.Fatal(err)
	}
	w.Close()
	return buf.Bytes()
}

// bigEndianFrame is a frame whose schema says big-endian: arrow-go swaps
// its floats (in place), so the fast path must never learn its schema.
func bigEndianFrame(t testing.TB) []byte {
	var buf bytes.Buffer
	lt := arrow.FixedSizeListOfNonNullable(2, arrow.PrimitiveTypes.Float32)
	schema := arrow.NewSchemaWithEndian([]arrow.Field{{Name: "a", Type: lt}}, nil, endian.NonNativeEndian)
	vals := array.NewData(arrow.PrimitiveTypes.Float32, 4, []*memory.Buffer{nil, memory.NewBufferBytes(make([]byte, 16))}, nil, 0, 0)
	list := array.NewData(lt, 2, []*memory.Buffer{nil}, []arrow.ArrayData{vals}, 0, 0)
	col := array.NewFixedSizeListData(list)
	rec := array.NewRecordBatch(schema, []arrow.Array{col}, 2)
	w := ipc.NewWriter(&buf, ipc.WithSchema(schema))
	if err := w.Write(rec); err != nil {
		t.Logf("arrow-go writes no big-endian frame: %v", err)
		return nil
	}
	w.Close()
	return buf.Bytes()
}

// readCorpus reads a `go test fuzz v1` file of one []byte.
func readCorpus(t testing.TB, path string) []byte {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitN(strings.TrimSpace(string(raw)), "\n", 2)
	if len(lines) != 2 || !strings.HasPrefix(lines[1], "[]byte(") || !strings.HasSuffix(lines[1], ")") {
		t.Fatalf("%s: not a []byte corpus entry", path)
	}
	s, err := strconv.Unquote(strings.TrimSuffix(strings.TrimPrefix(lines[1], "[]byte("), ")"))
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return []byte(s)
}

// TestDecodeFastMatchesSlow: over the existing tests' frames, the fuzz
// corpus, frames of many shapes from both encoders and variants of them,
// the fast path accepts nothing arrow-go's path refuses, every result is
// arrow-go's path's, and the plain frames do take the fast path.
func TestDecodeFastMatchesSlow(t *testing.T) {
	cs := frameCases(t)
	taken := 0
	for _, c := range cs {
		got := checkFastAgainstSlow(t, c.b)
		switch {
		case c.fast == 1 && !got:
			t.Errorf("%s: fast path not taken", c.name)
		case c.fast == 0 && got:
			t.Errorf("%s: fast path taken", c.name)
		}
		if got {
			taken++
		}
	}
	t.Logf("%d frames, %d through the fast path", len(cs), taken)
}

// TestDecodeFastTaken: once a layout's first frame went through arrow-go,
// the following frames of that layout take the fast path and decode to
// the tensors encoded.
func TestDecodeFastTaken(t *testing.T) {
	ts := dlrmCut(270)
	r := rand.New(rand.NewPCG(5, 6))
	for _, t := range ts {
		for j := range t.Data {
			t.Data[j] = r.Float32()
		}
	}
	b, err := Encode(270, ts)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := Decode(b); err != nil {
		t.Fatal(err)
	}
	b2, err := Encode(270, ts)
	if err != nil {
		t.Fatal(err)
	}
	n, got, ok := decodeCached(b2)
	if !ok {
		t.Fatal("fast path not taken")
	}
	if n != 270 || len(got) != len(ts) {
		t.Fatalf("n=%d, %d tensors", n, len(got))
	}
	for i := range ts {
		if got[i].Name != ts[i].Name || got[i].Width != ts[i].Width || len(got[i].Data) != len(ts[i].Data) || cap(got[i].Data) != len(ts[i].Data) {
			t.Fatalf("tensor %d: %q/%d, %d values", i, got[i].Name, got[i].Width, len(got[i].Data))
		}
		for j := range ts[i].Data {
			if got[i].Data[j] != ts[i].Data[j] {
				t.Fatalf("tensor %d value %d: %v, want %v", i, j, got[i].Data[j], ts[i].Data[j])
			}
		}
		if p, q := uintptrOf(b2), uintptr(unsafe.Pointer(&got[i].Data[0])); q < p || q+4*uintptr(len(got[i].Data)) > p+uintptr(len(b2)) {
			t.Fatalf("tensor %d does not alias the frame", i)
		}
	}
}

// TestSchemaCacheBounded: many layouts leave at most schemaCacheCap
// schemas cached, the newest first, and big schema messages none.
func TestSchemaCacheBounded(t *testing.T) {
	for k := range 3 * schemaCacheCap {
		b, err := Encode(1, []Tensor{{Name: fmt.Sprintf("layout%d", k), Width: 1, Data: []float32{1}}})
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := Decode(b); err != nil {
			t.Fatal(err)
		}
		if lookupSchema(b) == nil {
			t.Fatalf("layout %d not cached", k)
		}
		if l := *schemaCache.list.Load(); len(l) > schemaCacheCap || !bytes.HasPrefix(b, l[0].msg) {
			t.Fatalf("%d schemas cached", len(l))
		}
	}
	big, err := Encode(1, []Tensor{{Name: strings.Repeat("x", maxCachedSchema), Width: 1, Data: []float32{1}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := Decode(big); err != nil {
		t.Fatal(err)
	}
	if lookupSchema(big) != nil {
		t.Fatal("a schema message over maxCachedSchema was cached")
	}
}

// TestDecodeFastConcurrent: decoders of more layouts than the cache holds,
// concurrently (run with -race), all get arrow-go's path's results.
func TestDecodeFastConcurrent(t *testing.T) {
	var frames [][]byte
	r := rand.New(rand.NewPCG(7, 8))
	for k := range schemaCacheCap + 4 {
		ts := shapeTensors(r, 3+k, []int{1 + k, 2})
		ts[0].Name = fmt.Sprintf("c%d", k)
		b, err := Encode(3+k, ts)
		if err != nil {
			t.Fatal(err)
		}
		frames = append(frames, b)
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 200 {
				b := frames[(g+i*(g+1))%len(frames)]
				sn, sts, serr := decodeWithArrow(b)
				n, ts, err := Decode(b)
				if serr != nil || err != nil || !sameDecode(n, ts, sn, sts) {
					t.Errorf("frame %d: %v %v", i, err, serr)
					return
				}
			}
		})
	}
	wg.Wait()
}

// FuzzDecodeFast: for any bytes, the fast path accepts nothing arrow-go's
// path refuses, and Decode (either path) gives arrow-go's path's result.
// Every input is checked with the seed layouts' schemas known, so that
// mutations of a seed's record batch go through the fast path.
func FuzzDecodeFast(f *testing.F) {
	r := rand.New(rand.NewPCG(9, 10))
	var seeds [][]byte
	for _, s := range shapes[:4] {
		b, err := Encode(s.n, shapeTensors(r, s.n, s.widths))
		if err != nil {
			f.Fatal(err)
		}
		seeds = append(seeds, b)
		f.Add(b)
	}
	ref, err := encodeWithArrow(nil, 2, shapeTensors(r, 2, []int{3, 1}))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(ref)
	f.Add(bytes.Clone(seeds[0][:len(seeds[0])-8]))
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, s := range seeds {
			if _, _, err := Decode(s); err != nil {
				t.Fatal(err)
			}
		}
		checkFastAgainstSlow(t, bytes.Clone(b))
	})
}

// FuzzDecodeFastFields: the record batch's numbers (rows, bodyLength,
// each node's length and null count, each buffer's offset and length) set
// to any values, two at a time, in a frame at any alignment, with bytes
// after it: the fast path accepts nothing arrow-go's path refuses, and
// every result is arrow-go's path's.
func FuzzDecodeFastFields(f *testing.F) {
	r := rand.New(rand.NewPCG(11, 12))
	var frames [][]byte
	var slots [][]int
	for _, s := range shapes[:5] {
		b, err := Encode(s.n, shapeTensors(r, s.n, s.widths))
		if err != nil {
			f.Fatal(err)
		}
		at := locateBatch(f, b)
		sl := []int{at.rows, at.bodyLength}
		for i := range at.nNodes {
			sl = append(sl, at.nodes+16*i, at.nodes+16*i+8)
		}
		for i := range at.nBufs {
			sl = append(sl, at.bufs+16*i, at.bufs+16*i+8)
		}
		frames, slots = append(frames, b), append(slots, sl)
	}
	for _, s := range contextShapes[1:5] {
		b, err := Encode(s.n, contextTensors(r, s.n, s.widths, s.ctx))
		if err != nil {
			f.Fatal(err)
		}
		at := locateBatch(f, b)
		sl := []int{at.rows, at.bodyLength}
		for i := range at.nNodes {
			sl = append(sl, at.nodes+16*i, at.nodes+16*i+8)
		}
		for i := range at.nBufs {
			sl = append(sl, at.bufs+16*i, at.bufs+16*i+8)
		}
		frames, slots = append(frames, b), append(slots, sl)
	}
	f.Add(uint8(0), uint8(0), int64(1), uint8(0), int64(1), uint8(0), []byte{})
	f.Add(uint8(1), uint8(2), int64(3), uint8(5), int64(0), uint8(2), []byte{0, 0, 0, 0})
	f.Add(uint8(2), uint8(8), int64(-1), uint8(9), int64(1<<40), uint8(4), []byte{0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 1})
	f.Fuzz(func(t *testing.T, frame, s1 uint8, v1 int64, s2 uint8, v2 int64, shift uint8, tail []byte) {
		k := int(frame) % len(frames)
		b, sl := frames[k], slots[k]
		if _, _, err := Decode(b); err != nil { // its schema known
			t.Fatal(err)
		}
		end := locateBatch(t, b).end
		c := append(bytes.Clone(b[:end]), tail...)
		if p := sl[int(s1)%len(sl)]; p >= 0 {
			binary.LittleEndian.PutUint64(c[p:], uint64(v1))
		}
		if p := sl[int(s2)%len(sl)]; p >= 0 {
			binary.LittleEndian.PutUint64(c[p:], uint64(v2))
		}
		checkFastAgainstSlow(t, shifted(c, int(shift%8)))
	})
}

// BenchmarkDecodeArrow270 is BenchmarkDecode270 through arrow-go's path
// only: the baseline of the fast path.
func BenchmarkDecodeArrow270(b *testing.B) {
	buf, _ := Encode(270, dlrmCut(270))
	b.SetBytes(int64(len(buf)))
	for b.Loop() {
		if _, _, err := decodeWithArrow(buf); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDecode270Unaligned is BenchmarkDecode270 on a frame 2 bytes
// past a 4-byte boundary, where the dense tier's ScoreRequest usually
// leaves it (after the model name and the small fields).
func BenchmarkDecode270Unaligned(b *testing.B) {
	frame, _ := Encode(270, dlrmCut(270))
	buf := shifted(frame, 2)
	b.SetBytes(int64(len(buf)))
	for b.Loop() {
		if _, _, err := Decode(buf); err != nil {
			b.Fatal(err)
		}
	}
}
