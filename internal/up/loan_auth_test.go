package up

import (
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"testing"

	"github.com/prism-serve/prism/internal/auth"
	"github.com/prism-serve/prism/internal/serve"
)

// TestLoanReclaimNeedsAdmin: prism up --loan's controller served POST
// /loan/reclaim over plain HTTP to anyone who reached its port (a reclaim
// drains a dense worker). Under TLS it now serves HTTPS with the
// router's certificate: reads for any client of the CA (or none), a
// reclaim for an admin certificate only.
func TestLoanReclaimNeedsAdmin(t *testing.T) {
	dir := t.TempDir()
	if err := auth.InitCerts(dir, auth.CertOptions{}); err != nil {
		t.Fatal(err)
	}
	st, err := auth.ServerTLS(auth.FilesFor(dir, auth.Router), auth.ServerTLSOptions{AllowNoClientCert: true})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	reclaims := 0
	mux := http.NewServeMux()
	mux.HandleFunc("GET /loan", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "{}") })
	mux.HandleFunc("POST /loan/reclaim", func(w http.ResponseWriter, r *http.Request) { reclaims++; io.WriteString(w, "w1\n") })
	srv := &http.Server{Handler: adminWrites(mux)}
	go srv.Serve(tls.NewListener(lis, serve.MetricsTLS(st, false)))
	t.Cleanup(func() { srv.Close() })
	base := "https://" + lis.Addr().String()

	client := func(role auth.Role) *http.Client {
		t.Helper()
		f := auth.Files{CA: auth.FilesFor(dir, auth.Admin).CA}
		if role != "" {
			f = auth.FilesFor(dir, role)
		}
		c, err := auth.ScrapeTLS(f, auth.Router)
		if err != nil {
			t.Fatal(err)
		}
		return &http.Client{Transport: &http.Transport{TLSClientConfig: c}}
	}
	for _, tc := range []struct {
		name   string
		role   auth.Role // "": the CA alone, no certificate
		method string
		want   int
	}{
		{"read, no certificate", "", http.MethodGet, http.StatusOK},
		{"read, dense", auth.Dense, http.MethodGet, http.StatusOK},
		{"reclaim, no certificate", "", http.MethodPost, http.StatusUnauthorized},
		{"reclaim, dense", auth.Dense, http.MethodPost, http.StatusForbidden},
		{"reclaim, router", auth.Router, http.MethodPost, http.StatusForbidden},
		{"reclaim, admin", auth.Admin, http.MethodPost, http.StatusOK},
	} {
		path := "/loan"
		if tc.method == http.MethodPost {
			path = "/loan/reclaim"
		}
		req, _ := http.NewRequest(tc.method, base+path, nil)
		resp, err := client(tc.role).Do(req)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("%s: %s %s, want %d", tc.name, resp.Status, b, tc.want)
		}
	}
	if reclaims != 1 {
		t.Errorf("%d reclaims reached the handler, want 1 (the admin's)", reclaims)
	}
	// Plain HTTP to the HTTPS port reaches nothing.
	if resp, err := http.Post("http://"+lis.Addr().String()+"/loan/reclaim", "", nil); err == nil {
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			t.Error("a plain HTTP reclaim was served")
		}
	}
	if reclaims != 1 {
		t.Errorf("%d reclaims reached the handler after a plain HTTP one, want 1", reclaims)
	}
}
