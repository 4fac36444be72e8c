package loadgen

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/prism-serve/prism/api/prismv1"
)

// TestHTTPError: an HTTP/JSON answer other than 200 reads back as the
// gRPC status it stands for: the router's JSON code by name (or a
// number), a body that is not such JSON by its HTTP status as gRPC maps
// it, and the pushback from X-Prism-Retry-Pushback-Ms, else Retry-After.
func TestHTTPError(t *testing.T) {
	for _, tc := range []struct {
		name     string
		status   int
		header   map[string]string
		body     string
		code     codes.Code
		msg      string // in the error's message
		pushback time.Duration
		set      bool // a pushback is set
		retry    bool // it allows a retry
	}{
		{"overload with pushback", 429, map[string]string{PushbackHeader: "25", "Retry-After": "1"}, `{"code":"RESOURCE_EXHAUSTED","message":"router overloaded"}`, codes.ResourceExhausted, "router overloaded", 25 * time.Millisecond, true, true},
		{"overload, do not retry", 429, map[string]string{PushbackHeader: "-1"}, `{"code":"RESOURCE_EXHAUSTED","message":"shed"}`, codes.ResourceExhausted, "shed", 0, true, false},
		{"unavailable", 503, nil, `{"code":"UNAVAILABLE","message":"no live worker"}`, codes.Unavailable, "no live worker", 0, false, true},
		{"not found", 404, nil, `{"code":"NOT_FOUND","message":"model x"}` + "\n", codes.NotFound, "model x", 0, false, true},
		{"invalid", 400, nil, `{"code":"INVALID_ARGUMENT","message":"bad"}`, codes.InvalidArgument, "bad", 0, false, true},
		{"deadline", 504, nil, `{"code":"DEADLINE_EXCEEDED","message":"late"}`, codes.DeadlineExceeded, "late", 0, false, true},
		{"unauthenticated", 401, nil, `{"code":"UNAUTHENTICATED","message":"no certificate"}`, codes.Unauthenticated, "no certificate", 0, false, true},
		{"code as a number", 429, nil, `{"code":8,"message":"numbered"}`, codes.ResourceExhausted, "numbered", 0, false, true},
		{"unknown name", 500, nil, `{"code":"BOGUS","message":"what"}`, codes.Unknown, "what", 0, false, true},
		{"number out of range", 500, nil, `{"code":99,"message":"what"}`, codes.Unknown, "what", 0, false, true},
		// A body naming OK is no error code: read by the HTTP status,
		// never as a success (a nil error) whatever else the body says.
		{"code OK on an error status", 503, nil, `{"code":"OK","message":"fine?"}`, codes.Unavailable, "HTTP 503", 0, false, true},
		{"code 0 on an error status", 500, nil, `{"code":0}`, codes.Unknown, "HTTP 500", 0, false, true},
		{"code OK with a pushback", 429, map[string]string{PushbackHeader: "25"}, `{"code":"OK"}`, codes.Unavailable, "HTTP 429", 25 * time.Millisecond, true, true},
		// Not the router's JSON: by the HTTP status, as gRPC maps an
		// answer that is not gRPC's.
		{"a proxy's 502 page", 502, nil, "<html><body>Bad Gateway</body></html>", codes.Unavailable, "HTTP 502 Bad Gateway: <html>", 0, false, true},
		{"a proxy's 429", 429, map[string]string{"Retry-After": "2"}, "slow down", codes.Unavailable, "HTTP 429 Too Many Requests: slow down", 2 * time.Second, true, true},
		{"503 empty", 503, nil, "", codes.Unavailable, "HTTP 503 Service Unavailable", 0, false, true},
		{"504 empty", 504, nil, "", codes.Unavailable, "HTTP 504", 0, false, true},
		{"a proxy's 404", 404, nil, "not here", codes.Unimplemented, "HTTP 404", 0, false, true},
		{"403", 403, nil, "", codes.PermissionDenied, "HTTP 403", 0, false, true},
		{"401", 401, nil, "", codes.Unauthenticated, "HTTP 401", 0, false, true},
		{"400 not JSON", 400, nil, "bad request", codes.Internal, "HTTP 400", 0, false, true},
		{"JSON without a code", 500, nil, `{"error":"x"}`, codes.Unknown, `HTTP 500 Internal Server Error: {"error":"x"}`, 0, false, true},
		{"Retry-After as a date is not read", 503, map[string]string{"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"}, "", codes.Unavailable, "HTTP 503", 0, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := http.Header{}
			for k, v := range tc.header {
				h.Set(k, v)
			}
			err := HTTPError(tc.status, h, []byte(tc.body))
			if got := status.Code(err); got != tc.code {
				t.Fatalf("code %v (%v), want %v", got, err, tc.code)
			}
			if !strings.Contains(status.Convert(err).Message(), tc.msg) {
				t.Fatalf("message %q, want it to hold %q", status.Convert(err).Message(), tc.msg)
			}
			wait, set, retry := Pushback(err)
			if wait != tc.pushback || set != tc.set || retry != tc.retry {
				t.Fatalf("pushback %v set %v retry %v, want %v %v %v", wait, set, retry, tc.pushback, tc.set, tc.retry)
			}
		})
	}
}

// seen is what an httptest server saw of one request.
type seen struct {
	header http.Header
	req    *prismv1.RecommendRequest
}

// TestHTTPSender: the sender against an httptest server scripted per
// case: the request arrives as protojson with its deadline, trace
// context and bearer token as headers; the answer reads back as over
// gRPC (OK, a score count that does not match, a refusal's code and
// pushback, a deadline).
func TestHTTPSender(t *testing.T) {
	req := &prismv1.RecommendRequest{Model: "m", NumCandidates: 3, RequestId: "lg-1",
		Candidates: &prismv1.Features{Inputs: []*prismv1.Input{{Name: "dense", Values: []float32{1, 2, 3}}}}}
	scores := func(n int) string {
		return `{"scores":[` + strings.TrimSuffix(strings.Repeat("0.5,", n), ",") + `],"model":"m","version":"1","requestId":"lg-1"}`
	}
	for _, tc := range []struct {
		name    string
		status  int
		header  map[string]string
		body    string
		delay   time.Duration
		timeout time.Duration // of the send's context (0: none)
		trace   bool          // the context carries a traceparent
		code    codes.Code
		msg     string
		set     bool
	}{
		{name: "ok", status: 200, body: scores(3), timeout: 2 * time.Second, trace: true, code: codes.OK},
		{name: "ok without a deadline", status: 200, body: scores(3), code: codes.OK},
		// protojson writes a NaN score as a string: counted, as over gRPC.
		{name: "a NaN score", status: 200, body: `{"scores":[0.5,"NaN",1e-3]}`, timeout: time.Second, code: codes.OK},
		{name: "score count wrong", status: 200, body: scores(2), timeout: time.Second, code: codes.Internal, msg: "2 scores for 3 candidates"},
		{name: "not JSON", status: 200, body: "hello", timeout: time.Second, code: codes.Internal, msg: "not a RecommendResponse in JSON"},
		{name: "overload", status: 429, header: map[string]string{PushbackHeader: "30"}, body: `{"code":"RESOURCE_EXHAUSTED","message":"over"}`, timeout: time.Second, code: codes.ResourceExhausted, msg: "over", set: true},
		{name: "a proxy's 502", status: 502, body: "<html>bad gateway</html>", timeout: time.Second, code: codes.Unavailable, msg: "HTTP 502"},
		{name: "too slow", status: 200, body: scores(3), delay: time.Second, timeout: 100 * time.Millisecond, code: codes.DeadlineExceeded},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			var got []seen
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, hr *http.Request) {
				b, _ := io.ReadAll(hr.Body)
				r := new(prismv1.RecommendRequest)
				if err := protojson.Unmarshal(b, r); err != nil {
					t.Errorf("body %q: %v", b, err)
				}
				mu.Lock()
				got = append(got, seen{hr.Header.Clone(), r})
				mu.Unlock()
				if tc.delay > 0 {
					select {
					case <-time.After(tc.delay):
					case <-hr.Context().Done():
						return
					}
				}
				for k, v := range tc.header {
					w.Header().Set(k, v)
				}
				w.WriteHeader(tc.status)
				io.WriteString(w, tc.body)
			}))
			defer srv.Close()
			s := HTTPSender{URL: srv.URL + RecommendPath, Client: NewHTTPClient(nil, 4), Header: http.Header{"Authorization": {"Bearer secret"}}}
			ctx := context.Background()
			if tc.timeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tc.timeout)
				defer cancel()
			}
			const traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
			if tc.trace {
				ctx = metadata.AppendToOutgoingContext(ctx, "traceparent", traceparent)
			}
			err := s.Send(ctx, req)
			if status.Code(err) != tc.code || !strings.Contains(status.Convert(err).Message(), tc.msg) {
				t.Fatalf("error %v, want %v holding %q", err, tc.code, tc.msg)
			}
			if _, set, _ := Pushback(err); set != tc.set {
				t.Fatalf("pushback set %v, want %v", set, tc.set)
			}
			mu.Lock()
			defer mu.Unlock()
			if len(got) != 1 {
				t.Fatalf("the server saw %d requests", len(got))
			}
			h := got[0].header
			if !proto.Equal(got[0].req, req) {
				t.Fatalf("arrived %v, sent %v", got[0].req, req)
			}
			if h.Get("Content-Type") != "application/json" || h.Get("Authorization") != "Bearer secret" {
				t.Fatalf("headers %v", h)
			}
			if tc.trace != (h.Get("Traceparent") == traceparent) {
				t.Fatalf("traceparent %q (sent: %v)", h.Get("Traceparent"), tc.trace)
			}
			d, err := time.ParseDuration(h.Get(TimeoutHeader))
			switch {
			case tc.timeout == 0 && h.Get(TimeoutHeader) != "":
				t.Fatalf("%s %q without a deadline", TimeoutHeader, h.Get(TimeoutHeader))
			case tc.timeout > 0 && (err != nil || d > tc.timeout || d < tc.timeout-time.Second/2):
				t.Fatalf("%s %q (%v) for a deadline %v away", TimeoutHeader, h.Get(TimeoutHeader), err, tc.timeout)
			}
		})
	}

	// A deadline passed before the send: nothing is sent.
	s := HTTPSender{URL: "http://127.0.0.1:1" + RecommendPath, Client: NewHTTPClient(nil, 1)}
	ctx, cancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel()
	if err := s.Send(ctx, req); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("a passed deadline: %v", err)
	}
	// Nobody listens: Unavailable, as gRPC says of a connection refused.
	if err := s.Send(context.Background(), req); status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("nobody listening: %v", err)
	}
}

// TestPremarshaledJSON: a pool built for HTTP/JSON holds each request
// in protojson: every send's bytes (the shared body and its own request
// id) are protojson.Marshal's for the request, and arrive through the
// sender as the request.
func TestPremarshaledJSON(t *testing.T) {
	var mu sync.Mutex
	arrived := map[string]*prismv1.RecommendRequest{}
	f := &Fake{Delay: func(r *prismv1.RecommendRequest) time.Duration {
		mu.Lock()
		arrived[r.RequestId] = r
		mu.Unlock()
		return 0
	}}
	srv := httptest.NewServer(f.HTTPHandler())
	defer srv.Close()
	s := HTTPSender{URL: srv.URL + RecommendPath, Client: NewHTTPClient(nil, 4)}
	for _, tc := range []struct {
		name     string
		prefix   string
		pool     int
		premade  bool // the sends carry a protojson form
		noPrefix bool
	}{
		{name: "pooled", prefix: "lg-", pool: 3, premade: true},
		{name: "a mix's prefix", prefix: "lg-dlrm-tiny-", pool: 2, premade: true},
		// An id protojson escapes: encoded whole at each send.
		{name: "escaped id", prefix: "lg-\"q\"-", pool: 2},
		{name: "no pool", prefix: "lg-", pool: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			q, err := NewRequests(RequestOptions{Model: "m", Version: 4, Sig: tinySig(t), Context: []string{"dense"}, Candidates: Uniform{3, 9}, Seed: 7, Pool: tc.pool, PoolJSON: true, IDPrefix: tc.prefix})
			if err != nil {
				t.Fatal(err)
			}
			if err := q.Prepare(); err != nil {
				t.Fatal(err)
			}
			for i := range 7 { // more than the pool: the entries come round again
				req, wire, err := q.nextSend()
				if err != nil {
					t.Fatal(err)
				}
				if (wire != nil) != tc.premade {
					t.Fatalf("send %d: protojson form %v, want %v", i, wire != nil, tc.premade)
				}
				if wire != nil {
					want, err := protojson.Marshal(req)
					if err != nil {
						t.Fatal(err)
					}
					if wire.Req != req || !bytes.Equal(wire.Bytes(), want) {
						t.Fatalf("send %d: pre-encoded\n%s\nprotojson.Marshal\n%s", i, wire.Bytes(), want)
					}
				}
				src := recommendSource{reqs: q, s: s, ps: s}
				if err := src.send(context.Background(), job{req: req, wire: wire}); err != nil {
					t.Fatal(err)
				}
				mu.Lock()
				got := arrived[req.RequestId]
				mu.Unlock()
				if !proto.Equal(got, req) {
					t.Fatalf("send %d: arrived %v, sent %v", i, got, req)
				}
			}
		})
	}
}

// TestHTTPRedirectNotFollowed: an HTTPS endpoint that redirects (here
// to plain http:// on the same host) gets its 3xx read as an error, as
// gRPC follows no redirect: the request, and the bearer token with it,
// never reaches the server redirected to (Go's client would send the
// Authorization header on to the same host, in the clear).
func TestHTTPRedirectNotFollowed(t *testing.T) {
	var reached atomic.Int64
	var token atomic.Value
	plain := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, hr *http.Request) {
		reached.Add(1)
		token.Store(hr.Header.Get("Authorization"))
		w.WriteHeader(http.StatusServiceUnavailable)
	}))
	defer plain.Close()
	for _, code := range []int{http.StatusTemporaryRedirect, http.StatusPermanentRedirect, http.StatusFound} {
		srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, hr *http.Request) {
			http.Redirect(w, hr, plain.URL+RecommendPath, code)
		}))
		s := HTTPSender{URL: srv.URL + RecommendPath, Client: NewHTTPClient(srv.Client().Transport.(*http.Transport).TLSClientConfig, 2),
			Header: http.Header{"Authorization": {"Bearer secret"}}}
		err := s.Send(context.Background(), &prismv1.RecommendRequest{Model: "m", NumCandidates: 1})
		srv.Close()
		if status.Code(err) != codes.Unknown || !strings.Contains(err.Error(), "HTTP "+strconv.Itoa(code)) {
			t.Errorf("redirect %d: %v, want Unknown naming HTTP %d", code, err, code)
		}
		if n := reached.Load(); n != 0 {
			t.Fatalf("redirect %d: the server redirected to got %d requests (Authorization %q)", code, n, token.Load())
		}
	}
}

// TestHTTPRetries: a retrying run over HTTP/JSON against a server that
// refuses each request's first attempt 429 with a pushback and answers
// the second: every request ends OK after two attempts, each retry
// timed by the pushback, as over gRPC.
func TestHTTPRetries(t *testing.T) {
	f := &Fake{}
	ok := f.HTTPHandler()
	var mu sync.Mutex
	attempts := map[string]int{}
	var refusals atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, hr *http.Request) {
		b, _ := io.ReadAll(hr.Body)
		r := new(prismv1.RecommendRequest)
		if err := protojson.Unmarshal(b, r); err != nil {
			t.Errorf("body: %v", err)
		}
		mu.Lock()
		attempts[r.RequestId]++
		n := attempts[r.RequestId]
		mu.Unlock()
		if n == 1 {
			refusals.Add(1)
			w.Header().Set(PushbackHeader, "5")
			w.Header().Set("Retry-After", "1")
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusTooManyRequests)
			io.WriteString(w, `{"code":"RESOURCE_EXHAUSTED","message":"router overloaded"}`)
			return
		}
		hr.Body = io.NopCloser(bytes.NewReader(b))
		ok.ServeHTTP(w, hr)
	}))
	defer srv.Close()
	for _, pool := range []int{0, 4} {
		mu.Lock()
		clear(attempts)
		mu.Unlock()
		q, err := NewRequests(RequestOptions{Model: "m", Sig: tinySig(t), Candidates: Fixed(4), Seed: 1, Pool: pool, PoolJSON: true})
		if err != nil {
			t.Fatal(err)
		}
		if err := q.Prepare(); err != nil {
			t.Fatal(err)
		}
		s := HTTPSender{URL: srv.URL + RecommendPath, Client: NewHTTPClient(nil, 4)}
		sum, err := Run(context.Background(), Options{Clients: 2, Duration: 5 * time.Second, MaxRequests: 20, Timeout: 2 * time.Second,
			Retry: Retry{Retries: 2, Initial: time.Second, Max: time.Second}}, q, s)
		if err != nil {
			t.Fatal(err)
		}
		r := sum.Retry
		// The client's own backoff is 1 s: the retries came after the
		// 5 ms pushback, or the run would have taken 20 s.
		if sum.Sent != 20 || sum.OK != 20 || r == nil || r.Attempts != 40 || r.RetriedOK != 20 || r.Pushbacks != 20 || sum.P99 > 500 {
			t.Fatalf("pool %d: sent %d ok %d p99 %.1fms retries %+v", pool, sum.Sent, sum.OK, sum.P99, r)
		}
	}
}
