// Package auth is Prism's identity and authorization: a development CA
// and per-role certificates (InitCerts, what `prism certs init` runs), the
// TLS 1.3 configurations every tier serves and dials with (mutual TLS,
// both sides verified against the cluster CA), the caller's role read
// from its verified certificate (Peer), and one table of which roles may
// call which RPC (policy.go), enforced by interceptors that
// internal/serve installs whenever a tier serves over TLS.
//
// A role travels in the certificate as a URI SAN,
// spiffe://prism/role/ROLE (the subject's OU and CN repeat it for
// people reading the certificate); only the URI counts.
package auth

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"fmt"
	"net/url"
	"strings"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
)

// Role is what a certificate lets its holder do.
type Role string

// The roles `prism certs init` makes certificates for.
const (
	Router    Role = "router"
	Embedding Role = "embedding"
	Dense     Role = "dense"
	// Admin is the operators' and clients' role: embedding updates, the
	// registry's list, Recommend.
	Admin Role = "admin"
)

// Roles are every certificate role, in the order certs init writes them.
var Roles = []Role{Router, Embedding, Dense, Admin}

// Token is the role of a caller that presented the bearer token instead
// of a certificate (a client that cannot hold one); no certificate
// carries it.
const Token Role = "token"

// roleURIPrefix starts the URI SAN that carries a certificate's role.
const roleURIPrefix = "spiffe://prism/role/"

// instanceURIPrefix starts the URI SAN that names one worker's
// certificate (certs init --instances): urn:prism:instance:NAME. Not a
// second spiffe:// URI: a SPIFFE identity is one URI SAN (gRPC, among
// others, takes a certificate with two as having none).
const instanceURIPrefix = "urn:prism:instance:"

// InstanceURI is the URI SAN that names the certificate of instance
// name ("embedding-0").
func InstanceURI(name string) *url.URL {
	u, _ := url.Parse(instanceURIPrefix + name)
	return u
}

// InstanceOf is the instance name a certificate carries, "" when it
// carries none (a role's shared certificate).
func InstanceOf(c *x509.Certificate) string {
	for _, u := range c.URIs {
		if s := u.String(); strings.HasPrefix(s, instanceURIPrefix) {
			return strings.TrimPrefix(s, instanceURIPrefix)
		}
	}
	return ""
}

// ParseRole checks that s names a certificate role.
func ParseRole(s string) (Role, error) {
	for _, r := range Roles {
		if string(r) == s {
			return r, nil
		}
	}
	return "", fmt.Errorf("unknown role %q (want one of %v)", s, Roles)
}

// RoleURI is the URI SAN that gives a certificate role r.
func RoleURI(r Role) *url.URL {
	u, _ := url.Parse(roleURIPrefix + string(r))
	return u
}

// RoleOf is the role a certificate carries, "" when it carries none (or
// one Prism does not know).
func RoleOf(c *x509.Certificate) Role {
	for _, u := range c.URIs {
		s := u.String()
		if !strings.HasPrefix(s, roleURIPrefix) {
			continue
		}
		if r, err := ParseRole(strings.TrimPrefix(s, roleURIPrefix)); err == nil {
			return r
		}
	}
	return ""
}

// verifiedLeaf is the caller's certificate, verified against the CA, or
// nil; secure says whether the connection is TLS at all.
func verifiedLeaf(ctx context.Context) (leaf *x509.Certificate, secure bool) {
	p, ok := peer.FromContext(ctx)
	if !ok || p.AuthInfo == nil {
		return nil, false
	}
	info, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok {
		return nil, false
	}
	if len(info.State.VerifiedChains) == 0 || len(info.State.VerifiedChains[0]) == 0 {
		return nil, true
	}
	return info.State.VerifiedChains[0][0], true
}

// Peer is the role and name (the role and the SHA-256 of the certificate) of the
// caller of the RPC ctx belongs to; ok is false unless the caller
// presented a certificate that the server verified against its CA and
// that carries a role.
func Peer(ctx context.Context) (role, name string, ok bool) {
	leaf, _ := verifiedLeaf(ctx)
	if leaf == nil {
		return "", "", false
	}
	// The name is the certificate itself (its SHA-256), not its common
	// name: names repeat across certificates (every worker of a role
	// from certs init, or none at all in SPIFFE certificates), and a
	// worker id bound to a name another holder shares is not bound.
	sum := sha256.Sum256(leaf.Raw)
	name = string(RoleOf(leaf)) + "/" + hex.EncodeToString(sum[:])
	r := RoleOf(leaf)
	if r == "" {
		return "", name, false
	}
	return string(r), name, true
}

// PeerInstance is the instance name the caller's verified certificate
// carries ("embedding-0": certs init --instances, prism up), "" for a
// role's shared certificate or no certificate. Such a certificate names
// one worker: the router keeps one worker id live per instance
// certificate.
func PeerInstance(ctx context.Context) string {
	leaf, _ := verifiedLeaf(ctx)
	if leaf == nil {
		return ""
	}
	return InstanceOf(leaf)
}

// Allowed reports whether the caller of ctx may do what roles may: true
// on a plaintext connection (the process runs without TLS, where nothing
// is authenticated), else only when the caller's verified certificate
// carries one of roles. Handlers use it for checks finer than a method
// (an unsequenced embedding update needs an admin).
func Allowed(ctx context.Context, roles ...Role) bool {
	leaf, secure := verifiedLeaf(ctx)
	if !secure {
		return true
	}
	if leaf == nil {
		return false
	}
	r := RoleOf(leaf)
	for _, want := range roles {
		if r == want {
			return true
		}
	}
	return false
}
