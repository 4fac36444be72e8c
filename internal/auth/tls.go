package auth

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc/credentials"
)

// ServerTLSOptions configure ServerTLS.
type ServerTLSOptions struct {
	// AllowNoClientCert accepts clients without a certificate (the
	// router when a bearer token admits them to Recommend); a
	// certificate a client does present is still verified. The
	// authorization table then decides per method.
	AllowNoClientCert bool
}

// ServerTLS is the TLS 1.3 configuration a tier serves with: f's
// certificate, and client certificates required and verified against
// f's CA.
func ServerTLS(f Files, o ServerTLSOptions) (*tls.Config, error) {
	r, err := newReloader(f, true)
	if err != nil {
		return nil, err
	}
	base := &tls.Config{
		MinVersion: tls.VersionTLS13,
		ClientAuth: tls.RequireAndVerifyClientCert,
	}
	if o.AllowNoClientCert {
		base.ClientAuth = tls.VerifyClientCertIfGiven
	}
	with := func(c *tls.Config, id identity) *tls.Config {
		c.Certificates, c.ClientCAs = []tls.Certificate{*id.cert}, id.pool
		return c
	}
	c := with(base.Clone(), r.cur)
	// Each handshake takes the files as last loaded: rewritten on disk
	// (a renewal), they are loaded again without a restart. A caller
	// that changes a field of c (MetricsTLS) changes it in what this
	// returns too (ServerConfigFor).
	c.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		return with(base.Clone(), r.get()), nil
	}
	return c, nil
}

// ServerConfigFor is c (a ServerTLS configuration, or a clone of one)
// with its fields set by set, also in the configuration each handshake
// takes (GetConfigForClient).
func ServerConfigFor(c *tls.Config, set func(*tls.Config)) *tls.Config {
	c = c.Clone()
	set(c)
	if get := c.GetConfigForClient; get != nil {
		c.GetConfigForClient = func(h *tls.ClientHelloInfo) (*tls.Config, error) {
			cc, err := get(h)
			if err != nil || cc == nil {
				return cc, err
			}
			cc = cc.Clone()
			set(cc)
			return cc, nil
		}
	}
	return c
}

// ClientTLS is the TLS 1.3 configuration a process dials with: f's
// certificate as its identity (none when f.Cert and f.Key are empty: a
// client that authenticates by bearer token), the server verified
// against f's CA and, when serverRoles are given, refused unless its
// certificate carries one of them (the embedding tier sends cut tensors
// only to a dense worker).
func ClientTLS(f Files, serverRoles ...Role) (*tls.Config, error) {
	c, _, err := clientTLS(f, serverRoles)
	return c, err
}

// clientTLS is ClientTLS and the reloader its certificate comes from:
// the certificate last loaded from f's files, which are loaded again
// when rewritten on disk (a renewal), without a restart. Its RootCAs
// are the CA as loaded now; ClientCredentials and ScrapeTLS verify
// against the CA as last loaded.
func clientTLS(f Files, serverRoles []Role) (*tls.Config, *reloader, error) {
	withCert := f.Cert != "" || f.Key != ""
	r, err := newReloader(f, withCert)
	if err != nil {
		return nil, nil, err
	}
	c := &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: r.cur.pool}
	if withCert {
		c.Certificates = []tls.Certificate{*r.cur.cert}
		c.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return r.get().cert, nil
		}
	}
	if len(serverRoles) > 0 {
		want := slices.Clone(serverRoles)
		c.VerifyConnection = func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return errors.New("server presented no certificate")
			}
			if r := RoleOf(cs.PeerCertificates[0]); !slices.Contains(want, r) {
				return fmt.Errorf("server certificate has role %q, want one of %v", r, want)
			}
			return nil
		}
	}
	return c, r, nil
}

// ClientCredentials are the gRPC transport credentials of ClientTLS
// whose certificate and CA follow f's files: each handshake verifies
// the server against the CA as last loaded, so that a CA rewritten on
// disk (a renewal, or a new CA added to the bundle) is trusted without
// a restart. Each Write on its connections goes to the socket in one
// write, whatever the TLS records it makes (coalesce.go).
func ClientCredentials(f Files, serverRoles ...Role) (credentials.TransportCredentials, error) {
	c, r, err := clientTLS(f, serverRoles)
	if err != nil {
		return nil, err
	}
	return &reloadingCreds{TransportCredentials: credentials.NewTLS(c), base: c, r: r}, nil
}

// reloadingCreds are TLS credentials whose RootCAs are the reloader's
// at each handshake.
type reloadingCreds struct {
	credentials.TransportCredentials
	base *tls.Config
	r    *reloader
}

func (c *reloadingCreds) ClientHandshake(ctx context.Context, authority string, conn net.Conn) (net.Conn, credentials.AuthInfo, error) {
	cfg := c.base.Clone()
	cfg.RootCAs = c.r.get().pool
	// Each Write's records in one write to the socket (coalesce.go).
	return coalescing(conn, func(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
		return credentials.NewTLS(cfg).ClientHandshake(ctx, authority, raw)
	})
}

func (c *reloadingCreds) Clone() credentials.TransportCredentials {
	return &reloadingCreds{TransportCredentials: c.TransportCredentials.Clone(), base: c.base.Clone(), r: c.r}
}

// load reads f's CA and, when withCert, its certificate and key.
func load(f Files, withCert bool) (tls.Certificate, *x509.CertPool, error) {
	var cert tls.Certificate
	if f.CA == "" {
		return cert, nil, errors.New("no CA certificate file given")
	}
	caPEM, err := os.ReadFile(f.CA)
	if err != nil {
		return cert, nil, fmt.Errorf("read CA: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return cert, nil, fmt.Errorf("CA %s: no PEM certificate in it", f.CA)
	}
	if !withCert {
		return cert, pool, nil
	}
	if f.Cert == "" || f.Key == "" {
		return cert, nil, errors.New("a certificate needs both its file and its key file")
	}
	if cert, err = tls.LoadX509KeyPair(f.Cert, f.Key); err != nil {
		return cert, nil, fmt.Errorf("certificate %s with key %s: %w", f.Cert, f.Key, err)
	}
	// Out of date, every peer would refuse it, saying why in its own
	// log only, while this process looked healthy.
	leaf := cert.Leaf
	if leaf == nil {
		if leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return cert, nil, fmt.Errorf("certificate %s: %w", f.Cert, err)
		}
	}
	switch t := now(); {
	case t.After(leaf.NotAfter):
		return cert, nil, fmt.Errorf("certificate %s expired at %s: make new certificates (prism certs init DIR, a new folder)", f.Cert, leaf.NotAfter.UTC().Format(time.RFC3339))
	case t.Before(leaf.NotBefore):
		return cert, nil, fmt.Errorf("certificate %s is not valid before %s (this host's clock says %s)", f.Cert, leaf.NotBefore.UTC().Format(time.RFC3339), t.UTC().Format(time.RFC3339))
	}
	return cert, pool, nil
}

// ScrapeTLS is the configuration an HTTPS client scraping a tier's
// /metrics dials with: f's certificate (none when f has only the CA),
// the server's certificate verified against f's CA and required to carry
// one of serverRoles, but not checked against the host name: a scraper
// reaches the routers of a headless Service by their addresses, which
// their certificates need not list (the role is the identity, as
// between the tiers).
func ScrapeTLS(f Files, serverRoles ...Role) (*tls.Config, error) {
	c, r, err := clientTLS(f, serverRoles)
	if err != nil {
		return nil, err
	}
	roleCheck := c.VerifyConnection
	c.InsecureSkipVerify = true // replaced by the verification below
	c.VerifyConnection = func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return errors.New("server presented no certificate")
		}
		inter := x509.NewCertPool()
		for _, ic := range cs.PeerCertificates[1:] {
			inter.AddCert(ic)
		}
		if _, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: r.get().pool, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
			return fmt.Errorf("server certificate: %w", err)
		}
		if roleCheck != nil {
			return roleCheck(cs)
		}
		return nil
	}
	return c, nil
}

// MismatchHint explains the connection errors of a client and a server
// that disagree on TLS, which name neither: a plaintext client reads a
// TLS server's first bytes as no HTTP/2 preface, a TLS client gets no
// handshake from a plaintext server. "" for other errors; else a
// parenthesised hint with a leading space.
func MismatchHint(msg string) string {
	switch {
	case strings.Contains(msg, "server preface") && !strings.Contains(msg, "tls:"):
		// (With "tls:" it is a TLS alert read in the preface's place: a
		// certificate refused, not a plaintext client.)
		return " (a plaintext client, --insecure, against a server that serves TLS? give --certs DIR instead)"
	case strings.Contains(msg, "first record does not look like a TLS handshake"):
		return " (a TLS client against a server started with --insecure? give --insecure too)"
	}
	return ""
}
