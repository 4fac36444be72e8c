package router

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/prism-serve/prism/api/prismv1"
)

var updateOpenAPI = flag.Bool("update-openapi", false, "rewrite docs/openapi.json from OpenAPI()")

// TestOpenAPIDocument: docs/openapi.json is OpenAPI()'s document (go
// test ./router -run TestOpenAPIDocument -update-openapi rewrites it),
// and what protojson writes for a request and a response (what the
// endpoint takes and answers) conforms to its schemas: every key a
// property of its object, every value of its type.
func TestOpenAPIDocument(t *testing.T) {
	doc := OpenAPI()
	path := filepath.Join("..", "docs", "openapi.json")
	if *updateOpenAPI {
		if err := os.WriteFile(path, doc, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	committed, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(committed, doc) {
		t.Fatalf("%s differs from OpenAPI(): go test ./router -run TestOpenAPIDocument -update-openapi", path)
	}
	var spec struct {
		Paths      map[string]any `json:"paths"`
		Components struct {
			Schemas map[string]any `json:"schemas"`
		} `json:"components"`
	}
	if err := json.Unmarshal(doc, &spec); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"/v1/recommend", "/healthz", "/readyz"} {
		if spec.Paths[p] == nil {
			t.Errorf("no path %s", p)
		}
	}
	req := kaggleRequest(3)
	req.Context = &prismv1.Features{Inputs: []*prismv1.Input{{Name: "u", Ids: []int64{1}, Weights: []float32{0.5}}}}
	req.RequestId, req.Version, req.Content = "r", 7, "c"
	resp := &prismv1.RecommendResponse{Scores: []float32{0.5, 0.25}, Model: "m", Version: 3, RequestId: "r", Content: "c", Tasks: 2, TaskScores: []float32{1, 2}, TaskNames: []string{"ctr", "cvr"},
		Error: &prismv1.RequestError{Code: 5, Message: "x"}}
	for _, c := range []struct {
		schema string
		body   []byte
	}{
		{"RecommendRequest", must(protojson.Marshal(req))},
		{"RecommendRequest", must(protojson.MarshalOptions{UseProtoNames: true}.Marshal(req))},
		{"RecommendResponse", must(protojson.Marshal(resp))},
	} {
		var v any
		if err := json.Unmarshal(c.body, &v); err != nil {
			t.Fatal(err)
		}
		// The .proto's names validate against the lowerCamel schema
		// where they are the same word; snake_case ones are protojson's
		// alternative, mapped here as protojson maps them.
		if err := conforms(spec.Components.Schemas, map[string]any{"$ref": "#/components/schemas/" + c.schema}, v, c.schema); err != "" {
			t.Errorf("%s: %s", c.schema, err)
		}
	}
	// And what it does not take does not conform.
	for _, bad := range []string{`{"model":"m","bogus":1}`, `{"numCandidates":"2"}`, `{"candidates":{"inputs":[{"values":["x"]}]}}`, `{"candidates":[]}`} {
		var v any
		if err := json.Unmarshal([]byte(bad), &v); err != nil {
			t.Fatal(err)
		}
		if conforms(spec.Components.Schemas, map[string]any{"$ref": "#/components/schemas/RecommendRequest"}, v, "RecommendRequest") == "" {
			t.Errorf("%s conforms to RecommendRequest's schema", bad)
		}
	}
}

func must(b []byte, err error) []byte {
	if err != nil {
		panic(err)
	}
	return b
}

// conforms checks v against schema s (the subset OpenAPI() writes:
// $ref, object properties, array items, oneOf, type, enum); "" when it
// conforms, else where and why.
func conforms(schemas map[string]any, s map[string]any, v any, at string) string {
	if ref, ok := s["$ref"].(string); ok {
		return conforms(schemas, schemas[strings.TrimPrefix(ref, "#/components/schemas/")].(map[string]any), v, at)
	}
	if alts, ok := s["oneOf"].([]any); ok {
		for _, a := range alts {
			if conforms(schemas, a.(map[string]any), v, at) == "" {
				return ""
			}
		}
		return at + ": matches no oneOf alternative"
	}
	types := map[string]bool{}
	switch t := s["type"].(type) {
	case string:
		types[t] = true
	case []any:
		for _, x := range t {
			types[x.(string)] = true
		}
	}
	switch v := v.(type) {
	case map[string]any:
		if !types["object"] {
			return at + ": an object where the schema has " + jsonString(s["type"])
		}
		props := s["properties"].(map[string]any)
		for k, x := range v {
			p, ok := props[k]
			if !ok {
				p, ok = props[lowerCamel(k)]
			}
			if !ok {
				return at + ": no property " + k
			}
			if e := conforms(schemas, p.(map[string]any), x, at+"."+k); e != "" {
				return e
			}
		}
	case []any:
		if !types["array"] {
			return at + ": an array where the schema has " + jsonString(s["type"])
		}
		for _, x := range v {
			if e := conforms(schemas, s["items"].(map[string]any), x, at+"[]"); e != "" {
				return e
			}
		}
	case string:
		if !types["string"] {
			return at + ": a string where the schema has " + jsonString(s["type"])
		}
		if enum, ok := s["enum"].([]any); ok && !strings.Contains(jsonString(enum), `"`+v+`"`) {
			return at + ": " + v + " not in " + jsonString(enum)
		}
	case float64:
		if !types["number"] && !types["integer"] {
			return at + ": a number where the schema has " + jsonString(s["type"])
		}
	case bool:
		if !types["boolean"] {
			return at + ": a boolean where the schema has " + jsonString(s["type"])
		}
	}
	return ""
}

func jsonString(v any) string { b, _ := json.Marshal(v); return string(b) }

// lowerCamel is protojson's JSON name of a .proto field name.
func lowerCamel(s string) string {
	var b strings.Builder
	up := false
	for _, r := range s {
		if r == '_' {
			up = true
			continue
		}
		if up {
			r = []rune(strings.ToUpper(string(r)))[0]
			up = false
		}
		b.WriteRune(r)
	}
	return b.String()
}
