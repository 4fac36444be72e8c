package router

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"

	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/prism-serve/prism/api/prismv1"
)

// OpenAPIPath is where the HTTP/JSON endpoint serves its OpenAPI
// document (OpenAPI), for API gateways, client generators and Swagger
// UI; docs/openapi.json is the same document, committed.
const OpenAPIPath = "/v1/openapi.json"

// OpenAPI is the OpenAPI 3.1 document of the HTTP/JSON endpoint
// (serve router --http-addr), made from the messages' descriptors as
// protojson reads and writes them, so it cannot drift from what the
// endpoint takes: lowerCamelCase names (protojson takes the .proto's
// too), int64s as strings (numbers are taken too), floats as numbers
// (or "NaN", "Infinity", "-Infinity"), the deadline header, the error
// body and its HTTP statuses, and the two ways to authenticate.
func OpenAPI() []byte {
	schemas := map[string]any{}
	var add func(md protoreflect.MessageDescriptor)
	add = func(md protoreflect.MessageDescriptor) {
		name := string(md.Name())
		if _, ok := schemas[name]; ok {
			return
		}
		props := map[string]any{}
		schemas[name] = map[string]any{"type": "object", "additionalProperties": false, "properties": props}
		fields := md.Fields()
		for i := range fields.Len() {
			f := fields.Get(i)
			var s map[string]any
			switch f.Kind() {
			case protoreflect.StringKind:
				s = map[string]any{"type": "string"}
			case protoreflect.BytesKind:
				s = map[string]any{"type": "string", "contentEncoding": "base64"}
			case protoreflect.BoolKind:
				s = map[string]any{"type": "boolean"}
			case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
				s = map[string]any{"type": "integer", "format": "int32"}
			case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
				s = map[string]any{"type": []string{"string", "integer"}, "format": "int64", "pattern": `^-?[0-9]+$`}
			case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
				s = map[string]any{"type": "integer", "format": "uint32", "minimum": 0}
			case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
				s = map[string]any{"type": []string{"string", "integer"}, "format": "uint64", "pattern": `^[0-9]+$`}
			case protoreflect.FloatKind, protoreflect.DoubleKind:
				format := "float"
				if f.Kind() == protoreflect.DoubleKind {
					format = "double"
				}
				s = map[string]any{"oneOf": []any{map[string]any{"type": "number", "format": format}, map[string]any{"type": "string", "enum": []string{"NaN", "Infinity", "-Infinity"}}}}
			case protoreflect.EnumKind:
				var names []string
				vals := f.Enum().Values()
				for j := range vals.Len() {
					names = append(names, string(vals.Get(j).Name()))
				}
				s = map[string]any{"type": "string", "enum": names}
			case protoreflect.MessageKind, protoreflect.GroupKind:
				add(f.Message())
				s = map[string]any{"$ref": "#/components/schemas/" + string(f.Message().Name())}
			default:
				panic(fmt.Sprintf("openapi: field %s of kind %s", f.FullName(), f.Kind()))
			}
			if f.IsList() {
				s = map[string]any{"type": "array", "items": s}
			}
			props[f.JSONName()] = s
		}
	}
	add((&prismv1.RecommendRequest{}).ProtoReflect().Descriptor())
	add((&prismv1.RecommendResponse{}).ProtoReflect().Descriptor())
	schemas["Error"] = map[string]any{
		"type": "object", "required": []string{"code", "message"},
		"properties": map[string]any{
			"code":    map[string]any{"type": "string", "description": "the gRPC status code's google.rpc.Code name, e.g. RESOURCE_EXHAUSTED"},
			"message": map[string]any{"type": "string"},
		},
	}
	errResp := func(why string) map[string]any {
		return map[string]any{"description": why, "content": map[string]any{"application/json": map[string]any{"schema": map[string]any{"$ref": "#/components/schemas/Error"}}}}
	}
	responses := map[string]any{
		"200": map[string]any{"description": "the candidates' scores", "content": map[string]any{"application/json": map[string]any{"schema": map[string]any{"$ref": "#/components/schemas/RecommendResponse"}}}},
	}
	for _, r := range []struct {
		status int
		why    string
	}{
		{400, "INVALID_ARGUMENT: a bad request, malformed JSON, an unknown field, a bad timeout"},
		{401, "UNAUTHENTICATED: no client certificate and no (right) bearer token"},
		{403, "PERMISSION_DENIED: a certificate without a Prism role"},
		{404, "NOT_FOUND: a model, version or content no worker serves"},
		{408, "DEADLINE_EXCEEDED: the body did not arrive before the call's deadline"},
		{413, "RESOURCE_EXHAUSTED: a body over the router's --max-message-bytes"},
		{415, "INVALID_ARGUMENT: a Content-Type other than application/json"},
		{429, "RESOURCE_EXHAUSTED: overload; Retry-After and X-Prism-Retry-Pushback-Ms say when to retry (-1: do not)"},
		{499, "CANCELLED: the client went away"},
		{503, "UNAVAILABLE: no worker right now; retry"},
		{504, "DEADLINE_EXCEEDED: the deadline passed"},
	} {
		responses[fmt.Sprint(r.status)] = errResp(r.why)
	}
	responses["default"] = errResp("another gRPC status, by google.rpc.Code's HTTP mapping")
	doc := map[string]any{
		"openapi": "3.1.0",
		"info": map[string]any{
			"title":       "Prism Recommend over HTTP/JSON",
			"version":     "v1",
			"description": "The router's Recommend (prism.v1.Recommender/Recommend) over HTTP/JSON, as prism serve router --http-addr serves it. Bodies are the proto3 JSON of api/prismv1/recommend.proto (protojson): field names in lowerCamelCase or as in the .proto, int64s as strings or numbers. Generated from the messages' descriptors (router.OpenAPI).",
		},
		"paths": map[string]any{
			"/v1/recommend": map[string]any{
				"post": map[string]any{
					"operationId": "recommend",
					"summary":     "Score a request's candidates",
					"parameters": []any{
						map[string]any{"name": "X-Prism-Timeout", "in": "header", "required": false, "description": "the call's deadline, a Go duration (200ms, 1.5s); else the router's --default-timeout", "schema": map[string]any{"type": "string"}},
						map[string]any{"name": "timeout", "in": "query", "required": false, "description": "as X-Prism-Timeout; with both, the shorter", "schema": map[string]any{"type": "string"}},
						map[string]any{"name": "traceparent", "in": "header", "required": false, "description": "a W3C trace context: the call continues the caller's trace", "schema": map[string]any{"type": "string"}},
					},
					"requestBody": map[string]any{"required": true, "content": map[string]any{"application/json": map[string]any{"schema": map[string]any{"$ref": "#/components/schemas/RecommendRequest"}}}},
					"responses":   responses,
					"security":    []any{map[string]any{"mutualTLS": []string{}}, map[string]any{"bearer": []string{}}},
				},
			},
			"/healthz": healthPath("200 while the router runs"),
			"/readyz":  healthPath("200 while the router serves (workers of both tiers announced, not draining), 503 otherwise"),
		},
		"components": map[string]any{
			"schemas": schemas,
			"securitySchemes": map[string]any{
				"mutualTLS": map[string]any{"type": "mutualTLS", "description": "a client certificate the cluster's CA signed, carrying a Prism role (prism certs init's admin/)"},
				"bearer":    map[string]any{"type": "http", "scheme": "bearer", "description": "the token of the router's --auth-token-file"},
			},
		},
	}
	b, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		panic(err)
	}
	return append(b, '\n')
}

func healthPath(ok string) map[string]any {
	return map[string]any{"get": map[string]any{
		"summary": ok, "security": []any{},
		"responses": map[string]any{
			"200": map[string]any{"description": "ok", "content": map[string]any{"text/plain": map[string]any{"schema": map[string]any{"type": "string"}}}},
			"503": map[string]any{"description": "not serving", "content": map[string]any{"text/plain": map[string]any{"schema": map[string]any{"type": "string"}}}},
		},
	}}
}

// OpenAPIHandler serves OpenAPI (GET or HEAD) at OpenAPIPath
// (serve.Server.HandleHTTP): without a certificate or token, as the
// health checks, since it says only what the API's shape is.
func OpenAPIHandler() http.Handler {
	doc := OpenAPI()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !slices.Contains([]string{http.MethodGet, http.MethodHead}, r.Method) {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "GET or HEAD", http.StatusMethodNotAllowed)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		if r.Method == http.MethodGet {
			_, _ = w.Write(doc)
		}
	})
}
