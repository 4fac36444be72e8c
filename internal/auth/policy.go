package auth

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// Rule says who may call a method.
type Rule struct {
	// Roles may call it; nil means any role (any certificate the CA
	// signed that carries a role).
	Roles []Role
	// Token: a caller holding the bearer token, without a certificate,
	// may call it too (where the server was given a token).
	Token bool
}

// Table is Prism's authorization: full gRPC method (or "/service/*" for
// every method of a service) to who may call it. A method in neither
// form is refused to everyone: a new RPC is closed until it gets a row.
var Table = map[string]Rule{
	// The public API.
	"/prism.v1.Recommender/*": {Token: true},
	// Operators update; a router that does not sequence updates forwards
	// them to the one that does (router/follow.go).
	"/prism.v1.Embeddings/Update": {Roles: []Role{Admin, Router}},
	// The registry: workers announce and leave, operators and peers list.
	"/prism.v1.Registry/Announce": {Roles: []Role{Embedding, Dense}},
	"/prism.v1.Registry/Leave":    {Roles: []Role{Embedding, Dense}},
	"/prism.v1.Registry/List":     {Roles: []Role{Admin, Router, Embedding, Dense}},
	// The update log's rows are the embeddings themselves: only the
	// routers that may take the sequencing over read it.
	"/prism.v1.Registry/UpdateLog": {Roles: []Role{Router}},
	// The tiers' internal calls.
	"/prism.v1.EmbeddingTier/Lookup": {Roles: []Role{Router}},
	// Admin may write too, but only unsequenced updates, which the
	// embedding tier refuses to any other role (cpuserve/server).
	"/prism.v1.EmbeddingTier/Update": {Roles: []Role{Router, Admin}},
	// A copy of a worker's whole store (every row), which mends another
	// worker's store (prism store copy): operators, and embedding
	// workers' certificates, so the copy can be made from inside the
	// Pod it mends (kubectl exec) without the admin folder; an embedding
	// worker holds such rows itself.
	"/prism.v1.EmbeddingTier/Snapshot": {Roles: []Role{Admin, Embedding}},
	"/prism.v1.DenseTier/Score":        {Roles: []Role{Embedding}},
	// Health checking and reflection (grpcurl, load balancers).
	"/grpc.health.v1.Health/*":                    {Token: true},
	"/grpc.reflection.v1.ServerReflection/*":      {Token: true},
	"/grpc.reflection.v1alpha.ServerReflection/*": {Token: true},
}

// RuleFor is the rule of a full method name ("/pkg.Service/Method").
func RuleFor(method string) (Rule, bool) {
	if r, ok := Table[method]; ok {
		return r, true
	}
	if i := strings.LastIndexByte(method, '/'); i > 0 {
		r, ok := Table[method[:i]+"/*"]
		return r, ok
	}
	return Rule{}, false
}

// Policy enforces Table on a TLS server.
type Policy struct {
	// Token, when not empty, is the bearer token that admits callers
	// without a certificate to the methods whose rule allows it.
	Token string
}

// Authorize answers nil when the caller of ctx may call method, else
// Unauthenticated (no certificate, or a missing or wrong token) or
// PermissionDenied (a certificate whose role may not call it), with a
// message naming the role and the method.
func (p Policy) Authorize(ctx context.Context, method string) error {
	rule, known := RuleFor(method)
	leaf, _ := verifiedLeaf(ctx)
	if leaf != nil {
		role := RoleOf(leaf)
		switch {
		case role == "":
			return status.Errorf(codes.PermissionDenied, "the certificate of %q carries no Prism role: it may not call %s", leaf.Subject.CommonName, method)
		case !known:
			return status.Errorf(codes.PermissionDenied, "role %s may not call %s: the method is not in the authorization table", role, method)
		case rule.Roles != nil && !slices.Contains(rule.Roles, role):
			return status.Errorf(codes.PermissionDenied, "role %s may not call %s (allowed: %s)", role, method, roleList(rule.Roles))
		}
		return nil
	}
	if p.Token == "" || !known || !rule.Token {
		return status.Errorf(codes.Unauthenticated, "%s needs a client certificate signed by the cluster's CA", method)
	}
	got, ok := bearer(ctx)
	if !ok {
		return status.Errorf(codes.Unauthenticated, "%s needs a client certificate or a bearer token (authorization: Bearer TOKEN)", method)
	}
	// Hashes first, so the comparison takes the same time whatever the
	// lengths.
	a, b := sha256.Sum256([]byte(got)), sha256.Sum256([]byte(p.Token))
	if subtle.ConstantTimeCompare(a[:], b[:]) != 1 {
		return status.Errorf(codes.Unauthenticated, "%s: wrong bearer token", method)
	}
	return nil
}

func roleList(rs []Role) string {
	s := make([]string, len(rs))
	for i, r := range rs {
		s[i] = string(r)
	}
	return strings.Join(s, ", ")
}

// bearer is the token of the request's "authorization: Bearer TOKEN".
func bearer(ctx context.Context) (string, bool) {
	md, _ := metadata.FromIncomingContext(ctx)
	for _, v := range md.Get("authorization") {
		if len(v) > 7 && strings.EqualFold(v[:7], "bearer ") {
			return strings.TrimSpace(v[7:]), true
		}
	}
	return "", false
}

// UnaryInterceptor refuses unary calls Authorize refuses.
func (p Policy) UnaryInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		if err := p.Authorize(ctx, info.FullMethod); err != nil {
			return nil, err
		}
		return h(ctx, req)
	}
}

// StreamInterceptor refuses streams Authorize refuses.
func (p Policy) StreamInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
		if err := p.Authorize(ss.Context(), info.FullMethod); err != nil {
			return err
		}
		return h(srv, ss)
	}
}

// minTokenLen is the shortest bearer token accepted: a guessable token
// would make the certificates pointless.
const minTokenLen = 16

// ReadToken reads a bearer token from a file (surrounding white space
// dropped), refusing one shorter than 16 characters.
func ReadToken(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("read token: %w", err)
	}
	t := strings.TrimSpace(string(b))
	if len(t) < minTokenLen {
		return "", fmt.Errorf("token in %s: %d characters, want at least %d (e.g. openssl rand -hex 32)", path, len(t), minTokenLen)
	}
	if strings.ContainsAny(t, " \t\r\n") {
		return "", fmt.Errorf("token in %s: white space inside it", path)
	}
	return t, nil
}

// BearerToken are per-RPC credentials that send token as
// "authorization: Bearer TOKEN", over TLS only.
func BearerToken(token string) (grpc.DialOption, error) {
	if token == "" {
		return nil, errors.New("empty bearer token")
	}
	return grpc.WithPerRPCCredentials(bearerCreds(token)), nil
}

type bearerCreds string

func (b bearerCreds) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + string(b)}, nil
}

func (bearerCreds) RequireTransportSecurity() bool { return true }
