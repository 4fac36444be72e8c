package cli

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/internal/auth"
	"github.com/prism-serve/prism/internal/serve"
	"github.com/prism-serve/prism/loadgen"
)

// TestHTTPHeadersAreTheRouters: the header names the sender uses are
// the router's (loadgen repeats them so its core needs no internal
// package).
func TestHTTPHeadersAreTheRouters(t *testing.T) {
	if loadgen.TimeoutHeader != serve.TimeoutHeader || loadgen.PushbackHeader != serve.PushbackHeader {
		t.Fatalf("loadgen's %q %q, the router's %q %q", loadgen.TimeoutHeader, loadgen.PushbackHeader, serve.TimeoutHeader, serve.PushbackHeader)
	}
}

// TestHTTPTarget: --target as a URL of scheme http or https is the
// HTTP/JSON endpoint, /v1/recommend unless given; every other target is
// gRPC's, unchanged.
func TestHTTPTarget(t *testing.T) {
	for _, tc := range []struct{ target, want, err string }{
		{"127.0.0.1:8500", "", ""},
		{"dns:///router.prism:8500", "", ""},
		{"unix:///tmp/prism.sock", "", ""},
		{"https://127.0.0.1:8501", "https://127.0.0.1:8501/v1/recommend", ""},
		{"https://127.0.0.1:8501/", "https://127.0.0.1:8501/v1/recommend", ""},
		{"HTTPS://127.0.0.1:8501/v1/recommend", "https://127.0.0.1:8501/v1/recommend", ""},
		{"http://router:8501/prism/v1/recommend?timeout=1s", "http://router:8501/prism/v1/recommend?timeout=1s", ""},
		{"https://127.0.0.1:8501/v1/other", "", `the path "/v1/other" is not the router's HTTP/JSON Recommend`},
		{"https://:8501", "", "no host"},
		{"https://user:secret@127.0.0.1:8501", "", "no credentials in the URL"},
	} {
		got, err := httpTarget(tc.target)
		if got != tc.want || (err == nil) != (tc.err == "") || err != nil && !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%q: %q, %v; want %q, %q", tc.target, got, err, tc.want, tc.err)
		}
		if err != nil && strings.Contains(err.Error(), "secret") {
			t.Errorf("%q: the error shows the password: %v", tc.target, err)
		}
	}
}

// TestLoadgenCLIHTTP: the command over HTTP/JSON against the fake's
// HTTP handler: plain HTTP with --insecure, a pooled closed loop in
// which every send arrives once with its own request id, an open-loop
// run with --trace-ratio whose traceparent arrives as a header, and a
// find-max search; flags that do not apply over HTTP/JSON are refused.
func TestLoadgenCLIHTTP(t *testing.T) {
	var mu sync.Mutex
	ids := map[string]int{}
	traced := 0
	f := &loadgen.Fake{Delay: func(req *prismv1.RecommendRequest) time.Duration {
		mu.Lock()
		ids[req.RequestId]++
		mu.Unlock()
		return 0
	}}
	h := f.HTTPHandler()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, hr *http.Request) {
		if hr.Header.Get("Traceparent") != "" {
			mu.Lock()
			traced++
			mu.Unlock()
		}
		h.ServeHTTP(w, hr)
	}))
	defer srv.Close()

	out, err := runCLI(t, "--target", srv.URL, "--insecure", "--model", "dlrm-tiny", "--clients", "4", "--pool", "8", "--max-requests", "100",
		"--duration", "10s", "--candidates", "uniform:10-20", "--context-inputs", "dense", "--quiet")
	if err != nil || !strings.Contains(out, "sent 100  ok 100  errors 0") || !strings.Contains(out, "loadgen: "+srv.URL+"/v1/recommend, closed-loop") {
		t.Fatalf("%v\n%s", err, out)
	}
	mu.Lock()
	for i := 1; i <= 100; i++ {
		if id := fmt.Sprintf("lg-%d", i); ids[id] != 1 {
			t.Fatalf("request %s arrived %d times", id, ids[id])
		}
	}
	mu.Unlock()

	dir := t.TempDir()
	out, err = runCLI(t, "--target", srv.URL+"/v1/recommend", "--insecure", "--model", "dlrm-tiny", "--rate", "40", "--duration", "500ms",
		"--candidates", "4", "--trace-ratio", "1", "--quiet", "--out", dir)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	sum := readSummary(t, dir)
	mu.Lock()
	if sum.Sent == 0 || sum.OK != sum.Sent || int64(traced) != sum.Sent {
		t.Fatalf("sent %d ok %d, %d arrived with a traceparent\n%s", sum.Sent, sum.OK, traced, out)
	}
	mu.Unlock()

	out, err = runCLI(t, "--target", srv.URL, "--insecure", "--model", "dlrm-tiny", "--find-max", "--rate", "50", "--find-max-trial", "300ms",
		"--find-max-trials", "2", "--candidates", "5", "--slo", "1s", "--find-max-warmup", "0s", "--pool", "16")
	if err != nil || !regexp.MustCompile(`find-max: ([0-9.]+ req/s is the highest rate|at least [0-9.]+ req/s: every trial met p99 under 1s) .*\(2 trials of 300ms`).MatchString(out) {
		t.Fatalf("find-max over HTTP/JSON: %v\n%s", err, out)
	}

	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--target", srv.URL}, "is plain HTTP, which only a router started with --insecure serves"},
		{[]string{"--target", "https://127.0.0.1:1", "--insecure"}, "--insecure is plain HTTP: give http://HOST:PORT with --insecure"},
		{[]string{"--target", "https://127.0.0.1:1"}, "TLS is on by default: give --certs DIR"},
		{[]string{"--target", "https://127.0.0.1:1/v2/x", "--insecure"}, `the path "/v2/x" is not the router's HTTP/JSON Recommend`},
		{[]string{"--target", srv.URL, "--insecure", "--update-rate", "5", "--plan", "x"}, "--update-rate: the update stream is the Embeddings service's, which the router serves over gRPC alone"},
		{[]string{"--target", srv.URL, "--insecure", "--retries", "2", "--retry-mode", "grpc"}, "--retry-mode grpc is grpc-go's own retries, which an HTTP/JSON --target does not use"},
		{[]string{"--target", srv.URL, "--insecure", "--auth-token-file", "x"}, "--auth-token-file needs TLS"},
		// Nobody there: the run says why, as over gRPC.
		{[]string{"--target", "http://127.0.0.1:1", "--insecure", "--duration", "300ms", "--rate", "20", "--timeout", "200ms"}, "none of"},
	} {
		out, err := runCLI(t, append(c.args, "--model", "dlrm-tiny", "--quiet")...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Fatalf("%v: error %v, want %q\n%s", c.args, err, c.want, out)
		}
		if c.want == "none of" && !strings.Contains(err.Error(), "the first Unavailable: ") {
			t.Fatalf("nobody there: %v", err)
		}
	}
}

// TestLoadgenCLIHTTPS: over HTTPS the generator presents the admin
// certificate of --certs and verifies the server's router certificate
// (a certificate of another role is refused, as over gRPC), over HTTP/2
// as the router's listener offers it; with
// --tls-ca and --auth-token-file it presents none and sends the token.
func TestLoadgenCLIHTTPS(t *testing.T) {
	certs := t.TempDir()
	if err := auth.InitCerts(certs, auth.CertOptions{}); err != nil {
		t.Fatal(err)
	}
	token := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(token, []byte("0123456789abcdef0123456789abcdef\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	serveAs := func(role auth.Role) (string, func() (roles []auth.Role, tokens []string)) {
		c, err := auth.ServerTLS(auth.FilesFor(certs, role), auth.ServerTLSOptions{AllowNoClientCert: true})
		if err != nil {
			t.Fatal(err)
		}
		var mu sync.Mutex
		var roles []auth.Role
		var tokens []string
		h := (&loadgen.Fake{}).HTTPHandler()
		srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, hr *http.Request) {
			mu.Lock()
			var r auth.Role
			if len(hr.TLS.PeerCertificates) > 0 {
				r = auth.RoleOf(hr.TLS.PeerCertificates[0])
			}
			roles = append(roles, r)
			tokens = append(tokens, hr.Header.Get("Authorization"))
			mu.Unlock()
			if hr.ProtoMajor != 2 {
				t.Errorf("%s, want HTTP/2 over TLS", hr.Proto)
			}
			h.ServeHTTP(w, hr)
		}))
		srv.TLS = serve.MetricsTLS(c, false) // the HTTP/JSON listener's, as the router's
		srv.EnableHTTP2 = true
		srv.StartTLS()
		t.Cleanup(srv.Close)
		u := strings.Replace(srv.URL, "https://127.0.0.1", "https://localhost", 1)
		return u, func() ([]auth.Role, []string) { mu.Lock(); defer mu.Unlock(); return roles, tokens }
	}
	router, seen := serveAs(auth.Router)
	out, err := runCLI(t, "--target", router, "--certs", certs, "--model", "dlrm-tiny", "--clients", "2", "--max-requests", "10", "--duration", "10s", "--candidates", "3", "--quiet")
	if err != nil || !strings.Contains(out, "sent 10  ok 10  errors 0") {
		t.Fatalf("--certs: %v\n%s", err, out)
	}
	roles, tokens := seen()
	if len(roles) != 10 || roles[0] != auth.Admin || tokens[0] != "" {
		t.Fatalf("--certs: the server saw roles %v, tokens %q", roles, tokens)
	}
	out, err = runCLI(t, "--target", router, "--tls-ca", auth.FilesFor(certs, auth.Admin).CA, "--auth-token-file", token, "--model", "dlrm-tiny", "--clients", "2", "--max-requests", "10", "--duration", "10s", "--candidates", "3", "--quiet")
	if err != nil || !strings.Contains(out, "sent 10  ok 10  errors 0") {
		t.Fatalf("token: %v\n%s", err, out)
	}
	roles, tokens = seen()
	if len(roles) != 20 || roles[10] != "" || tokens[10] != "Bearer 0123456789abcdef0123456789abcdef" {
		t.Fatalf("token: the server saw roles %v, tokens %q", roles[10:], tokens[10:])
	}

	dense, seenDense := serveAs(auth.Dense)
	out, err = runCLI(t, "--target", dense, "--certs", certs, "--model", "dlrm-tiny", "--clients", "1", "--max-requests", "3", "--duration", "5s", "--candidates", "3", "--quiet")
	if err == nil || !strings.Contains(err.Error(), `server certificate has role "dense"`) {
		t.Fatalf("a server of another role: %v\n%s", err, out)
	}
	if roles, _ := seenDense(); len(roles) != 0 {
		t.Fatalf("the dense server got %d requests", len(roles))
	}
}
