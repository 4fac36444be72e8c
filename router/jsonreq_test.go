package router

import (
	"math"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/prism-serve/prism/api/prismv1"
)

// jsonForms are RecommendRequest bodies in the forms callers write:
// protojson's own (int64s quoted, lowerCamel names), the .proto names,
// numbers for int64s, white space, empty parts; and forms the fast
// reader leaves to protojson (escapes, nulls, quoted floats, exponents
// in ids, duplicates, unknown fields, malformed JSON).
var jsonForms = []struct {
	name, body string
	fast       bool // the fast reader takes it (else protojson decides)
}{
	{"protojson's", `{"model":"m","numCandidates":2,"candidates":{"inputs":[{"name":"cat_0","ids":["1","22"]},{"name":"dense","values":[0.5,-1.25e-3]}]},"requestId":"r"}`, true},
	{"proto names, numbers", `{"model":"m","num_candidates":2,"candidates":{"inputs":[{"name":"cat_0","ids":[1,-22]}]},"request_id":"r","version":"3","content":"abc"}`, true},
	{"white space", " {\n\t\"model\" : \"m\" ,\r\n \"context\" : { \"inputs\" : [ { \"name\" : \"u\" , \"ids\" : [ 7 ] , \"weights\" : [ 1 , 2.5 ] } ] } } \n", true},
	{"empty parts", `{"context":{},"candidates":{"inputs":[]},"model":"","numCandidates":0}`, true},
	{"empty", `{}`, true},
	{"int64 limits", `{"version":"9223372036854775807","candidates":{"inputs":[{"ids":["-9223372036854775808",0]}]}}`, true},
	{"float forms", `{"candidates":{"inputs":[{"values":[0,-0,1E3,1e+2,2.5E-2,3.4028235e38,1e-46]}]}}`, true},
	{"unicode", `{"model":"modèle ✓"}`, true},
	// What JSON.stringify (Node) and json.dumps (Python) write.
	{"Node's numbers", `{"model":"m","num_candidates":2,"candidates":{"inputs":[{"name":"dense","values":[1e-7,1.5e+21,0.1,-0,5e-324,123456789012]},{"name":"cat_0","ids":[9007199254740991,0]}]},"request_id":"a"}`, true},
	{"Python's numbers", `{"model": "m", "candidates": {"inputs": [{"name": "dense", "values": [1e-07, 0.30000000000000004, 2.5e+38]}]}}`, true},
	{"escape", `{"model":"m\u00e8"}`, false},
	{"null", `{"model":null}`, false},
	{"quoted NaN", `{"candidates":{"inputs":[{"values":["NaN",1]}]}}`, false},
	{"quoted float", `{"candidates":{"inputs":[{"values":["1.5"]}]}}`, false},
	{"id with exponent", `{"candidates":{"inputs":[{"ids":[1e2]}]}}`, false},
	{"id with fraction", `{"candidates":{"inputs":[{"ids":[3.0]}]}}`, false},
	{"id spaced in quotes", `{"candidates":{"inputs":[{"ids":[" 3"]}]}}`, false},
	{"id spaced before its closing quote", `{"candidates":{"inputs":[{"ids":["3 "]}]}}`, false},
	{"version with a newline in its quotes", "{\"version\":\"3\n\"}", false},
	{"leading zero", `{"numCandidates":012}`, false},
	{"int32 overflow", `{"numCandidates":2147483648}`, false},
	{"int64 overflow", `{"version":"9223372036854775808"}`, false},
	{"float32 overflow", `{"candidates":{"inputs":[{"values":[3.5e38]}]}}`, false},
	{"duplicate by two names", `{"numCandidates":1,"num_candidates":2}`, false},
	{"duplicate", `{"model":"a","model":"b"}`, false},
	{"unknown field", `{"model":"m","extra":1}`, false},
	{"trailing comma", `{"model":"m",}`, false},
	{"trailing content", `{"model":"m"} x`, false},
	{"truncated", `{"candidates":{"inputs":[{"ids":[1,2`, false},
	{"invalid UTF-8", "{\"model\":\"\xff\"}", false},
	{"control character", "{\"model\":\"a\tb\"}", false},
	{"bare minus", `{"candidates":{"inputs":[{"values":[-]}]}}`, false},
	{"dot without digits", `{"candidates":{"inputs":[{"values":[1.]}]}}`, false},
	{"not an object", `[]`, false},
}

// TestDecodeRecommendJSON: the fast reader takes the forms callers
// write and decodes them as protojson does; every other form goes to
// protojson, so an answer (or its error) is protojson's.
func TestDecodeRecommendJSON(t *testing.T) {
	for _, c := range jsonForms {
		t.Run(c.name, func(t *testing.T) {
			s := jsonScan{b: []byte(c.body)}
			fast, ok := s.request()
			if ok != c.fast {
				t.Errorf("fast reader took it: %v, want %v", ok, c.fast)
			}
			want := new(prismv1.RecommendRequest)
			werr := protojson.Unmarshal([]byte(c.body), want)
			if ok {
				if werr != nil {
					t.Fatalf("the fast reader took a body protojson refuses (%v)", werr)
				}
				if !proto.Equal(fast, want) {
					t.Fatalf("fast %v\nprotojson %v", fast, want)
				}
			}
			got, err := DecodeRecommendJSON([]byte(c.body))
			if (err != nil) != (werr != nil) || err == nil && !proto.Equal(got, want) {
				t.Fatalf("DecodeRecommendJSON = %v, %v; protojson %v, %v", got, err, want, werr)
			}
		})
	}
	// The loadgen's form of a full request.
	body, _ := protojson.Marshal(kaggleRequest(270))
	s := jsonScan{b: body}
	if got, ok := s.request(); !ok || !proto.Equal(got, kaggleRequest(270)) {
		t.Fatalf("a protojson-written request of 270 candidates: taken %v, equal %v", ok, proto.Equal(got, kaggleRequest(270)))
	}
}

// FuzzDecodeRecommendJSON: whatever the fast reader takes, protojson
// takes too and decodes to the same message.
func FuzzDecodeRecommendJSON(f *testing.F) {
	for _, c := range jsonForms {
		f.Add([]byte(c.body))
	}
	body, _ := protojson.Marshal(kaggleRequest(3))
	f.Add(body)
	f.Fuzz(func(t *testing.T, b []byte) {
		s := jsonScan{b: b}
		fast, ok := s.request()
		if !ok {
			return
		}
		want := new(prismv1.RecommendRequest)
		if err := protojson.Unmarshal(b, want); err != nil {
			t.Fatalf("fast reader took %q, protojson refuses it: %v", b, err)
		}
		if !proto.Equal(fast, want) {
			t.Fatalf("%q: fast %v, protojson %v", b, fast, want)
		}
		for _, in := range append(fast.GetCandidates().GetInputs(), fast.GetContext().GetInputs()...) {
			for _, v := range append(in.GetValues(), in.GetWeights()...) {
				if math.IsNaN(float64(v)) || math.IsInf(float64(v), 0) {
					t.Fatalf("%q: a non-finite value taken", b)
				}
			}
		}
	})
}

// BenchmarkDecodeRecommendJSON: a request of 270 dlrm-kaggle candidates
// as protojson writes it, read by protojson and by the fast reader.
//
//	go test ./router -run '^$' -bench DecodeRecommendJSON -benchtime 200x -count 3
func BenchmarkDecodeRecommendJSON(b *testing.B) {
	body, _ := protojson.Marshal(kaggleRequest(270))
	b.Run("protojson", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if err := protojson.Unmarshal(body, new(prismv1.RecommendRequest)); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("fast", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := DecodeRecommendJSON(body); err != nil {
				b.Fatal(err)
			}
		}
	})
}
