package serve

import (
	"cmp"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"mime"
	"net"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	rpccode "google.golang.org/genproto/googleapis/rpc/code"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/prism-serve/prism/internal/auth"
	"github.com/prism-serve/prism/internal/tracing"
)

// JSONRoute is a unary gRPC method served over HTTP/JSON too: POST Path
// with the request message in protojson, answered with the response
// message in protojson. Call is the method's own handler, called in
// process with the context a gRPC call of FullMethod would have (the
// caller's certificate as its peer, its headers as incoming metadata,
// its deadline), so the two paths serve alike.
type JSONRoute struct {
	// Path is the HTTP path ("/v1/recommend"), also the method label of
	// the route's prism_rpc_* metrics.
	Path string
	// FullMethod is the gRPC method the route serves
	// ("/prism.v1.Recommender/Recommend"): its row of auth.Table decides
	// who may call the route, and grpc.Method reports it to Call.
	FullMethod string
	// New is an empty request message, which the body is decoded into.
	New func() proto.Message
	// Decode, when set, decodes the body instead of protojson into New's
	// message: a reader faster than protojson's for the method's
	// request (router.DecodeRecommendJSON), which must decode what it
	// accepts as protojson does, and say as protojson does what it does
	// not.
	Decode func(body []byte) (proto.Message, error)
	// Call is the method's handler.
	Call func(ctx context.Context, req proto.Message) (proto.Message, error)
	// DefaultTimeout is the time a caller that sets no deadline gets to
	// send its body (the router's --default-timeout, which Call then
	// applies itself, as for a gRPC call without one); 0: no bound of
	// its own.
	DefaultTimeout time.Duration
}

// HandleJSON serves r on the HTTP/JSON listener (Options.HTTPAddr).
// Call it before Serve, as services are registered on GRPC.
func (s *Server) HandleJSON(r JSONRoute) {
	if s.routes == nil {
		s.routes = map[string]JSONRoute{}
	}
	s.routes[r.Path] = r
}

// HandleHTTP serves h at path on the HTTP/JSON listener, to anyone (no
// certificate or token asked, as the health checks): for documents such
// as the endpoint's OpenAPI description. Call it before Serve.
func (s *Server) HandleHTTP(path string, h http.Handler) {
	if s.open == nil {
		s.open = map[string]http.Handler{}
	}
	s.open[path] = h
}

// HTTPAddr is the HTTP/JSON address, "" when it is off.
func (s *Server) HTTPAddr() string {
	if s.alis == nil {
		return ""
	}
	return s.alis.Addr().String()
}

// TimeoutHeader is the request header that sets an HTTP/JSON call's
// deadline, a Go duration ("200ms"), as grpc-timeout does a gRPC call's;
// the query parameter "timeout" does too, and with both the shorter
// wins. Without either the method's own default applies (the router's
// --default-timeout).
const TimeoutHeader = "X-Prism-Timeout"

// PushbackHeader carries the retry pushback of an overload refusal
// (pushbackTrailer) in milliseconds, as the router gave it: Retry-After
// has whole seconds only, and a negative value, do not retry, has no
// Retry-After at all.
const PushbackHeader = "X-Prism-Retry-Pushback-Ms"

// pushbackTrailer is gRPC's retry pushback trailer (gRFC A6;
// router.PushbackKey), which a handler sets with grpc.SetTrailer.
const pushbackTrailer = "grpc-retry-pushback-ms"

// StatusClientClosed is the HTTP status of a call the client cancelled
// (it disconnected): 499, nginx's "client closed request", as
// google.rpc.Code maps CANCELLED. Nobody reads it, but the access logs
// and metrics of a proxy in front do.
const StatusClientClosed = 499

// HTTPStatus is the HTTP status of a gRPC status code, as google.rpc.Code
// documents the mapping (grpc-gateway's too).
func HTTPStatus(c codes.Code) int {
	switch c {
	case codes.OK:
		return http.StatusOK
	case codes.Canceled:
		return StatusClientClosed
	case codes.InvalidArgument, codes.FailedPrecondition, codes.OutOfRange:
		return http.StatusBadRequest
	case codes.DeadlineExceeded:
		return http.StatusGatewayTimeout
	case codes.NotFound:
		return http.StatusNotFound
	case codes.AlreadyExists, codes.Aborted:
		return http.StatusConflict
	case codes.PermissionDenied:
		return http.StatusForbidden
	case codes.Unauthenticated:
		return http.StatusUnauthorized
	case codes.ResourceExhausted:
		return http.StatusTooManyRequests
	case codes.Unimplemented:
		return http.StatusNotImplemented
	case codes.Unavailable:
		return http.StatusServiceUnavailable
	default: // Unknown, Internal, DataLoss, and codes gRPC may add
		return http.StatusInternalServerError
	}
}

// jsonError is an HTTP/JSON answer's error body, google.rpc.Status's
// code (by name) and message.
type jsonError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// httpRefusal is a call refused by the HTTP layer itself (method, media
// type, size) with a status of its own; st is the gRPC status it is
// counted and answered under.
type httpRefusal struct {
	status int
	st     *status.Status
}

func (e *httpRefusal) Error() string              { return e.st.Message() }
func (e *httpRefusal) GRPCStatus() *status.Status { return e.st }

func refuse(httpStatus int, c codes.Code, format string, args ...any) error {
	return &httpRefusal{status: httpStatus, st: status.Newf(c, format, args...)}
}

// ParseTimeout is the deadline an HTTP/JSON call asks for: the shorter
// of TimeoutHeader and the query's "timeout", 0 when neither is given.
// A value that is not a positive Go duration is InvalidArgument.
func ParseTimeout(h http.Header, query string) (time.Duration, error) {
	var d time.Duration
	take := func(what, v string) error {
		t, err := time.ParseDuration(strings.TrimSpace(v))
		if err != nil || t <= 0 {
			return status.Errorf(codes.InvalidArgument, "%s %q: want a positive Go duration such as 200ms or 1.5s", what, v)
		}
		if d == 0 || t < d {
			d = t
		}
		return nil
	}
	if vs := h.Values(TimeoutHeader); len(vs) > 0 {
		if err := take(TimeoutHeader, vs[0]); err != nil {
			return 0, err
		}
	}
	if query != "" {
		q, err := url.ParseQuery(query)
		if err != nil {
			return 0, status.Errorf(codes.InvalidArgument, "query %q: %v", query, err)
		}
		if vs, ok := q["timeout"]; ok {
			if err := take("timeout", vs[0]); err != nil {
				return 0, err
			}
		}
	}
	return d, nil
}

// jsonStream stands for the gRPC stream of an HTTP/JSON call in its
// context (grpc.NewContextWithServerTransportStream): what the handler
// sets with grpc.SetHeader and grpc.SetTrailer (the router's retry
// pushback) is kept for the HTTP answer, and grpc.Method names the
// route's method.
type jsonStream struct {
	method  string
	mu      sync.Mutex
	trailer metadata.MD
}

var _ grpc.ServerTransportStream = (*jsonStream)(nil)

func (j *jsonStream) Method() string               { return j.method }
func (j *jsonStream) SetHeader(metadata.MD) error  { return nil }
func (j *jsonStream) SendHeader(metadata.MD) error { return nil }
func (j *jsonStream) SetTrailer(md metadata.MD) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.trailer = metadata.Join(j.trailer, md)
	return nil
}

func (j *jsonStream) pushback() (string, bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	if v := j.trailer.Get(pushbackTrailer); len(v) > 0 {
		return v[len(v)-1], true
	}
	return "", false
}

// remoteAddr is an HTTP request's remote address as a net.Addr (the
// peer's address a gRPC handler sees).
type remoteAddr string

func (a remoteAddr) Network() string { return "tcp" }
func (a remoteAddr) String() string  { return string(a) }

// jsonHandler is the HTTP/JSON endpoint's handler: the routes, each
// counted under its path in prism_rpc_requests_total and
// prism_rpc_latency_seconds, anything else 404 under "unknown".
func (s *Server) jsonHandler() http.Handler {
	var policy *auth.Policy
	if s.opts.TLS != nil {
		policy = &auth.Policy{Token: s.opts.BearerToken}
	}
	return http.HandlerFunc(func(w http.ResponseWriter, hr *http.Request) {
		if hr.URL.Path == LivePath || hr.URL.Path == ReadyPath {
			s.healthHTTP(w, hr)
			return
		}
		if h, ok := s.open[hr.URL.Path]; ok {
			h.ServeHTTP(w, hr)
			return
		}
		start := time.Now()
		route, known := s.routes[hr.URL.Path]
		label := unknownMethod
		if known {
			label = route.Path
		}
		defer s.running(label)()
		s.jsonCalls.Add(1)
		defer s.jsonCalls.Done()
		ctx := hr.Context()
		end := func(error) {}
		if known {
			// A caller's W3C traceparent continues its trace here, as
			// otelgrpc does for a gRPC call.
			ctx, end = tracing.HTTPServerSpan(ctx, hr.Method+" "+route.Path, hr.Header)
		}
		var jst *jsonStream
		err := func() error {
			if !known {
				return refuse(http.StatusNotFound, codes.NotFound, "no such path %q: POST a JSON request to %s", hr.URL.Path, strings.Join(s.paths(), " or "))
			}
			if hr.Method != http.MethodPost {
				w.Header().Set("Allow", http.MethodPost)
				return refuse(http.StatusMethodNotAllowed, codes.Unimplemented, "method %s: %s takes POST only", hr.Method, route.Path)
			}
			ctx = callContext(ctx, hr)
			if policy != nil {
				// Before the body is read, as the gRPC server's tap
				// refuses a caller before decoding its message.
				if err := policy.Authorize(ctx, route.FullMethod); err != nil {
					return err
				}
			}
			if ct := hr.Header.Get("Content-Type"); ct != "" {
				if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/json" {
					return refuse(http.StatusUnsupportedMediaType, codes.InvalidArgument, "Content-Type %q: send the request as application/json (curl --json @req.json)", ct)
				}
			}
			timeout, err := ParseTimeout(hr.Header, hr.URL.RawQuery)
			if err != nil {
				return err
			}
			if timeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, timeout)
				defer cancel()
			}
			limit := int64(s.opts.MaxMessageBytes)
			if hr.ContentLength > limit {
				return refuse(http.StatusRequestEntityTooLarge, codes.ResourceExhausted, "request body of %d bytes is over the server's limit of %d (--max-message-bytes)", hr.ContentLength, limit)
			}
			// A client trickling its body holds a handler no longer
			// than its call may take.
			rc := http.NewResponseController(w)
			if d := cmp.Or(timeout, route.DefaultTimeout); d > 0 {
				_ = rc.SetReadDeadline(time.Now().Add(d))
			}
			body, err := readBody(w, hr, limit)
			// Lifted once the body is in: the server's watch for the
			// client going away reads on, and a deadline passing there
			// would cancel the call as a disconnect.
			_ = rc.SetReadDeadline(time.Time{})
			if err != nil {
				return err
			}
			req := route.New()
			if route.Decode != nil {
				req, err = route.Decode(body)
			} else {
				err = protojson.Unmarshal(body, req)
			}
			if err != nil {
				return refuse(http.StatusBadRequest, codes.InvalidArgument, "request body is not a %s in JSON: %v", route.New().ProtoReflect().Descriptor().FullName(), err)
			}
			jst = &jsonStream{method: route.FullMethod}
			resp, err := route.Call(grpc.NewContextWithServerTransportStream(ctx, jst), req)
			if err != nil {
				// A call that ended with its context and says no code
				// of its own is answered by how the context ended, as
				// gRPC answers it.
				if _, ok := status.FromError(err); !ok && ctx.Err() != nil {
					err = status.FromContextError(ctx.Err()).Err()
				}
				return err
			}
			out, err := protojson.Marshal(resp)
			if err != nil {
				return status.Errorf(codes.Internal, "encode the response as JSON: %v", err)
			}
			w.Header().Set("Content-Type", "application/json")
			_ = rc.SetWriteDeadline(time.Now().Add(writeTimeout))
			w.WriteHeader(http.StatusOK)
			_, _ = w.Write(out)
			return nil
		}()
		if err != nil {
			_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(writeTimeout))
			writeJSONError(w, err, jst)
		}
		end(err)
		// Counted under its gRPC code, as a gRPC call is: the alerts and
		// dashboards read one code for both paths.
		s.observeCtx(ctx, label, start, err)
	})
}

// The HTTP/JSON endpoint's health checks, for an HTTP load balancer in
// front of it (which cannot hold a client certificate): LivePath
// answers 200 while the process serves, ReadyPath 200 while the
// server's gRPC health is SERVING (a router: once workers of both tiers
// announced, and until it drains) and 503 otherwise. They say nothing
// but that, so they need no certificate or token.
const (
	LivePath  = "/healthz"
	ReadyPath = "/readyz"
)

// healthHTTP answers LivePath and ReadyPath (GET or HEAD).
func (s *Server) healthHTTP(w http.ResponseWriter, hr *http.Request) {
	if hr.Method != http.MethodGet && hr.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "GET or HEAD", http.StatusMethodNotAllowed)
		return
	}
	code, body := http.StatusOK, "ok\n"
	if hr.URL.Path == ReadyPath {
		resp, err := s.Health.Check(hr.Context(), &healthpb.HealthCheckRequest{})
		if st := resp.GetStatus(); err != nil || st != healthpb.HealthCheckResponse_SERVING {
			code, body = http.StatusServiceUnavailable, strings.ToLower(st.String())+"\n"
		}
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	if hr.Method == http.MethodGet {
		_, _ = io.WriteString(w, body)
	}
}

// paths are the served routes' paths, sorted.
func (s *Server) paths() []string {
	out := make([]string, 0, len(s.routes))
	for p := range s.routes {
		out = append(out, p)
	}
	slices.Sort(out)
	return out
}

// callContext is ctx as a gRPC call of hr's caller would have it: the
// TLS connection's state as its peer (auth reads the certificate from
// it) and the request's headers as incoming metadata (the bearer token
// in authorization).
func callContext(ctx context.Context, hr *http.Request) context.Context {
	p := &peer.Peer{Addr: remoteAddr(hr.RemoteAddr)}
	if hr.TLS != nil {
		p.AuthInfo = credentials.TLSInfo{State: *hr.TLS, CommonAuthInfo: credentials.CommonAuthInfo{SecurityLevel: credentials.PrivacyAndIntegrity}}
	}
	md := metadata.MD{}
	for k, vs := range hr.Header {
		md.Append(strings.ToLower(k), vs...)
	}
	return metadata.NewIncomingContext(peer.NewContext(ctx, p), md)
}

// readBody reads hr's body, up to limit bytes: a longer one is refused
// 413 without reading the rest.
func readBody(w http.ResponseWriter, hr *http.Request, limit int64) ([]byte, error) {
	body, err := io.ReadAll(http.MaxBytesReader(w, hr.Body, limit))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return nil, refuse(http.StatusRequestEntityTooLarge, codes.ResourceExhausted, "request body over the server's limit of %d bytes (--max-message-bytes)", limit)
		}
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return nil, refuse(http.StatusRequestTimeout, codes.DeadlineExceeded, "the request body did not arrive before the call's deadline (%d bytes read)", len(body))
		}
		return nil, refuse(http.StatusBadRequest, codes.InvalidArgument, "read the request body: %v", err)
	}
	return body, nil
}

// writeJSONError answers err as google.rpc.Status's JSON (code by name,
// message), with the HTTP status its code maps to; an overload refusal
// carrying the router's retry pushback (st's trailer) says when to
// retry in Retry-After, in whole seconds rounded up.
func writeJSONError(w http.ResponseWriter, err error, st *jsonStream) {
	s := status.Convert(err)
	code := HTTPStatus(s.Code())
	var r *httpRefusal
	if errors.As(err, &r) {
		code, s = r.status, r.st
	}
	if st != nil {
		if v, ok := st.pushback(); ok {
			w.Header().Set(PushbackHeader, v)
			if ms, err := strconv.ParseInt(v, 10, 64); err == nil && ms >= 0 {
				w.Header().Set("Retry-After", strconv.FormatInt(int64(math.Ceil(float64(ms)/1000)), 10))
			}
		}
	}
	name, ok := rpccode.Code_name[int32(s.Code())]
	if !ok {
		name = fmt.Sprintf("CODE_%d", s.Code())
	}
	b, _ := json.Marshal(jsonError{Code: name, Message: s.Message()})
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	_, _ = w.Write(append(b, '\n'))
}

// writeTimeout bounds writing an answer: a client that stops reading
// does not hold its handler.
const writeTimeout = 10 * time.Second

// jsonServer is the HTTP/JSON endpoint's server: bounded headers and
// header reading time (a slow client cannot hold a connection open
// sending them), idle connections closed; a body's read is bounded by
// its size (readBody) and the call by its deadline.
func (s *Server) jsonServer() *http.Server {
	return &http.Server{
		Handler:           s.jsonHandler(),
		ReadHeaderTimeout: 5 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    maxHeaderListBytes,
		// The server's own complaints (plain HTTP to the HTTPS port, a
		// failed handshake) at debug level, as /metrics' are.
		ErrorLog: slog.NewLogLogger(s.Log.Handler(), slog.LevelDebug),
	}
}

// listenJSON binds the HTTP/JSON listener: TLS with the gRPC server's
// certificate and CA, a client certificate verified when given and not
// required (a caller without one gets 401 from the authorization, not a
// failed handshake, and a bearer token is checked as gRPC checks it).
func listenJSON(o Options) (net.Listener, error) {
	l, err := net.Listen("tcp", o.HTTPAddr)
	if err != nil {
		return nil, err
	}
	if o.TLS != nil {
		l = tls.NewListener(l, MetricsTLS(o.TLS, false))
	}
	return l, nil
}
