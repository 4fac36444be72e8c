package auth

import (
	"bytes"
	"context"
	"crypto/tls"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/credentials"
)

// syncBuffer is a log a test reads while servers write it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// captureLog sends this package's log to a buffer and checks the files
// at every handshake, for the test.
func captureLog(t *testing.T) *syncBuffer {
	var b syncBuffer
	old, oldInterval := logger.Load(), ReloadInterval
	SetLogger(slog.New(slog.NewTextHandler(&b, nil)))
	ReloadInterval = 0
	t.Cleanup(func() { logger.Store(old); ReloadInterval = oldInterval })
	return &b
}

// copyFiles writes src's certificate, key and CA (the CA files of cas
// concatenated: a bundle) over dst's, in place, as a renewal does.
func copyFiles(t *testing.T, dst, src Files, cas ...string) {
	t.Helper()
	read := func(p string) []byte {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	var bundle []byte
	for _, ca := range cas {
		bundle = append(bundle, read(ca)...)
	}
	for _, w := range []struct {
		path string
		data []byte
	}{{dst.Cert, read(src.Cert)}, {dst.Key, read(src.Key)}, {dst.CA, bundle}} {
		if err := os.WriteFile(w.path, w.data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// Past the file system's time stamp granularity.
	time.Sleep(20 * time.Millisecond)
}

func workFiles(t *testing.T, name string) Files {
	d := filepath.Join(t.TempDir(), name)
	if err := os.Mkdir(d, 0o700); err != nil {
		t.Fatal(err)
	}
	return FolderFiles(d)
}

// tlsServer serves ServerTLS(f) on loopback and reports the client
// certificate of each handshake (nil when refused).
func tlsServer(t *testing.T, f Files) (addr string, clients chan []byte) {
	conf, err := ServerTLS(f, ServerTLSOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// gRPC's ALPN, set as serve.MetricsTLS sets its fields.
	conf = ServerConfigFor(conf, func(c *tls.Config) { c.NextProtos = []string{"h2"} })
	lis, err := tls.Listen("tcp", "127.0.0.1:0", conf)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lis.Close() })
	clients = make(chan []byte, 16)
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			tc := c.(*tls.Conn)
			tc.SetDeadline(time.Now().Add(5 * time.Second))
			if err := tc.Handshake(); err != nil {
				clients <- nil
			} else {
				clients <- tc.ConnectionState().PeerCertificates[0].Raw
				tc.Write([]byte{1}) // the client reads it: the server accepted it
			}
			tc.Close()
		}
	}()
	return lis.Addr().String(), clients
}

func certDER(t *testing.T, f Files) []byte {
	c, err := tls.LoadX509KeyPair(f.Cert, f.Key)
	if err != nil {
		t.Fatal(err)
	}
	return c.Certificate[0]
}

// TestCertificateReload: a running server and client pick up
// certificates and CAs rewritten in place (a renewal, a move to a new
// CA through a bundle) at their next handshake, without a restart; a
// bad rewrite (half written) is logged and the previous certificate
// kept.
func TestCertificateReload(t *testing.T) {
	log := captureLog(t)
	root := t.TempDir()
	a, b := filepath.Join(root, "a"), filepath.Join(root, "b")
	for _, d := range []string{a, b} {
		if err := InitCerts(d, CertOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	srvFiles, cliFiles := workFiles(t, "router"), workFiles(t, "admin")
	copyFiles(t, srvFiles, FilesFor(a, Router), FilesFor(a, Router).CA)
	copyFiles(t, cliFiles, FilesFor(a, Admin), FilesFor(a, Admin).CA)
	addr, clients := tlsServer(t, srvFiles)
	creds, err := ClientCredentials(cliFiles, Router)
	if err != nil {
		t.Fatal(err)
	}
	// handshake dials the server with creds, made once: the server's
	// certificate, and the client's as the server saw it.
	handshake := func() (server, client []byte, err error) {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		tc, info, err := creds.ClientHandshake(ctx, addr, conn)
		if err == nil {
			_, err = tc.Read(make([]byte, 1))
		}
		got := <-clients
		if err != nil {
			return nil, nil, err
		}
		return info.(credentials.TLSInfo).State.PeerCertificates[0].Raw, got, nil
	}
	for i, step := range []struct {
		name       string
		rewrite    func()
		wantServer Files // "" for a refused handshake
		wantClient Files
		wantLog    string
	}{
		{"as started", func() {}, FilesFor(a, Router), FilesFor(a, Admin), ""},
		{"server renewed, server trusts both CAs", func() {
			copyFiles(t, srvFiles, FilesFor(b, Router), FilesFor(a, Router).CA, FilesFor(b, Router).CA)
		}, Files{}, Files{}, "reloaded certificate files"},
		{"client trusts the new CA too", func() {
			copyFiles(t, cliFiles, FilesFor(a, Admin), FilesFor(a, Admin).CA, FilesFor(b, Admin).CA)
		}, FilesFor(b, Router), FilesFor(a, Admin), "reloaded certificate files"},
		{"client renewed", func() {
			copyFiles(t, cliFiles, FilesFor(b, Admin), FilesFor(b, Admin).CA)
		}, FilesFor(b, Router), FilesFor(b, Admin), "reloaded certificate files"},
		{"server's certificate half written", func() {
			whole, err := os.ReadFile(FilesFor(a, Router).Cert)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(srvFiles.Cert, whole[:len(whole)/2], 0o600); err != nil {
				t.Fatal(err)
			}
			time.Sleep(20 * time.Millisecond)
		}, FilesFor(b, Router), FilesFor(b, Admin), "do not load: still using the previous ones"},
		{"server's key of another certificate", func() {
			copyFiles(t, srvFiles, FilesFor(b, Router), FilesFor(b, Router).CA)
			if err := os.WriteFile(srvFiles.Key, mustRead(t, FilesFor(a, Router).Key), 0o600); err != nil {
				t.Fatal(err)
			}
			time.Sleep(20 * time.Millisecond)
		}, FilesFor(b, Router), FilesFor(b, Admin), "private key does not match public key"},
		{"server's certificate of a CA it does not hold", func() {
			copyFiles(t, srvFiles, FilesFor(a, Router), FilesFor(b, Router).CA)
		}, FilesFor(b, Router), FilesFor(b, Admin), "does not chain to CA " + srvFiles.CA},
		{"server renewed back", func() {
			copyFiles(t, srvFiles, FilesFor(a, Router), FilesFor(b, Router).CA, FilesFor(a, Router).CA)
			copyFiles(t, cliFiles, FilesFor(b, Admin), FilesFor(b, Admin).CA, FilesFor(a, Admin).CA)
		}, FilesFor(a, Router), FilesFor(b, Admin), "reloaded certificate files"},
	} {
		before := len(log.String())
		step.rewrite()
		server, client, err := handshake()
		switch {
		case step.wantServer == Files{}:
			if err == nil {
				t.Errorf("%d %s: the handshake succeeded, want refused", i, step.name)
			}
		case err != nil:
			t.Errorf("%d %s: %v", i, step.name, err)
		case !bytes.Equal(server, certDER(t, step.wantServer)):
			t.Errorf("%d %s: the server presented another certificate than %s", i, step.name, step.wantServer.Cert)
		case !bytes.Equal(client, certDER(t, step.wantClient)):
			t.Errorf("%d %s: the client presented another certificate than %s", i, step.name, step.wantClient.Cert)
		}
		if got := log.String()[before:]; !strings.Contains(got, step.wantLog) {
			t.Errorf("%d %s: log %q, want %q", i, step.name, got, step.wantLog)
		}
	}
	// A failed rewrite is logged once, not at every handshake.
	before := len(log.String())
	handshake()
	if got := log.String()[before:]; got != "" {
		t.Errorf("logged again with no change: %q", got)
	}
}

func mustRead(t *testing.T, p string) []byte {
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestReloadInterval: the files are checked at most once per
// ReloadInterval, not at every handshake.
func TestReloadInterval(t *testing.T) {
	log := captureLog(t)
	ReloadInterval = time.Hour
	root := t.TempDir()
	a, b := filepath.Join(root, "a"), filepath.Join(root, "b")
	for _, d := range []string{a, b} {
		if err := InitCerts(d, CertOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	f := workFiles(t, "router")
	copyFiles(t, f, FilesFor(a, Router), FilesFor(a, Router).CA)
	r, err := newReloader(f, true)
	if err != nil {
		t.Fatal(err)
	}
	copyFiles(t, f, FilesFor(b, Router), FilesFor(b, Router).CA)
	if got := r.get().cert.Certificate[0]; !bytes.Equal(got, certDER(t, FilesFor(a, Router))) {
		t.Error("reloaded within the interval")
	}
	r.checked = time.Now().Add(-time.Hour)
	if got := r.get().cert.Certificate[0]; !bytes.Equal(got, certDER(t, FilesFor(b, Router))) {
		t.Errorf("not reloaded after the interval; log %q", log.String())
	}
}

// TestExpiryWarning: a process whose certificate (or CA) expires soon
// says so in its log when it loads it, naming the file and the date.
func TestExpiryWarning(t *testing.T) {
	for _, tc := range []struct {
		name     string
		validity time.Duration
		age      time.Duration
		warn     bool
	}{
		{"fresh two-year certificate", 2 * 365 * 24 * time.Hour, 0, false},
		{"two-year certificate with 10 days left", 2 * 365 * 24 * time.Hour, 2*365*24*time.Hour - 10*24*time.Hour, true},
		{"90-day certificate at cert-manager's renewal", 90 * 24 * time.Hour, 60 * 24 * time.Hour, false},
		{"90-day certificate with 5 days left", 90 * 24 * time.Hour, 85 * 24 * time.Hour, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			log := captureLog(t)
			dir := filepath.Join(t.TempDir(), "certs")
			if err := InitCerts(dir, CertOptions{Validity: tc.validity, Now: func() time.Time { return time.Now().Add(-tc.age) }}); err != nil {
				t.Fatal(err)
			}
			f := FilesFor(dir, Router)
			if _, err := ServerTLS(f, ServerTLSOptions{}); err != nil {
				t.Fatal(err)
			}
			got := log.String()
			if warned := strings.Contains(got, "expires soon") && strings.Contains(got, f.Cert); warned != tc.warn {
				t.Errorf("log %q, want a warning naming %s: %v", got, f.Cert, tc.warn)
			}
		})
	}
}

// TestReloadNotValidYet: a renewal made by an issuer whose clock is ahead
// of this host's (or this host's behind) is not valid yet here when it
// is written: it is refused and logged once, the old certificate kept,
// and it loads once this host's clock passes its start. It was never
// loaded again (its files did not change after the refusal), and the
// process served with the old certificate until that expired.
func TestReloadNotValidYet(t *testing.T) {
	log := captureLog(t)
	var ahead time.Duration // how far this host's clock has moved on
	old := now
	now = func() time.Time { return time.Now().Add(ahead) }
	t.Cleanup(func() { now = old })
	root := t.TempDir()
	a, b := filepath.Join(root, "a"), filepath.Join(root, "b")
	if err := InitCerts(a, CertOptions{}); err != nil {
		t.Fatal(err)
	}
	// b's issuer's clock is ahead by more than Backdate: b starts in an hour.
	if err := InitCerts(b, CertOptions{Now: func() time.Time { return time.Now().Add(Backdate + time.Hour) }}); err != nil {
		t.Fatal(err)
	}
	f := workFiles(t, "router")
	copyFiles(t, f, FilesFor(a, Router), FilesFor(a, Router).CA)
	r, err := newReloader(f, true)
	if err != nil {
		t.Fatal(err)
	}
	copyFiles(t, f, FilesFor(b, Router), FilesFor(a, Router).CA, FilesFor(b, Router).CA)
	for i := range 3 {
		if got := r.get().cert.Certificate[0]; !bytes.Equal(got, certDER(t, FilesFor(a, Router))) {
			t.Fatalf("check %d: the renewal was taken before its start", i)
		}
	}
	if n := strings.Count(log.String(), "do not load"); n != 1 {
		t.Errorf("the refusal logged %d times, want once: %q", n, log.String())
	}
	ahead = time.Hour + time.Minute
	if got := r.get().cert.Certificate[0]; !bytes.Equal(got, certDER(t, FilesFor(b, Router))) {
		t.Errorf("the renewal is not taken once this host's clock passed its start; log %q", log.String())
	}
}

// TestExpiryWarningOncePerProcess: a process loading one expiring
// certificate into several configurations (a router's server, its
// clients of each tier) warns of it once a day, not once per
// configuration (four lines at a router's start).
func TestExpiryWarningOncePerProcess(t *testing.T) {
	log := captureLog(t)
	dir := filepath.Join(t.TempDir(), "certs")
	if err := InitCerts(dir, CertOptions{Validity: 90 * 24 * time.Hour, Now: func() time.Time { return time.Now().Add(-85 * 24 * time.Hour) }}); err != nil {
		t.Fatal(err)
	}
	f := FilesFor(dir, Router)
	for range 2 {
		if _, err := ServerTLS(f, ServerTLSOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := ClientTLS(f, Embedding); err != nil {
			t.Fatal(err)
		}
	}
	n := 0
	for _, line := range strings.Split(log.String(), "\n") {
		if strings.Contains(line, "expires soon") && strings.Contains(line, "certificate "+f.Cert) {
			n++
		}
	}
	if n != 1 {
		t.Fatalf("%d warnings of %s from four configurations, want 1:\n%s", n, f.Cert, log.String())
	}
}
