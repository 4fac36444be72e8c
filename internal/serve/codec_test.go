package serve

import (
	"bytes"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"
	"unsafe"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/internal/threadcpu"
)

func scoreCases() []*prismv1.ScoreRequest {
	withUnknown := &prismv1.ScoreRequest{Model: "m", Tensors: []byte{1, 2, 3}, NumSamples: 3}
	withUnknown.ProtoReflect().SetUnknown(protowire.AppendVarint(protowire.AppendTag(nil, 99, protowire.VarintType), 7))
	big := make([]byte, 463_000)
	for i := range big {
		big[i] = byte(i * 7)
	}
	return []*prismv1.ScoreRequest{
		{},
		{Model: "dlrm-kaggle", Version: 3, Tensors: big, NumSamples: 270},
		{Model: "x", Version: -1, NumSamples: -5}, // negative int32: ten-byte varint
		{Tensors: []byte{0}},
		{Model: "ünïcode", NumSamples: 1 << 30},
		withUnknown,
		{Model: "m", Tensors: []byte{1, 2}, NumSamples: 2, FanoutKey: "req-7/0/1a2b.3", Shard: 2, Shards: 3},
		{FanoutKey: "ü", Shard: -1, Shards: 1 << 20}, // negative int32: ten-byte varint
		{Model: "m", Tensors: []byte{3}, NumSamples: 1, FanoutKey: "k", Shard: 1, Shards: 2, Sharding: "9f86d081884c7d65", Content: "0123456789abcdef"},
	}
}

func marshalAll(t testing.TB, v any) []byte {
	bs, err := Codec.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return bs.Materialize()
}

// The hand-written ScoreRequest codec and protobuf read each other's bytes.
func TestCodecScoreRoundTrip(t *testing.T) {
	for i, want := range scoreCases() {
		var got prismv1.ScoreRequest
		if err := proto.Unmarshal(marshalAll(t, want), &got); err != nil {
			t.Fatalf("case %d: proto.Unmarshal of Codec's bytes: %v", i, err)
		}
		if !proto.Equal(&got, want) {
			t.Errorf("case %d: Codec -> proto: got %v, want %v", i, &got, want)
		}
		pb, err := proto.Marshal(want)
		if err != nil {
			t.Fatal(err)
		}
		got2 := &prismv1.ScoreRequest{Model: "stale", Tensors: []byte{9}}
		if err := Codec.Unmarshal(mem.BufferSlice{mem.SliceBuffer(pb)}, got2); err != nil {
			t.Fatalf("case %d: Codec.Unmarshal of proto's bytes: %v", i, err)
		}
		if !proto.Equal(got2, want) {
			t.Errorf("case %d: proto -> Codec: got %v, want %v", i, got2, want)
		}
	}
}

// The frame goes to the transport as its own buffer, not copied.
func TestCodecScoreNoCopy(t *testing.T) {
	frame := make([]byte, 1<<16)
	bs, err := Codec.Marshal(&prismv1.ScoreRequest{Model: "m", Tensors: frame, NumSamples: 1})
	if err != nil {
		t.Fatal(err)
	}
	if len(bs) != 2 || &bs[1].ReadOnlyData()[0] != &frame[0] {
		t.Fatalf("tensors were copied (%d buffers)", len(bs))
	}
	// Decoded tensors alias the received bytes (one contiguous buffer).
	wire := bs.Materialize()
	var r prismv1.ScoreRequest
	if err := unmarshalScore(wire, &r); err != nil {
		t.Fatal(err)
	}
	if &r.Tensors[0] != &wire[len(wire)-len(frame)] {
		t.Fatal("decoded tensors do not alias the message")
	}
}

// Other messages go through protobuf unchanged.
func TestCodecOtherMessages(t *testing.T) {
	want := &prismv1.ScoreResponse{Scores: []float32{1, 2.5}, DenseUs: 7}
	b := marshalAll(t, want)
	pb, _ := proto.Marshal(want)
	if !bytes.Equal(b, pb) {
		t.Fatalf("bytes differ from protobuf's")
	}
	var got prismv1.ScoreResponse
	if err := Codec.Unmarshal(mem.BufferSlice{mem.SliceBuffer(b)}, &got); err != nil || !proto.Equal(&got, want) {
		t.Fatalf("got %v, %v", &got, err)
	}
	if Codec.Name() != encoding.GetCodecV2("proto").Name() {
		t.Fatalf("name %q", Codec.Name())
	}
}

// FuzzCodecScoreUnmarshal: on any bytes the hand-written decoder agrees
// with protobuf: both reject, or both accept the same message.
//
// What it accepts, encoded by the hand-written encoder (marshalScore),
// decodes with protobuf to the same message.
func FuzzCodecScoreUnmarshal(f *testing.F) {
	for _, c := range scoreCases() {
		// The large frame cut short: a seed of 463 kB made each mutation
		// and each minimizing step slow (a run spent a minute minimizing
		// one), and the decoder treats a frame of any length alike.
		if len(c.Tensors) > 4096 {
			c.Tensors = c.Tensors[:4096]
		}
		b, _ := proto.Marshal(c)
		f.Add(b)
	}
	f.Add([]byte{0x0a, 0x02, 0xff, 0xfe})       // model: invalid UTF-8
	f.Add([]byte{0x1a, 0x05, 1})                // tensors: truncated
	f.Add([]byte{0x10, 0xff, 0xff, 0xff, 0xff}) // version: truncated varint
	f.Add([]byte{0x0d, 1, 2, 3, 4})             // field 1 as fixed32: unknown
	f.Add([]byte{0x00})                         // field number 0
	f.Add([]byte{0x2a, 0x02, 0xff, 0xfe})       // fanout_key: invalid UTF-8
	f.Add([]byte{0x42, 0x02, 0xff, 0xfe})       // sharding: invalid UTF-8
	f.Add([]byte{0x30, 0xff, 0xff})             // shard: truncated varint
	f.Add([]byte{0x3a, 0x01, 0x07})             // shards as bytes: unknown
	f.Fuzz(func(t *testing.T, b []byte) {
		var want prismv1.ScoreRequest
		werr := proto.Unmarshal(b, &want)
		var got prismv1.ScoreRequest
		gerr := unmarshalScore(append([]byte(nil), b...), &got)
		if (werr == nil) != (gerr == nil) {
			t.Fatalf("protobuf: %v, codec: %v", werr, gerr)
		}
		if werr == nil && !proto.Equal(&got, &want) {
			t.Fatalf("protobuf %v, codec %v", &want, &got)
		}
		// The same through Codec, the message in two pieces.
		var viaCodec prismv1.ScoreRequest
		in := mem.BufferSlice{mem.SliceBuffer(b[:len(b)/2]), mem.SliceBuffer(b[len(b)/2:])}
		cerr := Codec.Unmarshal(in, &viaCodec)
		if (cerr == nil) != (werr == nil) || (werr == nil && !proto.Equal(&viaCodec, &want)) {
			t.Fatalf("protobuf %v (%v), Codec %v (%v)", &want, werr, &viaCodec, cerr)
		}
		if werr != nil {
			return
		}
		var back prismv1.ScoreRequest
		if err := proto.Unmarshal(marshalScore(&got).Materialize(), &back); err != nil || !proto.Equal(&back, &want) {
			t.Fatalf("decoded %v, encoded and decoded again %v (%v)", &want, &back, err)
		}
	})
}

func BenchmarkCodecScoreDecode(b *testing.B) {
	frame := make([]byte, 463_000)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range frame {
		frame[i] = byte(rng.Uint32())
	}
	wire, _ := proto.Marshal(&prismv1.ScoreRequest{Model: "dlrm-kaggle", Tensors: frame, NumSamples: 270})
	in := mem.BufferSlice{mem.SliceBuffer(wire[:len(wire)/2]), mem.SliceBuffer(wire[len(wire)/2:])}
	b.Run("proto", func(b *testing.B) {
		c := encoding.GetCodecV2("proto")
		for b.Loop() {
			var r prismv1.ScoreRequest
			if err := c.Unmarshal(in, &r); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("codec", func(b *testing.B) {
		for b.Loop() {
			var r prismv1.ScoreRequest
			if err := Codec.Unmarshal(in, &r); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// The tensors of a decoded request start 8-aligned, wherever the sender
// put them after the small fields.
func TestCodecScoreAligned(t *testing.T) {
	for _, model := range []string{"", "m", "dlrm-kaggle", "a-much-longer-model-name"} {
		for _, split := range []int{1, 3, 17, 1000} {
			want := &prismv1.ScoreRequest{Model: model, Version: 2, Tensors: make([]byte, 4000), NumSamples: 7}
			for i := range want.Tensors {
				want.Tensors[i] = byte(i)
			}
			wire := marshalAll(t, want)
			in := mem.BufferSlice{mem.SliceBuffer(wire[:split]), mem.SliceBuffer(wire[split:])}
			var got prismv1.ScoreRequest
			if err := Codec.Unmarshal(in, &got); err != nil {
				t.Fatal(err)
			}
			if !proto.Equal(&got, want) {
				t.Fatalf("model %q split %d: decoded %v", model, split, &got)
			}
			if p := uintptr(unsafe.Pointer(&got.Tensors[0])); p%8 != 0 {
				t.Errorf("model %q split %d: tensors at %#x", model, split, p)
			}
		}
	}
}

// The hand-written codec knows ScoreRequest's fields 1-9: a field added
// to the message must be added to the codec too, or it would travel as
// nothing. This fails first.
func TestCodecKnowsEveryScoreField(t *testing.T) {
	fields := (&prismv1.ScoreRequest{}).ProtoReflect().Descriptor().Fields()
	want := map[protowire.Number]string{scoreModel: "model string", scoreVersion: "version int64", scoreTensors: "tensors bytes", scoreNumSamples: "num_samples int32",
		scoreFanoutKey: "fanout_key string", scoreShard: "shard int32", scoreShards: "shards int32", scoreSharding: "sharding string", scoreContent: "content string"}
	if fields.Len() != len(want) {
		t.Fatalf("ScoreRequest has %d fields; serve.Codec encodes %d: update marshalScore/unmarshalScore", fields.Len(), len(want))
	}
	for i := range fields.Len() {
		f := fields.Get(i)
		if got := string(f.Name()) + " " + f.Kind().String(); want[f.Number()] != got || f.Cardinality() == protoreflect.Repeated {
			t.Errorf("field %d is %q, the codec writes %q", f.Number(), got, want[f.Number()])
		}
	}
}

// lookupRequest is a router-to-embedding Lookup of n candidates of 26
// id inputs and 13 dense values, ids below maxID (their varints' size
// sets the message's: under 2^14 two bytes, under 2^21 three).
func lookupRequest(n int, maxID int64) *prismv1.LookupRequest {
	rng := rand.New(rand.NewPCG(3, 4))
	c := &prismv1.Features{}
	dense := make([]float32, 13*n)
	for i := range dense {
		dense[i] = rng.Float32()
	}
	c.Inputs = append(c.Inputs, &prismv1.Input{Name: "dense", Values: dense})
	for t := range 26 {
		ids := make([]int64, n)
		for i := range ids {
			ids[i] = rng.Int64N(maxID)
		}
		c.Inputs = append(c.Inputs, &prismv1.Input{Name: "cat_" + string(rune('a'+t)), Ids: ids})
	}
	return &prismv1.LookupRequest{Model: "dlrm-kaggle", NumSamples: int32(n), Candidates: c, DenseAddr: "127.0.0.1:4000"}
}

// inFrames is b as gRPC's transport hands a received message to the
// codec: in buffers of at most one HTTP/2 data frame (16 KiB).
func inFrames(b []byte) mem.BufferSlice {
	var s mem.BufferSlice
	for len(b) > 0 {
		n := min(len(b), 16<<10)
		s = append(s, mem.SliceBuffer(b[:n]))
		b = b[n:]
	}
	return s
}

// BenchmarkCodecLookup: marshalling a Lookup (the router) and
// unmarshalling it from 16 KiB frames (the embedding worker), gRPC's
// proto codec and Codec in the same loop (thread CPU ns per message,
// both ways), at the load generator's 270 candidates (ids under 2^14:
// 28 KB, as its Zipf ids), with ids under 2^21 (35 KB) and at 700
// candidates (MLPerf DLRMv2's largest, 91 KB).
//
//	go test ./internal/serve -run '^$' -bench CodecLookup -count 6
func BenchmarkCodecLookup(b *testing.B) {
	for _, size := range []struct {
		name  string
		n     int
		maxID int64
	}{{"270", 270, 1 << 14}, {"270-wide", 270, 1 << 21}, {"700", 700, 1 << 21}} {
		req := lookupRequest(size.n, size.maxID)
		wire, err := proto.Marshal(req)
		if err != nil {
			b.Fatal(err)
		}
		in := inFrames(wire)
		b.Run(size.name, func(b *testing.B) {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			codecs := [2]encoding.CodecV2{encoding.GetCodecV2("proto"), Codec}
			var spent [2]time.Duration
			b.SetBytes(int64(len(wire)))
			for b.Loop() {
				for i, c := range codecs {
					t0 := threadcpu.Now()
					bs, err := c.Marshal(req)
					if err != nil {
						b.Fatal(err)
					}
					bs.Free()
					var r prismv1.LookupRequest
					if err := c.Unmarshal(in, &r); err != nil {
						b.Fatal(err)
					}
					spent[i] += threadcpu.Now() - t0
				}
			}
			b.ReportMetric(float64(spent[0])/float64(b.N), "proto-ns/op")
			b.ReportMetric(float64(spent[1])/float64(b.N), "codec-ns/op")
			b.ReportMetric(float64(spent[1])/float64(spent[0]), "ratio")
		})
	}
}

// countingPool is Pool that counts the buffers handed out and back.
type countingPool struct {
	mem.BufferPool
	gets, puts int
}

func (p *countingPool) Get(n int) *[]byte { p.gets++; return p.BufferPool.Get(n) }
func (p *countingPool) Put(b *[]byte)     { p.puts++; p.BufferPool.Put(b) }

// Messages other than ScoreRequest are marshalled into and read from
// Pool's buffers (gRPC's proto codec takes its default pool's, cleared
// on every use: 1 MiB for a message over 32 KiB), and the bytes are
// protobuf's.
func TestCodecProtoBuffersFromPool(t *testing.T) {
	saved := Pool
	defer func() { Pool = saved }()
	for _, n := range []int{1, 270, 700} {
		p := &countingPool{BufferPool: saved}
		Pool = p
		req := lookupRequest(n, 1<<21)
		want, err := proto.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		pooled := 0
		if !mem.IsBelowBufferPoolingThreshold(len(want)) {
			pooled = 1
		}
		bs, err := Codec.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		if got := bs.Materialize(); !bytes.Equal(got, want) {
			t.Fatalf("%d candidates: Codec's bytes differ from protobuf's", n)
		}
		bs.Free()
		if p.gets != pooled || p.puts != pooled {
			t.Errorf("%d candidates (%d bytes): marshal took %d buffers from Pool and gave back %d, want %d", n, len(want), p.gets, p.puts, pooled)
		}
		p.gets, p.puts = 0, 0
		in := inFrames(want)
		var got prismv1.LookupRequest
		if err := Codec.Unmarshal(in, &got); err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(&got, req) {
			t.Fatalf("%d candidates: decoded %d inputs, not the request", n, len(got.GetCandidates().GetInputs()))
		}
		if w := min(len(in)-1, 1); p.gets != w || p.puts != w { // one frame is read in place
			t.Errorf("%d candidates (%d frames): unmarshal took %d buffers from Pool and gave back %d, want %d", n, len(in), p.gets, p.puts, w)
		}
	}
}
