package loadgen

import (
	"context"
	"fmt"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/encoding/protowire"

	"github.com/prism-serve/prism/api/prismv1"
)

// Premarshaled is one send of a pooled request in wire form: the pooled
// request, marshaled once when the pool was built without its request
// id, then this send's request_id field. The request id is the message's
// highest field, so the two parts are the bytes proto.Marshal would give
// for Req (and any protobuf parser reads appended fields regardless).
// A pool built for HTTP/JSON (RequestOptions.PoolJSON) holds the
// request in protojson instead: the pooled request without its request
// id and closing brace, then this send's "requestId" and the brace, the
// bytes protojson.Marshal gives for Req (newPremarshaledJSON).
type Premarshaled struct {
	// Req is the message the bytes encode, its request id included.
	Req  *prismv1.RecommendRequest
	body []byte // shared by every send of the pooled entry: read only
	id   []byte // request_id: tag, length and value (protojson: its member and the brace)
	json bool   // body and id are protojson, for an HTTPSender
}

// Bytes returns the encoded request as one slice (a copy; for tests).
func (p *Premarshaled) Bytes() []byte {
	return append(append([]byte(nil), p.body...), p.id...)
}

// requestIDField is the field number of RecommendRequest.request_id.
var requestIDField = (&prismv1.RecommendRequest{}).ProtoReflect().Descriptor().Fields().ByName("request_id").Number()

// newPremarshaled wraps req, whose other fields body encodes.
func newPremarshaled(req *prismv1.RecommendRequest, body []byte) *Premarshaled {
	p := &Premarshaled{Req: req, body: body}
	if req.RequestId != "" { // proto3 leaves an empty string out
		p.id = make([]byte, 0, len(req.RequestId)+2+protowire.SizeVarint(uint64(len(req.RequestId))))
		p.id = protowire.AppendString(protowire.AppendTag(p.id, requestIDField, protowire.BytesType), req.RequestId)
	}
	return p
}

// PremarshaledSender is a Sender that can send a pooled request as it
// was marshaled when the pool was built. The runner uses it when the
// request stream has a pool.
type PremarshaledSender interface {
	Sender
	SendPremarshaled(ctx context.Context, p *Premarshaled) error
}

var _ PremarshaledSender = GRPCSender{}

// SendPremarshaled sends p's bytes through Conn with premarshaledCodec,
// or, with no Conn (or p in protojson), marshals p.Req as Send does.
func (g GRPCSender) SendPremarshaled(ctx context.Context, p *Premarshaled) error {
	if g.Conn == nil || p.json {
		return g.Send(ctx, p.Req)
	}
	resp := new(prismv1.RecommendResponse)
	var tr metadata.MD
	// The options of the generated client's Recommend, plus the codec
	// and the trailer (a retrying run reads the server's pushback).
	if err := g.Conn.Invoke(ctx, prismv1.Recommender_Recommend_FullMethodName, p, resp, grpc.StaticMethod(), premarshaledCall(), grpc.Trailer(&tr)); err != nil {
		return withPushback(err, tr)
	}
	return checkScores(resp, p.Req)
}

// premarshaledCodec is gRPC's proto codec that passes a *Premarshaled
// through as its bytes, without copying them; every other message (the
// response too) goes to the proto codec. Its name is the proto codec's,
// so the server decodes the request with its own proto codec.
type premarshaledCodec struct{ proto encoding.CodecV2 }

func (c premarshaledCodec) Marshal(v any) (mem.BufferSlice, error) {
	if p, ok := v.(*Premarshaled); ok {
		// SliceBuffer's Free is a no-op: gRPC freeing the slice after the
		// write leaves the shared body alone.
		if len(p.id) == 0 {
			return mem.BufferSlice{mem.SliceBuffer(p.body)}, nil
		}
		return mem.BufferSlice{mem.SliceBuffer(p.body), mem.SliceBuffer(p.id)}, nil
	}
	return c.proto.Marshal(v)
}

func (c premarshaledCodec) Unmarshal(data mem.BufferSlice, v any) error {
	if _, ok := v.(*Premarshaled); ok {
		return fmt.Errorf("loadgen: a premarshaled request cannot be unmarshaled into")
	}
	return c.proto.Unmarshal(data, v)
}

func (premarshaledCodec) Name() string { return "proto" }

// premarshaledCall is the call option that installs premarshaledCodec.
// ForceCodecV2 makes the codec's name the content-subtype, so these calls
// go out as application/grpc+proto rather than application/grpc: the
// same protobuf codec on the server, by the gRPC protocol's definition.
var premarshaledCall = sync.OnceValue(func() grpc.CallOption {
	c := encoding.GetCodecV2("proto")
	if c == nil {
		panic("loadgen: gRPC's proto codec is not registered")
	}
	return grpc.ForceCodecV2(premarshaledCodec{proto: c})
})
