package loadgen

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	rpccode "google.golang.org/genproto/googleapis/rpc/code"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/prism-serve/prism/api/prismv1"
)

// The router's HTTP/JSON endpoint (prism serve router --http-addr;
// internal/serve's TimeoutHeader and PushbackHeader, repeated here so
// the core depends on the public API alone; a test in loadgen/cli keeps
// them equal).
const (
	// RecommendPath is the path of Recommend over HTTP/JSON.
	RecommendPath = "/v1/recommend"
	// TimeoutHeader carries a call's deadline as a Go duration, as
	// grpc-timeout does a gRPC call's.
	TimeoutHeader = "X-Prism-Timeout"
	// PushbackHeader carries an overload refusal's retry pushback in
	// milliseconds, PushbackKey's value over gRPC.
	PushbackHeader = "X-Prism-Retry-Pushback-Ms"
)

// maxResponseBytes bounds an answer's body, as the gRPC connection's
// MaxCallRecvMsgSize bounds its messages.
const maxResponseBytes = 64 << 20

// HTTPSender sends Recommend over HTTP/JSON: POST URL with the request
// in protojson, its deadline (the context's) in TimeoutHeader, the
// outgoing gRPC metadata the run put on the context (--trace-ratio's
// traceparent) as headers. An answer other than 200 is mapped back to
// the gRPC status it stands for (HTTPError), so that a run's errors by
// code, retries, find-max and SLO accounting read it as over gRPC.
type HTTPSender struct {
	// URL is the endpoint: https://HOST:PORT/v1/recommend.
	URL string
	// Client sends the requests (NewHTTPClient).
	Client *http.Client
	// Header is added to every request (the bearer token's
	// Authorization).
	Header http.Header
}

var _ PremarshaledSender = HTTPSender{}

// NewHTTPClient is the client an HTTPSender sends with: HTTP/2 over
// TLS (tlsConf; nil: plain HTTP/1.1), keeping up to conns idle
// connections to the host, enough for the run's concurrent requests
// over HTTP/1.1 (HTTP/2 multiplexes them over one connection as gRPC
// does, opening more when the server's stream limit is reached).
func NewHTTPClient(tlsConf *tls.Config, conns int) *http.Client {
	conns = max(conns, 2)
	return &http.Client{
		Transport: &http.Transport{
			TLSClientConfig:     tlsConf,
			ForceAttemptHTTP2:   true,
			MaxIdleConns:        conns,
			MaxIdleConnsPerHost: conns,
			IdleConnTimeout:     90 * time.Second,
			TLSHandshakeTimeout: 10 * time.Second,
			// What the generator sends is not compressed; asking for a
			// compressed answer would only cost the router CPU.
			DisableCompression: true,
		},
		// A redirect is answered as an error, not followed, as gRPC
		// follows none: followed, the load would go to another server,
		// and Go sends the Authorization header on to the same host
		// over plain http:// too (the bearer token in the clear).
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

func (h HTTPSender) Send(ctx context.Context, req *prismv1.RecommendRequest) error {
	b, err := protojson.Marshal(req)
	if err != nil {
		// As gRPC answers a message it cannot marshal.
		return status.Errorf(codes.Internal, "encode the request as JSON: %v", err)
	}
	return h.post(ctx, req, b, nil)
}

// SendPremarshaled sends a pooled request's protojson body as it was
// encoded when the pool was built (RequestOptions.PoolJSON), its
// request id appended; a request pooled in another form is encoded as
// Send encodes it.
func (h HTTPSender) SendPremarshaled(ctx context.Context, p *Premarshaled) error {
	if !p.json {
		return h.Send(ctx, p.Req)
	}
	return h.post(ctx, p.Req, p.body, p.id)
}

// post sends the body body+tail (tail may be nil) for req.
func (h HTTPSender) post(ctx context.Context, req *prismv1.RecommendRequest, body, tail []byte) error {
	var timeout string
	if dl, ok := ctx.Deadline(); ok {
		left := time.Until(dl).Truncate(time.Microsecond)
		if left <= 0 {
			return status.Error(codes.DeadlineExceeded, "the request's deadline passed before it was sent")
		}
		timeout = left.String()
	}
	newBody := func() io.Reader {
		if tail == nil {
			return bytes.NewReader(body)
		}
		return io.MultiReader(bytes.NewReader(body), bytes.NewReader(tail))
	}
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, h.URL, newBody())
	if err != nil {
		return status.Errorf(codes.Internal, "%v", err)
	}
	// Given, the transport can send the body again on a new connection
	// when the one it picked was closed under it (as gRPC retries a
	// stream the server never saw).
	hr.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(newBody()), nil }
	hr.ContentLength = int64(len(body) + len(tail))
	for k, vs := range h.Header {
		hr.Header[k] = vs
	}
	hr.Header.Set("Content-Type", "application/json")
	if timeout != "" {
		hr.Header.Set(TimeoutHeader, timeout)
	}
	if md, ok := metadata.FromOutgoingContext(ctx); ok {
		for k, vs := range md {
			for _, v := range vs {
				hr.Header.Add(k, v)
			}
		}
	}
	resp, err := h.Client.Do(hr)
	if err != nil {
		if ctx.Err() != nil {
			return status.FromContextError(ctx.Err()).Err()
		}
		// No answer (refused, reset, a failed handshake): what gRPC
		// calls a connection it cannot use.
		return status.Errorf(codes.Unavailable, "%v", err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes+1))
	if err != nil {
		if ctx.Err() != nil {
			return status.FromContextError(ctx.Err()).Err()
		}
		return status.Errorf(codes.Unavailable, "read the answer: %v", err)
	}
	if len(out) > maxResponseBytes {
		return status.Errorf(codes.ResourceExhausted, "answer over %d bytes", maxResponseBytes)
	}
	if resp.StatusCode != http.StatusOK {
		return HTTPError(resp.StatusCode, resp.Header, out)
	}
	n, err := countScores(out)
	if err != nil {
		return status.Errorf(codes.Internal, "answer is not a RecommendResponse in JSON: %v", err)
	}
	if n != int(req.NumCandidates) {
		return status.Errorf(codes.Internal, "%d scores for %d candidates", n, req.NumCandidates)
	}
	return nil
}

// countScores is the number of scores of a RecommendResponse in
// protojson. protojson reads the scores value by value through
// reflection: decoding the whole answer would cost the generator more
// than the count the run checks needs.
func countScores(b []byte) (int, error) {
	var r struct {
		Scores []anyJSON `json:"scores"`
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return 0, err
	}
	return len(r.Scores), nil
}

// anyJSON is a JSON value, checked well formed and not kept: a slice of
// them counts an array's values without storing one (a score protojson
// writes as "NaN" counts too, as over gRPC).
type anyJSON struct{}

func (*anyJSON) UnmarshalJSON([]byte) error { return nil }

// HTTPError is the gRPC status error an HTTP/JSON answer other than 200
// stands for. A JSON body {"code": ..., "message": ...} (the router's,
// google.rpc.Status's) gives its code by name (RESOURCE_EXHAUSTED) or
// number; any other body (a proxy's error page) is mapped by its HTTP
// status as gRPC maps the HTTP status of an answer that is not gRPC's
// (grpc's doc/http-grpc-status-mapping.md: 429, 502, 503, 504
// Unavailable), so that a run through a proxy counts what it would over
// gRPC. The refusal's pushback, PushbackHeader (else Retry-After's
// whole seconds), is kept for a retrying run (Pushback reads it).
func HTTPError(httpStatus int, h http.Header, body []byte) error {
	var e struct {
		Code    json.RawMessage `json:"code"`
		Message string          `json:"message"`
	}
	var err error
	// A body naming OK names no error: an answer other than 200 is one
	// (status.Error of OK is nil, which the run would count a success,
	// and a pushback on it would hold no error), so its HTTP status
	// says which.
	if json.Unmarshal(body, &e) == nil && len(e.Code) > 0 && jsonCode(e.Code) != codes.OK {
		err = status.Error(jsonCode(e.Code), e.Message)
	} else {
		text := strings.TrimSpace(string(body))
		if len(text) > 200 {
			text = text[:200] + "..."
		}
		msg := fmt.Sprintf("HTTP %d %s", httpStatus, http.StatusText(httpStatus))
		if text != "" {
			msg += ": " + text
		}
		err = status.Error(statusCode(httpStatus), msg)
	}
	if v := h.Values(PushbackHeader); len(v) > 0 {
		return &pushbackError{err: err, value: v}
	}
	// Retry-After as whole seconds (an HTTP date is left unread): what a
	// proxy, or a server that sets no pushback header, says.
	if v := h.Values("Retry-After"); len(v) == 1 {
		if s, perr := strconv.Atoi(strings.TrimSpace(v[0])); perr == nil && s >= 0 {
			return &pushbackError{err: err, value: []string{strconv.Itoa(s * 1000)}}
		}
	}
	return err
}

// jsonCode reads google.rpc.Status's code as JSON: a name
// ("RESOURCE_EXHAUSTED", as the router and grpc-gateway write it) or a
// number; anything else is Unknown.
func jsonCode(raw json.RawMessage) codes.Code {
	var name string
	if json.Unmarshal(raw, &name) == nil {
		if c, ok := rpccode.Code_value[name]; ok {
			return codes.Code(c)
		}
		return codes.Unknown
	}
	var n uint32
	if json.Unmarshal(raw, &n) == nil && n <= uint32(codes.Unauthenticated) {
		return codes.Code(n)
	}
	return codes.Unknown
}

// statusCode is the gRPC code of an answer's HTTP status when the body
// says none, as gRPC maps it.
func statusCode(httpStatus int) codes.Code {
	switch httpStatus {
	case http.StatusBadRequest:
		return codes.Internal
	case http.StatusUnauthorized:
		return codes.Unauthenticated
	case http.StatusForbidden:
		return codes.PermissionDenied
	case http.StatusNotFound:
		return codes.Unimplemented
	case http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return codes.Unavailable
	}
	return codes.Unknown
}

// jsonSep is what protojson writes between two fields of a message on
// one line: a comma, and in some binaries a space (protojson varies its
// output by binary so that nobody depends on its bytes; within one
// binary they are stable).
var jsonSep = sync.OnceValue(func() []byte {
	b, err := protojson.Marshal(&prismv1.RecommendRequest{Model: "m", RequestId: "x"})
	if err != nil {
		panic(err)
	}
	i, j := bytes.Index(b, []byte(`"m"`))+3, bytes.Index(b, []byte(`"requestId"`))
	if i < 3 || j < i {
		panic(fmt.Sprintf("loadgen: protojson wrote %s", b))
	}
	return b[i:j]
})

// plainJSONString says whether protojson writes s as it is between
// quotes: printable ASCII without a quote or a backslash.
func plainJSONString(s string) bool {
	for i := range len(s) {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' {
			return false
		}
	}
	return true
}

// newPremarshaledJSON wraps req, whose other fields open encodes in
// protojson without its closing brace (request_id is the message's
// highest field, the last protojson writes); nil when req's request id
// would need escaping (the send then encodes the whole request).
func newPremarshaledJSON(req *prismv1.RecommendRequest, open []byte) *Premarshaled {
	p := &Premarshaled{Req: req, body: open, json: true}
	if req.RequestId == "" {
		p.id = []byte{'}'}
		return p
	}
	if !plainJSONString(req.RequestId) {
		return nil
	}
	sep := jsonSep()
	if len(open) == 1 { // "{": no field before the id
		sep = nil
	}
	p.id = make([]byte, 0, len(sep)+len(req.RequestId)+len(`"requestId":""}`))
	p.id = append(p.id, sep...)
	p.id = append(p.id, `"requestId":"`...)
	p.id = append(p.id, req.RequestId...)
	p.id = append(p.id, `"}`...)
	return p
}

// marshalJSONOpen is req (its request id left out) in protojson without
// its closing brace, for newPremarshaledJSON.
func marshalJSONOpen(req *prismv1.RecommendRequest) ([]byte, error) {
	if req.RequestId != "" {
		return nil, errors.New("loadgen: a pooled request is encoded without its request id")
	}
	b, err := protojson.Marshal(req)
	if err != nil {
		return nil, err
	}
	if len(b) < 2 || b[len(b)-1] != '}' {
		return nil, fmt.Errorf("loadgen: protojson wrote %q", b)
	}
	return b[:len(b)-1], nil
}
