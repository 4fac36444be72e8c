package auth

import (
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// TestExpiryCollector: a process's /metrics says when its certificate
// and CA expire, so an operator can alert on a renewal that did not
// come; the only sign was a log line on a handshake, at most daily.
// The certificate here expires within the hour, before any other this
// package's tests make, so it is the earliest.
func TestExpiryCollector(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "certs")
	if err := InitCerts(dir, CertOptions{Validity: 24 * time.Hour, Now: func() time.Time { return time.Now().Add(-23 * time.Hour) }}); err != nil {
		t.Fatal(err)
	}
	f := FilesFor(dir, Router)
	c, err := ServerTLS(f, ServerTLSOptions{})
	if err != nil {
		t.Fatal(err)
	}
	runtime.GC() // other tests' configurations, dropped, are not reported
	want := map[string]float64{"certificate": notAfter(t, f.Cert), "ca": notAfter(t, f.CA)}
	reg := prometheus.NewRegistry()
	reg.MustRegister(ExpiryCollector())
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "prism_tls_certificate_expiry_timestamp_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			got[m.GetLabel()[0].GetValue()] = m.GetGauge().GetValue()
		}
	}
	if len(got) != 2 || got["certificate"] != want["certificate"] || got["ca"] != want["ca"] {
		t.Errorf("prism_tls_certificate_expiry_timestamp_seconds %v, want %v", got, want)
	}
	runtime.KeepAlive(c)
}

// notAfter is the Unix time the first certificate of file expires.
func notAfter(t *testing.T, file string) float64 {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(b)
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return float64(c.NotAfter.Unix())
}
