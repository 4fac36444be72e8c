package serve

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/internal/auth"
	"github.com/prism-serve/prism/internal/tracing"
)

// echoCall is the test routes' handler, driven by the request's model:
//
//	"ok"          answers with scores and, in request_id, what its
//	              context says: grpc.Method, the caller's role (from
//	              the TLS peer), the authorization metadata's presence
//	              and the time left to the deadline ("none" without one);
//	"code:N"      fails with gRPC code N;
//	"pushback:V"  sets the retry pushback trailer V and fails
//	              ResourceExhausted, as the router's admission does;
//	"wait"        waits for its context to end;
//	"slow"        answers after 300 ms.
func echoCall(ctx context.Context, m proto.Message) (proto.Message, error) {
	req := m.(*prismv1.RecommendRequest)
	model := req.GetModel()
	switch {
	case model == "ok":
		left := "none"
		if dl, ok := ctx.Deadline(); ok {
			left = strconv.FormatInt(time.Until(dl).Milliseconds(), 10)
		}
		role, _, _ := auth.Peer(ctx)
		md, _ := metadata.FromIncomingContext(ctx)
		method, _ := grpc.Method(ctx)
		id := fmt.Sprintf("%s|%s|%d|%s|%s", method, role, len(md.Get("authorization")), left, req.GetRequestId())
		return &prismv1.RecommendResponse{Model: model, Scores: []float32{0.5, 0.125}, RequestId: id}, nil
	case strings.HasPrefix(model, "code:"):
		c, _ := strconv.Atoi(strings.TrimPrefix(model, "code:"))
		return nil, status.Errorf(codes.Code(c), "failed with %v", codes.Code(c))
	case strings.HasPrefix(model, "pushback:"):
		_ = grpc.SetTrailer(ctx, metadata.Pairs("grpc-retry-pushback-ms", strings.TrimPrefix(model, "pushback:")))
		return nil, status.Error(codes.ResourceExhausted, "router overloaded")
	case model == "wait":
		<-ctx.Done()
		return nil, status.FromContextError(ctx.Err()).Err()
	case model == "slow":
		time.Sleep(300 * time.Millisecond)
		return &prismv1.RecommendResponse{Model: model}, nil
	}
	return nil, status.Errorf(codes.NotFound, "model %q", model)
}

// jsonTier is a server with the HTTP/JSON endpoint on loopback: TLS
// with certs init's router certificate (and token as the bearer token)
// unless plain, /v1/recommend as Recommend (a body in 1 s unless the
// call sets a deadline) and /v1/score as DenseTier's Score (open to the
// embedding role only), bodies up to 4 KiB.
type jsonTier struct {
	s     *Server
	certs string
	stop  func() error
}

func startJSONTier(t *testing.T, token string, plain bool) *jsonTier {
	t.Helper()
	o := Options{Addr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", MetricsAddr: "off", MaxMessageBytes: 4096, Logger: quiet(), BearerToken: token, ShutdownGrace: 5 * time.Second}
	jt := &jsonTier{}
	if !plain {
		jt.certs = t.TempDir()
		if err := auth.InitCerts(jt.certs, auth.CertOptions{}); err != nil {
			t.Fatal(err)
		}
		conf, err := auth.ServerTLS(auth.FilesFor(jt.certs, auth.Router), auth.ServerTLSOptions{AllowNoClientCert: token != ""})
		if err != nil {
			t.Fatal(err)
		}
		o.TLS = conf
	}
	s, err := New("router", o)
	if err != nil {
		t.Fatal(err)
	}
	newReq := func() proto.Message { return new(prismv1.RecommendRequest) }
	s.HandleJSON(JSONRoute{Path: "/v1/recommend", FullMethod: prismv1.Recommender_Recommend_FullMethodName, New: newReq, Call: echoCall, DefaultTimeout: time.Second})
	s.HandleJSON(JSONRoute{Path: "/v1/score", FullMethod: prismv1.DenseTier_Score_FullMethodName, New: newReq, Call: echoCall})
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx) }()
	var once bool
	jt.s = s
	jt.stop = func() error {
		if once {
			return nil
		}
		once = true
		cancel()
		return <-served
	}
	t.Cleanup(func() { jt.stop() })
	return jt
}

// client is an HTTP client of the tier presenting role's certificate
// ("" none), HTTP/2 over TLS as curl speaks it.
func (jt *jsonTier) client(t *testing.T, role auth.Role) *http.Client {
	t.Helper()
	if jt.certs == "" {
		return &http.Client{Timeout: 30 * time.Second}
	}
	f := auth.Files{CA: auth.FilesFor(jt.certs, auth.Admin).CA}
	if role != "" {
		f = auth.FilesFor(jt.certs, role)
	}
	c, err := auth.ClientTLS(f, auth.Router)
	if err != nil {
		t.Fatal(err)
	}
	c.ServerName = "localhost"
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: c, ForceAttemptHTTP2: true}}
}

func (jt *jsonTier) url(path string) string {
	scheme := "https"
	if jt.certs == "" {
		scheme = "http"
	}
	return scheme + "://" + jt.s.HTTPAddr() + path
}

// jsonAnswer is an HTTP/JSON jsonAnswer: its status, headers and either the
// response or the error body.
type jsonAnswer struct {
	status int
	header http.Header
	resp   *prismv1.RecommendResponse
	err    jsonError
	raw    string
}

func do(t *testing.T, c *http.Client, req *http.Request) jsonAnswer {
	t.Helper()
	r, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	defer r.Body.Close()
	b, _ := io.ReadAll(r.Body)
	a := jsonAnswer{status: r.StatusCode, header: r.Header, raw: string(b)}
	if ct := r.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("%s %s: Content-Type %q, want application/json", req.Method, req.URL, ct)
	}
	if r.StatusCode == http.StatusOK {
		a.resp = new(prismv1.RecommendResponse)
		if err := protojson.Unmarshal(b, a.resp); err != nil {
			t.Fatalf("response %q: %v", b, err)
		}
	} else if err := json.Unmarshal(b, &a.err); err != nil {
		t.Fatalf("error body %q: %v", b, err)
	}
	return a
}

func post(t *testing.T, url, body string, header ...string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	return req
}

// TestJSONAnswers: each way an HTTP/JSON call ends, its HTTP status,
// error body and headers; the handler sees the context a gRPC call of
// its method has.
func TestJSONAnswers(t *testing.T) {
	const token = "json-0123456789abcdef0123456789"
	jt := startJSONTier(t, token, false)
	admin, embedding, none := jt.client(t, auth.Admin), jt.client(t, auth.Embedding), jt.client(t, "")
	big := `{"model":"ok","request_id":"` + strings.Repeat("x", 5000) + `"}`
	for _, tc := range []struct {
		name   string
		client *http.Client
		req    func() *http.Request
		status int
		code   string // the error body's code; "" for 200
		// id is the request_id an OK jsonAnswer carries (echoCall).
		id     string
		header map[string]string // headers the jsonAnswer must carry ("" : absent)
	}{
		{name: "ok, proto names", client: admin, req: func() *http.Request { return post(t, jt.url("/v1/recommend"), `{"model":"ok","request_id":"r1"}`) },
			status: 200, id: "/prism.v1.Recommender/Recommend|admin|0|none|r1"},
		{name: "ok, lowerCamel names", client: admin, req: func() *http.Request { return post(t, jt.url("/v1/recommend"), `{"model":"ok","requestId":"r2"}`) },
			status: 200, id: "/prism.v1.Recommender/Recommend|admin|0|none|r2"},
		{name: "no content type taken as JSON", client: admin, req: func() *http.Request {
			r := post(t, jt.url("/v1/recommend"), `{"model":"ok"}`)
			r.Header.Del("Content-Type")
			return r
		}, status: 200, id: "/prism.v1.Recommender/Recommend|admin|0|none|"},
		{name: "charset parameter", client: admin, req: func() *http.Request {
			return post(t, jt.url("/v1/recommend"), `{"model":"ok"}`, "Content-Type", "application/json; charset=utf-8")
		}, status: 200, id: "/prism.v1.Recommender/Recommend|admin|0|none|"},
		// Authorization, as gRPC's.
		{name: "no certificate, no token", client: none, req: func() *http.Request { return post(t, jt.url("/v1/recommend"), `{"model":"ok"}`) },
			status: 401, code: "UNAUTHENTICATED"},
		{name: "wrong token", client: none, req: func() *http.Request {
			return post(t, jt.url("/v1/recommend"), `{"model":"ok"}`, "Authorization", "Bearer "+token+"x")
		}, status: 401, code: "UNAUTHENTICATED"},
		{name: "bearer token", client: none, req: func() *http.Request {
			return post(t, jt.url("/v1/recommend"), `{"model":"ok"}`, "Authorization", "Bearer "+token)
		}, status: 200, id: "/prism.v1.Recommender/Recommend||1|none|"},
		{name: "any role may Recommend", client: embedding, req: func() *http.Request { return post(t, jt.url("/v1/recommend"), `{"model":"ok"}`) },
			status: 200, id: "/prism.v1.Recommender/Recommend|embedding|0|none|"},
		{name: "wrong role", client: admin, req: func() *http.Request { return post(t, jt.url("/v1/score"), `{"model":"ok"}`) },
			status: 403, code: "PERMISSION_DENIED"},
		{name: "token where the method takes none", client: none, req: func() *http.Request {
			return post(t, jt.url("/v1/score"), `{"model":"ok"}`, "Authorization", "Bearer "+token)
		}, status: 401, code: "UNAUTHENTICATED"},
		{name: "right role", client: embedding, req: func() *http.Request { return post(t, jt.url("/v1/score"), `{"model":"ok"}`) },
			status: 200, id: "/prism.v1.DenseTier/Score|embedding|0|none|"},
		// Deadlines.
		{name: "timeout header", client: admin, req: func() *http.Request {
			return post(t, jt.url("/v1/recommend"), `{"model":"ok"}`, "X-Prism-Timeout", "30s")
		}, status: 200, id: "/prism.v1.Recommender/Recommend|admin|0|~30000|"},
		{name: "timeout query", client: admin, req: func() *http.Request { return post(t, jt.url("/v1/recommend?timeout=20s"), `{"model":"ok"}`) },
			status: 200, id: "/prism.v1.Recommender/Recommend|admin|0|~20000|"},
		{name: "both: the shorter", client: admin, req: func() *http.Request {
			return post(t, jt.url("/v1/recommend?timeout=20s"), `{"model":"ok"}`, "X-Prism-Timeout", "10s")
		}, status: 200, id: "/prism.v1.Recommender/Recommend|admin|0|~10000|"},
		{name: "bad timeout", client: admin, req: func() *http.Request {
			return post(t, jt.url("/v1/recommend"), `{"model":"ok"}`, "X-Prism-Timeout", "200")
		}, status: 400, code: "INVALID_ARGUMENT"},
		{name: "deadline passes", client: admin, req: func() *http.Request { return post(t, jt.url("/v1/recommend?timeout=50ms"), `{"model":"wait"}`) },
			status: 504, code: "DEADLINE_EXCEEDED"},
		// The HTTP layer's own refusals.
		{name: "GET", client: admin, req: func() *http.Request {
			r, _ := http.NewRequest(http.MethodGet, jt.url("/v1/recommend"), nil)
			return r
		}, status: 405, code: "UNIMPLEMENTED", header: map[string]string{"Allow": "POST"}},
		{name: "unknown path", client: admin, req: func() *http.Request { return post(t, jt.url("/v1/recommendx"), `{}`) },
			status: 404, code: "NOT_FOUND"},
		{name: "wrong content type", client: admin, req: func() *http.Request {
			return post(t, jt.url("/v1/recommend"), `model=ok`, "Content-Type", "application/x-www-form-urlencoded")
		}, status: 415, code: "INVALID_ARGUMENT"},
		{name: "malformed JSON", client: admin, req: func() *http.Request { return post(t, jt.url("/v1/recommend"), `{"model":`) },
			status: 400, code: "INVALID_ARGUMENT"},
		{name: "unknown field", client: admin, req: func() *http.Request { return post(t, jt.url("/v1/recommend"), `{"modle":"ok"}`) },
			status: 400, code: "INVALID_ARGUMENT"},
		{name: "body over the limit", client: admin, req: func() *http.Request { return post(t, jt.url("/v1/recommend"), big) },
			status: 413, code: "RESOURCE_EXHAUSTED"},
		{name: "chunked body over the limit", client: admin, req: func() *http.Request {
			r := post(t, jt.url("/v1/recommend"), "")
			r.Body, r.ContentLength = io.NopCloser(strings.NewReader(big)), -1
			return r
		}, status: 413, code: "RESOURCE_EXHAUSTED"},
		// The handler's codes, and the router's pushback.
		{name: "pushback", client: admin, req: func() *http.Request { return post(t, jt.url("/v1/recommend"), `{"model":"pushback:1500"}`) },
			status: 429, code: "RESOURCE_EXHAUSTED", header: map[string]string{"Retry-After": "2", PushbackHeader: "1500"}},
		{name: "pushback: do not retry", client: admin, req: func() *http.Request { return post(t, jt.url("/v1/recommend"), `{"model":"pushback:-1"}`) },
			status: 429, code: "RESOURCE_EXHAUSTED", header: map[string]string{"Retry-After": "", PushbackHeader: "-1"}},
		{name: "refusal without pushback", client: admin, req: func() *http.Request {
			return post(t, jt.url("/v1/recommend"), fmt.Sprintf(`{"model":"code:%d"}`, codes.ResourceExhausted))
		}, status: 429, code: "RESOURCE_EXHAUSTED", header: map[string]string{"Retry-After": "", PushbackHeader: ""}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := do(t, tc.client, tc.req())
			if a.status != tc.status || a.err.Code != tc.code {
				t.Fatalf("status %d code %q, want %d %q: %s", a.status, a.err.Code, tc.status, tc.code, a.raw)
			}
			if tc.code != "" && a.err.Message == "" {
				t.Errorf("error body without a message: %s", a.raw)
			}
			for k, v := range tc.header {
				if got := a.header.Get(k); got != v {
					t.Errorf("header %s: %q, want %q", k, got, v)
				}
			}
			if tc.status != 200 {
				return
			}
			if got := a.resp.GetScores(); len(got) != 2 || got[0] != 0.5 || got[1] != 0.125 {
				t.Errorf("scores %v", got)
			}
			id := a.resp.GetRequestId()
			if strings.Contains(tc.id, "|~") {
				// The time left: within a second of the timeout asked.
				head, rest, _ := strings.Cut(tc.id, "|~")
				msWant, tail, _ := strings.Cut(rest, "|")
				parts := strings.Split(id, "|")
				if len(parts) != 5 || strings.Join(parts[:3], "|") != head || parts[4] != tail {
					t.Fatalf("request_id %q, want %q", id, tc.id)
				}
				got, _ := strconv.Atoi(parts[3])
				w, _ := strconv.Atoi(msWant)
				if got > w || got < w-1000 {
					t.Fatalf("time left %d ms, want about %d", got, w)
				}
				return
			}
			if id != tc.id {
				t.Fatalf("request_id %q, want %q", id, tc.id)
			}
		})
	}
	// A certificate of another CA fails the handshake, as over gRPC.
	t.Run("another CA", func(t *testing.T) {
		other := t.TempDir()
		if err := auth.InitCerts(other, auth.CertOptions{}); err != nil {
			t.Fatal(err)
		}
		c, err := auth.ClientTLS(auth.Files{Cert: auth.FilesFor(other, auth.Admin).Cert, Key: auth.FilesFor(other, auth.Admin).Key, CA: auth.FilesFor(jt.certs, auth.Admin).CA})
		if err != nil {
			t.Fatal(err)
		}
		c.ServerName = "localhost"
		hc := &http.Client{Transport: &http.Transport{TLSClientConfig: c}}
		r, err := hc.Do(post(t, jt.url("/v1/recommend"), `{"model":"ok"}`))
		if err == nil {
			r.Body.Close()
			t.Fatalf("answered %d with another CA's certificate", r.StatusCode)
		}
	})
	// Counted as the gRPC calls are, under the path and the gRPC code.
	for code, min := range map[string]float64{"OK": 7, "Unauthenticated": 2, "ResourceExhausted": 5, "DeadlineExceeded": 1, "InvalidArgument": 4, "Unimplemented": 1} {
		if got := counted(jt.s.requests.WithLabelValues("/v1/recommend", code)); got < min {
			t.Errorf("prism_rpc_requests_total{method=/v1/recommend,code=%s} = %v, want at least %v", code, got, min)
		}
	}
	if got := counted(jt.s.requests.WithLabelValues("unknown", "NotFound")); got != 1 {
		t.Errorf("the unknown path counted %v times under \"unknown\", want 1", got)
	}
	for _, path := range []string{"/v1/recommend", "/v1/score"} {
		var m dto.Metric
		if err := jt.s.latency.WithLabelValues(path).(prometheus.Histogram).Write(&m); err != nil || m.GetHistogram().GetSampleCount() == 0 {
			t.Errorf("prism_rpc_latency_seconds{method=%s}: no calls (%v)", path, err)
		}
	}
}

// counted is a counter's value.
func counted(c prometheus.Counter) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		return -1
	}
	return m.GetCounter().GetValue()
}

// TestHTTPStatus: every gRPC code has the HTTP status google.rpc.Code
// documents.
func TestHTTPStatus(t *testing.T) {
	for c, want := range map[codes.Code]int{
		codes.OK: 200, codes.Canceled: 499, codes.Unknown: 500, codes.InvalidArgument: 400,
		codes.DeadlineExceeded: 504, codes.NotFound: 404, codes.AlreadyExists: 409,
		codes.PermissionDenied: 403, codes.ResourceExhausted: 429, codes.FailedPrecondition: 400,
		codes.Aborted: 409, codes.OutOfRange: 400, codes.Unimplemented: 501, codes.Internal: 500,
		codes.Unavailable: 503, codes.DataLoss: 500, codes.Unauthenticated: 401, codes.Code(99): 500,
	} {
		if got := HTTPStatus(c); got != want {
			t.Errorf("HTTPStatus(%v) = %d, want %d", c, got, want)
		}
	}
	// And the error bodies name the code as google.rpc.Code does.
	jt := startJSONTier(t, "", true)
	for c, name := range map[codes.Code]string{codes.Canceled: "CANCELLED", codes.Unavailable: "UNAVAILABLE", codes.Internal: "INTERNAL", codes.Unknown: "UNKNOWN", codes.NotFound: "NOT_FOUND"} {
		a := do(t, jt.client(t, ""), post(t, jt.url("/v1/recommend"), fmt.Sprintf(`{"model":"code:%d"}`, c)))
		if a.status != HTTPStatus(c) || a.err.Code != name || a.err.Message != fmt.Sprintf("failed with %v", c) {
			t.Errorf("code %v answered %d %+v", c, a.status, a.err)
		}
	}
}

// TestParseTimeout: the deadline header and query parameter.
func TestParseTimeout(t *testing.T) {
	for _, tc := range []struct {
		header, query string
		want          time.Duration
		ok            bool
	}{
		{"", "", 0, true},
		{"200ms", "", 200 * time.Millisecond, true},
		{" 1.5s ", "", 1500 * time.Millisecond, true},
		{"", "timeout=2s", 2 * time.Second, true},
		{"", "a=b&timeout=2s&timeout=1s", 2 * time.Second, true},
		{"3s", "timeout=2s", 2 * time.Second, true},
		{"1s", "timeout=2s", time.Second, true},
		{"", "timeout=%zz", 0, false},
		{"", "timeout=2m%30s", 2 * time.Minute, true},
		{"200", "", 0, false},
		{"0s", "", 0, false},
		{"-1s", "", 0, false},
		{"", "timeout=", 0, false},
		{"", "timeout=soon", 0, false},
		{"1s", "timeout=0", 0, false},
	} {
		h := http.Header{}
		if tc.header != "" {
			h.Set(TimeoutHeader, tc.header)
		}
		got, err := ParseTimeout(h, tc.query)
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("ParseTimeout(%q, %q) = %v, %v; want %v, ok %v", tc.header, tc.query, got, err, tc.want, tc.ok)
		}
		if err != nil && status.Code(err) != codes.InvalidArgument {
			t.Errorf("ParseTimeout(%q, %q): %v, want InvalidArgument", tc.header, tc.query, err)
		}
	}
}

// TestJSONClientGone: a client that disconnects cancels its call's
// context; the call is counted Canceled.
func TestJSONClientGone(t *testing.T) {
	jt := startJSONTier(t, "", false)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, err := jt.client(t, auth.Admin).Do(post(t, jt.url("/v1/recommend"), `{"model":"wait"}`).WithContext(ctx))
	if err == nil {
		t.Fatal("answered a call that waits for its context")
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if counted(jt.s.requests.WithLabelValues("/v1/recommend", "Canceled")) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the call of the client that left was never cancelled")
		}
	}
}

// TestJSONDrain: told to stop, the server answers the HTTP/JSON call in
// flight, then takes no more.
func TestJSONDrain(t *testing.T) {
	jt := startJSONTier(t, "", false)
	c := jt.client(t, auth.Admin)
	got := make(chan jsonAnswer, 1)
	go func() { got <- do(t, c, post(t, jt.url("/v1/recommend"), `{"model":"slow"}`)) }()
	for deadline := time.Now().Add(10 * time.Second); jt.s.inFlight() == "none"; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the call never started")
		}
	}
	if err := jt.stop(); err != nil {
		t.Fatalf("Serve: %v", err)
	}
	if a := <-got; a.status != 200 || a.resp.GetModel() != "slow" {
		t.Fatalf("the call in flight at the stop: %d %s", a.status, a.raw)
	}
	fresh := jt.client(t, auth.Admin)
	if r, err := fresh.Do(post(t, jt.url("/v1/recommend"), `{"model":"ok"}`)); err == nil {
		r.Body.Close()
		t.Fatalf("a stopped server answered %d", r.StatusCode)
	}
}

// TestJSONPlaintext: without TLS (--insecure) the endpoint is plain HTTP
// without authorization, as the gRPC server is.
func TestJSONPlaintext(t *testing.T) {
	jt := startJSONTier(t, "", true)
	a := do(t, jt.client(t, ""), post(t, jt.url("/v1/score"), `{"model":"ok"}`))
	if a.status != 200 || a.resp.GetRequestId() != "/prism.v1.DenseTier/Score||0|none|" {
		t.Fatalf("plain HTTP: %d %s", a.status, a.raw)
	}
}

// TestJSONTraceparent: with tracing on, the caller's traceparent
// continues its trace: the call's server span is the child of the
// caller's.
func TestJSONTraceparent(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	t.Cleanup(tracing.Use(sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))))
	jt := startJSONTier(t, "", true)
	const traceID, parent = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	a := do(t, jt.client(t, ""), post(t, jt.url("/v1/recommend"), `{"model":"ok"}`, "traceparent", "00-"+traceID+"-"+parent+"-01"))
	if a.status != 200 {
		t.Fatalf("%d %s", a.status, a.raw)
	}
	var found bool
	for _, s := range rec.Ended() {
		if s.Name() == "POST /v1/recommend" {
			found = true
			if s.SpanContext().TraceID().String() != traceID || s.Parent().SpanID().String() != parent || !s.Parent().IsRemote() {
				t.Errorf("span %s in trace %s under %s, want trace %s under the caller's %s", s.Name(), s.SpanContext().TraceID(), s.Parent().SpanID(), traceID, parent)
			}
		}
	}
	if !found {
		t.Fatalf("no span of the call among %d", len(rec.Ended()))
	}
}

// TestJSONNoCertificate: on a server that takes no bearer token, whose
// gRPC handshake requires a client certificate, the HTTP/JSON endpoint
// still completes the handshake of a caller without one and answers it
// 401 in JSON, which curl and a browser show; a certificate given is
// verified.
func TestJSONNoCertificate(t *testing.T) {
	jt := startJSONTier(t, "", false)
	a := do(t, jt.client(t, ""), post(t, jt.url("/v1/recommend"), `{"model":"ok"}`))
	if a.status != http.StatusUnauthorized || a.err.Code != "UNAUTHENTICATED" || !strings.Contains(a.err.Message, "client certificate") {
		t.Fatalf("no certificate: %d %s", a.status, a.raw)
	}
	if a := do(t, jt.client(t, auth.Dense), post(t, jt.url("/v1/recommend"), `{"model":"ok"}`)); a.status != 200 {
		t.Fatalf("a dense certificate: %d %s", a.status, a.raw)
	}
}

// TestJSONSlowBody: a client that does not finish sending its body is
// answered 408 once its call's time is up (the route's default here),
// and its handler is freed.
func TestJSONSlowBody(t *testing.T) {
	jt := startJSONTier(t, "", true)
	pr, pw := io.Pipe()
	go pw.Write([]byte(`{"model":`))
	// The client gives up after 5 s (its transport waits for the body
	// to end even once the call is abandoned).
	stop := time.AfterFunc(5*time.Second, func() { pw.CloseWithError(errors.New("client gave up")) })
	defer stop.Stop()
	req := post(t, jt.url("/v1/recommend"), "")
	req.Body, req.ContentLength = pr, -1
	start := time.Now()
	if r, err := jt.client(t, "").Do(req); err == nil {
		b, _ := io.ReadAll(r.Body)
		r.Body.Close()
		if r.StatusCode != http.StatusRequestTimeout || !strings.Contains(string(b), "DEADLINE_EXCEEDED") {
			t.Fatalf("a body that never ends: %d %s", r.StatusCode, b)
		}
	}
	for deadline := time.Now().Add(10 * time.Second); counted(jt.s.requests.WithLabelValues("/v1/recommend", "DeadlineExceeded")) != 1; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the handler still waits for the body")
		}
	}
	if d := time.Since(start); d < time.Second || d > 5*time.Second {
		t.Errorf("answered after %v, want about the route's 1 s", d)
	}
}

// TestJSONHealth: an HTTP load balancer in front of the endpoint, which
// holds no client certificate, reads /healthz (200 while the process
// serves) and /readyz (200 while the gRPC health is SERVING, 503 when
// not), GET or HEAD; other methods are 405.
func TestJSONHealth(t *testing.T) {
	jt := startJSONTier(t, "", false)
	c := jt.client(t, "")
	check := func(method, path string, wantCode int, wantBody string) {
		t.Helper()
		req, _ := http.NewRequest(method, jt.url(path), nil)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != wantCode || string(b) != wantBody {
			t.Errorf("%s %s: %d %q, want %d %q", method, path, resp.StatusCode, b, wantCode, wantBody)
		}
	}
	check("GET", LivePath, 200, "ok\n")
	check("GET", ReadyPath, 200, "ok\n")
	check("HEAD", ReadyPath, 200, "")
	check("POST", ReadyPath, 405, "GET or HEAD\n")
	jt.s.Health.SetServingStatus("", healthpb.HealthCheckResponse_NOT_SERVING)
	check("GET", ReadyPath, 503, "not_serving\n")
	check("GET", LivePath, 200, "ok\n")
	// The API itself still wants a certificate.
	if a := do(t, c, post(t, jt.url("/v1/recommend"), `{"model":"ok"}`)); a.status != http.StatusUnauthorized {
		t.Errorf("Recommend without a certificate: %d %s", a.status, a.raw)
	}
}
