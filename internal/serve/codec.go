package serve

import (
	"errors"
	"unicode/utf8"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	_ "google.golang.org/grpc/encoding/proto" // registers the codec Codec falls back to
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/internal/tracing"
)

// Codec is gRPC's proto codec with one message handled by hand: the
// dense tier's ScoreRequest, whose tensors field is the half-megabyte
// Arrow frame of a micro-batch's cut tensors. Marshalled by protobuf, the
// frame is copied into a fresh message buffer on the embedding tier and
// copied out of the received one on the dense tier; here the frame goes
// to the transport as its own buffer, and the decoded request's tensors
// alias the received bytes. Every other message goes to the proto codec
// unchanged, and the name stays "proto": the wire is standard protobuf,
// and any gRPC client or server interoperates.
//
// Every message's buffers come from Pool, not from gRPC's default pool,
// which the proto codec uses whatever pool the connection has: that one
// clears each buffer's whole capacity when it hands it out, and its tier
// above 32 KiB is 1 MiB, so a Lookup of 270 candidates with ids of three
// bytes or more (35 KB), or of 700 candidates (90 KB), had 1 MiB cleared
// on the router to marshal it and on the embedding worker to read it.
var Codec encoding.CodecV2 = scoreCodec{proto: encoding.GetCodecV2("proto")}

type scoreCodec struct{ proto encoding.CodecV2 }

func (scoreCodec) Name() string { return "proto" }

func (c scoreCodec) Marshal(v any) (mem.BufferSlice, error) {
	if r, ok := v.(*prismv1.ScoreRequest); ok {
		return marshalScore(r), nil
	}
	m, ok := v.(proto.Message)
	if !ok {
		return c.proto.Marshal(v)
	}
	// As gRPC's proto codec does, with Pool.
	size := proto.Size(m)
	if mem.IsBelowBufferPoolingThreshold(size) {
		return c.proto.Marshal(v)
	}
	buf := Pool.Get(size)
	out, err := proto.MarshalOptions{UseCachedSize: true}.MarshalAppend((*buf)[:0], m)
	if err != nil {
		Pool.Put(buf)
		return nil, err
	}
	if len(out) != size { // changed since Size: out is the whole message, maybe not in buf
		return mem.BufferSlice{mem.SliceBuffer(out)}, nil
	}
	return mem.BufferSlice{mem.NewBuffer(buf, Pool)}, nil
}

func (c scoreCodec) Unmarshal(data mem.BufferSlice, v any) error {
	if r, ok := v.(*prismv1.ScoreRequest); ok {
		return unmarshalScore(materializeAligned(data), r)
	}
	m, ok := v.(proto.Message)
	if !ok {
		return c.proto.Unmarshal(data, v)
	}
	// As gRPC's proto codec does, with Pool: proto.Unmarshal copies what
	// it keeps, so the buffer goes back once it returns.
	buf := data.MaterializeToBuffer(Pool)
	defer buf.Free()
	return proto.Unmarshal(buf.ReadOnlyData(), m)
}

// materializeAligned copies the message into one new buffer, placed so
// that the tensors field's bytes start 8-aligned: they are read in place
// as float32 (by ONNX Runtime, among others), and after a name and a few
// varints they would otherwise start anywhere. Only the first bytes are
// parsed to find the field; a message whose tensors do not start there
// (another sender's field order) is copied as it is.
func materializeAligned(data mem.BufferSlice) []byte {
	var head [256]byte
	h := head[:0]
	for _, b := range data {
		h = append(h, b.ReadOnlyData()[:min(b.Len(), cap(h)-len(h))]...)
		if len(h) == cap(h) {
			break
		}
	}
	off := tensorsOffset(h)
	if off < 0 {
		return data.Materialize()
	}
	shift := (8 - off%8) % 8
	buf := make([]byte, shift+data.Len())
	data.CopyTo(buf[shift:])
	return buf[shift:]
}

// tensorsOffset is where the tensors field's bytes start in a message
// beginning with h, or -1 if that is not within h.
func tensorsOffset(h []byte) int {
	for pos := 0; pos < len(h); {
		num, typ, n := protowire.ConsumeTag(h[pos:])
		if n < 0 {
			return -1
		}
		pos += n
		if num == scoreTensors && typ == protowire.BytesType {
			_, m := protowire.ConsumeVarint(h[pos:])
			if m < 0 {
				return -1
			}
			return pos + m
		}
		m := protowire.ConsumeFieldValue(num, typ, h[pos:])
		if m < 0 {
			return -1
		}
		pos += m
	}
	return -1
}

// ScoreRequest field numbers (api/prismv1/internal.proto).
const (
	scoreModel      = 1
	scoreVersion    = 2
	scoreTensors    = 3
	scoreNumSamples = 4
	scoreFanoutKey  = 5
	scoreShard      = 6
	scoreShards     = 7
	scoreSharding   = 8
	scoreContent    = 9
)

// marshalScore writes r's small fields and the tensors field's tag and
// length into one buffer and hands the tensors over as a second buffer,
// not copied: the caller must not change r.Tensors until the call that
// sends it has returned successfully (then the peer has read all of it).
// Fields follow protobuf's encoding (proto3: zero values omitted), with
// the tensors last; unknown fields are kept.
func marshalScore(r *prismv1.ScoreRequest) mem.BufferSlice {
	h := make([]byte, 0, 48+len(r.Model)+len(r.FanoutKey)+len(r.Sharding)+len(r.Content))
	if r.Model != "" {
		h = protowire.AppendTag(h, scoreModel, protowire.BytesType)
		h = protowire.AppendString(h, r.Model)
	}
	if r.Version != 0 {
		h = protowire.AppendTag(h, scoreVersion, protowire.VarintType)
		h = protowire.AppendVarint(h, uint64(r.Version))
	}
	if r.NumSamples != 0 {
		h = protowire.AppendTag(h, scoreNumSamples, protowire.VarintType)
		h = protowire.AppendVarint(h, uint64(int64(r.NumSamples))) // int32: sign-extended
	}
	if r.FanoutKey != "" {
		h = protowire.AppendTag(h, scoreFanoutKey, protowire.BytesType)
		h = protowire.AppendString(h, r.FanoutKey)
	}
	if r.Shard != 0 {
		h = protowire.AppendTag(h, scoreShard, protowire.VarintType)
		h = protowire.AppendVarint(h, uint64(int64(r.Shard)))
	}
	if r.Shards != 0 {
		h = protowire.AppendTag(h, scoreShards, protowire.VarintType)
		h = protowire.AppendVarint(h, uint64(int64(r.Shards)))
	}
	if r.Sharding != "" {
		h = protowire.AppendTag(h, scoreSharding, protowire.BytesType)
		h = protowire.AppendString(h, r.Sharding)
	}
	if r.Content != "" {
		h = protowire.AppendTag(h, scoreContent, protowire.BytesType)
		h = protowire.AppendString(h, r.Content)
	}
	h = append(h, r.ProtoReflect().GetUnknown()...)
	if len(r.Tensors) == 0 {
		return mem.BufferSlice{mem.SliceBuffer(h)}
	}
	h = protowire.AppendTag(h, scoreTensors, protowire.BytesType)
	h = protowire.AppendVarint(h, uint64(len(r.Tensors)))
	return mem.BufferSlice{mem.SliceBuffer(h), mem.SliceBuffer(r.Tensors)}
}

var (
	errInvalidUTF8 = errors.New("ScoreRequest.model: invalid UTF-8")
	errInvalidKey  = errors.New("ScoreRequest.fanout_key: invalid UTF-8")
	errInvalidFP   = errors.New("ScoreRequest.sharding: invalid UTF-8")
	errInvalidCont = errors.New("ScoreRequest.content: invalid UTF-8")
	errFieldNumber = errors.New("ScoreRequest: invalid field number")
)

// unmarshalScore decodes b into r as proto.Unmarshal would (r reset
// first; the last of a repeated scalar wins; a known field with another
// wire type is kept as unknown), except that r.Tensors aliases b.
func unmarshalScore(b []byte, r *prismv1.ScoreRequest) error {
	r.Reset()
	var unknown []byte
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		if num > protowire.MaxValidNumber {
			return errFieldNumber
		}
		b = b[n:]
		var err error
		switch {
		case num == scoreModel && typ == protowire.BytesType:
			r.Model, n, err = consumeString(b, errInvalidUTF8)
		case num == scoreVersion && typ == protowire.VarintType:
			var v uint64
			v, n, err = consumeVarint(b)
			r.Version = int64(v)
		case num == scoreTensors && typ == protowire.BytesType:
			v, m := protowire.ConsumeBytes(b)
			if m < 0 {
				return protowire.ParseError(m)
			}
			r.Tensors = v[:len(v):len(v)]
			n = m
		case num == scoreNumSamples && typ == protowire.VarintType:
			var v uint64
			v, n, err = consumeVarint(b)
			r.NumSamples = int32(v)
		case num == scoreFanoutKey && typ == protowire.BytesType:
			r.FanoutKey, n, err = consumeString(b, errInvalidKey)
		case num == scoreShard && typ == protowire.VarintType:
			var v uint64
			v, n, err = consumeVarint(b)
			r.Shard = int32(v)
		case num == scoreShards && typ == protowire.VarintType:
			var v uint64
			v, n, err = consumeVarint(b)
			r.Shards = int32(v)
		case num == scoreSharding && typ == protowire.BytesType:
			r.Sharding, n, err = consumeString(b, errInvalidFP)
		case num == scoreContent && typ == protowire.BytesType:
			r.Content, n, err = consumeString(b, errInvalidCont)
		default:
			m := protowire.ConsumeFieldValue(num, typ, b)
			if m < 0 {
				return protowire.ParseError(m)
			}
			// As protobuf keeps it: the tag re-encoded, the value as sent.
			unknown = protowire.AppendTag(unknown, num, typ)
			unknown = append(unknown, b[:m]...)
			n = m
		}
		if err != nil {
			return err
		}
		b = b[n:]
	}
	if unknown != nil {
		r.ProtoReflect().SetUnknown(unknown)
	}
	return nil
}

// consumeString reads a string field's value: bad if not UTF-8, as
// proto.Unmarshal refuses it.
func consumeString(b []byte, bad error) (string, int, error) {
	v, m := protowire.ConsumeBytes(b)
	if m < 0 {
		return "", 0, protowire.ParseError(m)
	}
	if !utf8.Valid(v) {
		return "", 0, bad
	}
	return string(v), m, nil
}

// consumeVarint reads a varint field's value.
func consumeVarint(b []byte) (uint64, int, error) {
	v, m := protowire.ConsumeVarint(b)
	if m < 0 {
		return 0, 0, protowire.ParseError(m)
	}
	return v, m, nil
}

// ListMessageBytes is what a client of Registry.List takes in one
// answer: the registry of a large fleet (every worker, and per model the
// workers in sync) is past gRPC's default 4 MiB receive limit at about
// 2,000 embedding workers of 16 models, within the registry's bounds,
// and the router sends up to its --max-message-bytes (64 MiB).
const ListMessageBytes = 64 << 20

// ListDialOption lets a connection's calls take answers of up to
// ListMessageBytes: for clients of Registry.List (the loan controller,
// prism up's wait for the workers).
func ListDialOption() grpc.DialOption {
	return grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(ListMessageBytes))
}

// DialOptions are the options of Prism's internal client connections:
// the buffer pool and the codec, and tracing's handler when tracing is
// on. Transport credentials come from the caller (each tier's options).
func DialOptions() []grpc.DialOption {
	return append([]grpc.DialOption{
		experimentalPool(),
		grpc.WithDefaultCallOptions(grpc.ForceCodecV2(Codec)),
	}, tracing.DialOptions()...)
}
