package router

import (
	"context"
	"strconv"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/internal/serve"
)

// DecodeRecommendJSON decodes a RecommendRequest in protojson, the body
// of an HTTP/JSON Recommend (serve --http-addr). protojson reads a
// repeated field value by value through reflection: 5.5 ms of the
// router's CPU for a request of 270 dlrm-kaggle candidates (11,000
// numbers), where the gRPC path decodes the same request in about a
// tenth of a millisecond (BenchmarkRecommendFront). Its common form,
// what protojson itself and `prism loadgen --print-request` write
// (known fields by either name, numbers, int64s as quoted digits,
// strings without escapes), is read here directly; anything else (an
// escape, a null, a quoted float such as "NaN", an exponent in an id,
// a duplicate or unknown field, malformed JSON) goes to protojson
// whole, which reads it as it always did, or says what is wrong. What
// this reader accepts it decodes as protojson does
// (FuzzDecodeRecommendJSON).
func DecodeRecommendJSON(b []byte) (*prismv1.RecommendRequest, error) {
	s := jsonScan{b: b}
	if req, ok := s.request(); ok {
		return req, nil
	}
	req := new(prismv1.RecommendRequest)
	if err := protojson.Unmarshal(b, req); err != nil {
		return nil, err
	}
	return req, nil
}

// jsonScan reads the common form of a RecommendRequest in JSON; each
// method reports false where it meets anything else, and the caller
// leaves the body to protojson.
type jsonScan struct {
	b []byte
	i int
}

func (s *jsonScan) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

// next skips white space and takes c.
func (s *jsonScan) next(c byte) bool {
	s.ws()
	if s.i < len(s.b) && s.b[s.i] == c {
		s.i++
		return true
	}
	return false
}

// peek skips white space and says whether c is next, without taking it.
func (s *jsonScan) peek(c byte) bool {
	s.ws()
	return s.i < len(s.b) && s.b[s.i] == c
}

// str reads a string without escapes or control characters, valid
// UTF-8.
func (s *jsonScan) str() (string, bool) {
	if !s.next('"') {
		return "", false
	}
	start := s.i
	for s.i < len(s.b) {
		c := s.b[s.i]
		switch {
		case c == '"':
			v := s.b[start:s.i]
			s.i++
			if !utf8.Valid(v) {
				return "", false
			}
			return string(v), true
		case c == '\\' || c < 0x20:
			return "", false
		}
		s.i++
	}
	return "", false
}

// digits reads [-](0|[1-9][0-9]*) at s.i, the whole of an integer,
// and returns it (nil if there is none).
func (s *jsonScan) digits() []byte {
	start := s.i
	if s.i < len(s.b) && s.b[s.i] == '-' {
		s.i++
	}
	d := s.i
	if !s.someDigits() || s.b[d] == '0' && s.i-d > 1 {
		return nil
	}
	return s.b[start:s.i]
}

// someDigits reads a run of decimal digits and says whether it held one.
func (s *jsonScan) someDigits() bool {
	d := s.i
	for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
		s.i++
	}
	return s.i > d
}

// integer reads an integer of bits bits, a number or quoted: an
// exponent or a fraction (which protojson takes when the value is
// whole) is left to protojson.
func (s *jsonScan) integer(bits int) (int64, bool) {
	s.ws()
	quoted := s.i < len(s.b) && s.b[s.i] == '"'
	if quoted {
		s.i++
	}
	d := s.digits()
	if d == nil {
		return 0, false
	}
	if quoted {
		// The closing quote right after the digits: white space inside
		// the quotes ("3 ") is not a number to protojson, and a raw
		// control character there not JSON at all.
		if s.i >= len(s.b) || s.b[s.i] != '"' {
			return 0, false
		}
		s.i++
	}
	if !quoted && s.i < len(s.b) && (s.b[s.i] == '.' || s.b[s.i] == 'e' || s.b[s.i] == 'E') {
		return 0, false
	}
	v, err := strconv.ParseInt(string(d), 10, bits)
	return v, err == nil
}

// float32 reads a JSON number as a float32 (a quoted one, "NaN" and
// the infinities included, is left to protojson, as is one past
// float32's range).
func (s *jsonScan) float32() (float32, bool) {
	s.ws()
	start := s.i
	if s.digits() == nil {
		return 0, false
	}
	if s.i < len(s.b) && s.b[s.i] == '.' {
		s.i++
		if !s.someDigits() {
			return 0, false
		}
	}
	if s.i < len(s.b) && (s.b[s.i] == 'e' || s.b[s.i] == 'E') {
		s.i++
		if s.i < len(s.b) && (s.b[s.i] == '+' || s.b[s.i] == '-') {
			s.i++
		}
		if !s.someDigits() {
			return 0, false
		}
	}
	v, err := strconv.ParseFloat(string(s.b[start:s.i]), 32)
	return float32(v), err == nil
}

// array reads a JSON array, calling elem for each element.
func (s *jsonScan) array(elem func() bool) bool {
	if !s.next('[') {
		return false
	}
	if s.next(']') {
		return true
	}
	for {
		if !elem() {
			return false
		}
		if s.next(']') {
			return true
		}
		if !s.next(',') {
			return false
		}
	}
}

// object reads a JSON object, calling field with each key (the value
// is next); no key may name a field twice (protojson refuses that):
// field returns the field's number, 0 for one it does not know.
func (s *jsonScan) object(field func(key string) int) bool {
	if !s.next('{') {
		return false
	}
	if s.next('}') {
		return true
	}
	var seen uint32
	for {
		k, ok := s.str()
		if !ok || !s.next(':') || s.peek('n') { // null: protojson's
			return false
		}
		n := field(k)
		if n <= 0 || n >= 32 || seen&(1<<n) != 0 {
			return false
		}
		seen |= 1 << n
		if s.next('}') {
			return true
		}
		if !s.next(',') {
			return false
		}
	}
}

func (s *jsonScan) request() (*prismv1.RecommendRequest, bool) {
	req := new(prismv1.RecommendRequest)
	ok := s.object(func(key string) int {
		var good bool
		switch key {
		case "model":
			req.Model, good = s.str()
			return fieldIf(good, 1)
		case "version":
			req.Version, good = s.integer(64)
			return fieldIf(good, 2)
		case "context":
			req.Context, good = s.features()
			return fieldIf(good, 3)
		case "numCandidates", "num_candidates":
			var n int64
			n, good = s.integer(32)
			req.NumCandidates = int32(n)
			return fieldIf(good, 4)
		case "candidates":
			req.Candidates, good = s.features()
			return fieldIf(good, 5)
		case "requestId", "request_id":
			req.RequestId, good = s.str()
			return fieldIf(good, 6)
		case "content":
			req.Content, good = s.str()
			return fieldIf(good, 7)
		}
		return 0
	})
	s.ws()
	return req, ok && s.i == len(s.b)
}

func fieldIf(ok bool, n int) int {
	if !ok {
		return 0
	}
	return n
}

func (s *jsonScan) features() (*prismv1.Features, bool) {
	f := new(prismv1.Features)
	ok := s.object(func(key string) int {
		if key != "inputs" {
			return 0
		}
		return fieldIf(s.array(func() bool {
			in, ok := s.input()
			f.Inputs = append(f.Inputs, in)
			return ok
		}), 1)
	})
	return f, ok
}

func (s *jsonScan) input() (*prismv1.Input, bool) {
	in := new(prismv1.Input)
	floats := func(dst *[]float32) bool {
		return s.array(func() bool {
			v, ok := s.float32()
			*dst = append(*dst, v)
			return ok
		})
	}
	ok := s.object(func(key string) int {
		var good bool
		switch key {
		case "name":
			in.Name, good = s.str()
			return fieldIf(good, 1)
		case "values":
			return fieldIf(floats(&in.Values), 2)
		case "ids":
			return fieldIf(s.array(func() bool {
				v, ok := s.integer(64)
				in.Ids = append(in.Ids, v)
				return ok
			}), 3)
		case "weights":
			return fieldIf(floats(&in.Weights), 4)
		}
		return 0
	})
	return in, ok
}

// RecommendJSONRoute is Recommend's route on the HTTP/JSON endpoint
// (serve.Server.HandleJSON, serve router --http-addr): POST
// /v1/recommend, decoded by DecodeRecommendJSON, served by Recommend in
// process.
func (r *Router) RecommendJSONRoute() serve.JSONRoute {
	return serve.JSONRoute{
		Path:       "/v1/recommend",
		FullMethod: prismv1.Recommender_Recommend_FullMethodName,
		New:        func() proto.Message { return new(prismv1.RecommendRequest) },
		Decode:     func(b []byte) (proto.Message, error) { return DecodeRecommendJSON(b) },
		Call: func(ctx context.Context, req proto.Message) (proto.Message, error) {
			return r.Recommend(ctx, req.(*prismv1.RecommendRequest))
		},
		DefaultTimeout: r.opts.DefaultTimeout,
	}
}
