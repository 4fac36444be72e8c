// Package authflag is the command-line side of internal/auth: the flags
// every serving or dialling prism command takes (--certs, or
// --tls-cert/--tls-key/--tls-ca, or --insecure) and what they resolve
// to. It belongs to the command layer: its errors name the flags.
package authflag

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/prism-serve/prism/internal/auth"
)

// Flags are one command's TLS flags.
type Flags struct {
	Certs, Cert, Key, CA string
	Insecure             bool
	// MetricsClientCert (RegisterMetrics) requires scrapers of a TLS
	// tier's /metrics to present a certificate the CA signed.
	MetricsClientCert bool

	// role is Register's, the role Warn resolves the files for.
	role auth.Role
	// The files resolved for resolvedRole, once: Files is called for
	// the server and for each dial, and warns (through Warn) once.
	resolved     bool
	resolvedRole auth.Role
	files        auth.Files
	resolveErr   error
	warnings     []string
	warned       bool
}

// Register adds the flags to cmd; role names the certificate --certs
// picks.
func (f *Flags) Register(cmd *cobra.Command, role auth.Role) {
	f.role = role
	fl := cmd.Flags()
	certsHelp := fmt.Sprintf("certificate folder: the %s role's folder (cert.pem, key.pem, ca.pem), or a prism certs init folder, of which only %s/ is read", role, role)
	if role == auth.Admin {
		certsHelp += " (a client may also use another role's folder)"
	}
	fl.StringVar(&f.Certs, "certs", "", certsHelp)
	fl.StringVar(&f.Cert, "tls-cert", "", "this process's certificate (PEM), instead of --certs")
	fl.StringVar(&f.Key, "tls-key", "", "the key of --tls-cert (PEM)")
	fl.StringVar(&f.CA, "tls-ca", "", "the CA certificate that peers' certificates must chain to (PEM)")
	fl.BoolVar(&f.Insecure, "insecure", false, "plaintext gRPC: no TLS, no authentication (anyone who reaches the port may call every RPC)")
}

// RegisterMetrics adds the flag of a serving command's /metrics
// endpoint, which is HTTPS with the process's certificate unless
// --insecure.
func (f *Flags) RegisterMetrics(cmd *cobra.Command) {
	cmd.Flags().BoolVar(&f.MetricsClientCert, "metrics-client-cert", false, "over TLS, require scrapers of /metrics to present a certificate signed by the CA (by default /metrics is HTTPS and a scraper needs only the CA to verify it); with --insecure /metrics is plain HTTP")
}

// Files resolves the flags for role: ok is false with --insecure.
// Without a certificate (only --tls-ca) the files name the CA alone,
// which only clients holding a bearer token can use (allowNoCert).
func (f *Flags) Files(role auth.Role, allowNoCert bool) (files auth.Files, ok bool, err error) {
	explicit := f.Cert != "" || f.Key != "" || f.CA != ""
	switch {
	case f.Insecure && (f.Certs != "" || explicit):
		return files, false, errors.New("--insecure goes with neither --certs nor --tls-cert/--tls-key/--tls-ca")
	case f.Insecure:
		return files, false, nil
	case f.Certs != "" && explicit:
		return files, false, errors.New("give --certs DIR or --tls-cert/--tls-key/--tls-ca, not both")
	case f.Certs != "":
		files, err := f.resolve(role)
		return files, err == nil, err
	case !explicit:
		return files, false, errors.New("TLS is on by default: give --certs DIR (make one with prism certs init DIR), or --tls-cert, --tls-key and --tls-ca, or --insecure for plaintext")
	case f.CA == "":
		return files, false, errors.New("--tls-cert and --tls-key need --tls-ca (the CA peers are verified against)")
	case (f.Cert == "") != (f.Key == ""):
		return files, false, errors.New("--tls-cert and --tls-key go together")
	case f.Cert == "" && !allowNoCert:
		return files, false, errors.New("--tls-ca needs --tls-cert and --tls-key (this process's identity)")
	}
	if _, err := f.resolve(role); err != nil {
		return files, false, err
	}
	return auth.Files{Cert: f.Cert, Key: f.Key, CA: f.CA}, true, nil
}

// resolve finds role's files under --certs (auth.ResolveCerts), or
// checks --tls-key's mode, once per role, keeping the warnings for Warn.
func (f *Flags) resolve(role auth.Role) (auth.Files, error) {
	if f.resolved && f.resolvedRole == role {
		return f.files, f.resolveErr
	}
	f.resolved, f.resolvedRole, f.files, f.resolveErr, f.warnings = true, role, auth.Files{}, nil, nil
	if f.Certs == "" {
		if w := auth.KeyModeWarning(f.Key); f.Key != "" && w != "" {
			f.warnings = append(f.warnings, w)
		}
		// A tier's own certificate must carry its role, as under --certs;
		// an admin client's may be any the CA signed (Recommend takes it).
		if f.Cert != "" && role != auth.Admin {
			if err := auth.CheckCertRole(f.Cert, role); err != nil {
				f.resolveErr = err
				return f.files, err
			}
		}
		return f.files, nil
	}
	if r, ok := auth.FolderRole(f.Certs); ok && role == auth.Admin {
		// An admin client's certificate may be any the CA signed, as
		// with --tls-cert (Recommend takes any, Registry/List every
		// role's): a tier's own folder will do, as inside its Pod.
		role = r
	}
	res, err := auth.ResolveCerts(f.Certs, role)
	if err != nil {
		f.resolveErr = fmt.Errorf("--certs: %w", err)
		return f.files, f.resolveErr
	}
	f.files, f.warnings = res.Files, res.Warnings
	return f.files, nil
}

// Server is the TLS configuration to serve with as role, nil with
// --insecure.
func (f *Flags) Server(role auth.Role, o auth.ServerTLSOptions) (*tls.Config, error) {
	files, ok, err := f.Files(role, false)
	if err != nil || !ok {
		return nil, err
	}
	if err := auth.CheckFiles(files); err != nil {
		return nil, fmt.Errorf("%w (check %s)", err, f.which())
	}
	c, err := auth.ServerTLS(files, o)
	if err != nil {
		return nil, fmt.Errorf("%w (check %s)", err, f.which())
	}
	return c, nil
}

// Credentials are the transport credentials to dial with as role,
// expecting a server of one of serverRoles (any, when none are given);
// plaintext with --insecure.
func (f *Flags) Credentials(role auth.Role, allowNoCert bool, serverRoles ...auth.Role) (credentials.TransportCredentials, error) {
	files, ok, err := f.Files(role, allowNoCert)
	if err != nil {
		return nil, err
	}
	if !ok {
		return insecure.NewCredentials(), nil
	}
	if err := auth.CheckFiles(files); err != nil {
		return nil, fmt.Errorf("%w (check %s)", err, f.which())
	}
	c, err := auth.ClientCredentials(files, serverRoles...)
	if err != nil {
		return nil, fmt.Errorf("%w (check %s)", err, f.which())
	}
	return c, nil
}

// Dial is Credentials as a dial option.
func (f *Flags) Dial(role auth.Role, serverRoles ...auth.Role) (grpc.DialOption, error) {
	c, err := f.Credentials(role, false, serverRoles...)
	if err != nil {
		return nil, err
	}
	return grpc.WithTransportCredentials(c), nil
}

// Warn writes the one-line warning of a plaintext process to w; over
// TLS, once, a line for each thing the files deserve one for (the flat
// layout of --certs, a key readable by others). Errors are left to
// Server, Dial and Credentials.
func (f *Flags) Warn(w io.Writer, what string) {
	f.warn(w, what, "runs plaintext gRPC without authentication; anyone who reaches its port may call every RPC")
}

// WarnClient is Warn for a process that only dials (a client, a
// controller): its plaintext warning is about what it sends and whom.
func (f *Flags) WarnClient(w io.Writer, what string) {
	f.warn(w, what, "dials plaintext gRPC: what it sends and receives crosses the network unencrypted, to a server it does not authenticate")
}

func (f *Flags) warn(w io.Writer, what, plaintext string) {
	if f.Insecure {
		fmt.Fprintf(w, "prism: warning: --insecure: %s %s\n", what, plaintext)
		return
	}
	if f.warned || f.role == "" || (f.Certs == "" && f.Key == "") {
		return
	}
	f.warned = true
	if _, err := f.resolve(f.role); err != nil {
		return
	}
	for _, line := range f.warnings {
		fmt.Fprintf(w, "prism: warning: %s\n", line)
	}
}

func (f *Flags) which() string {
	if f.Certs != "" {
		return "--certs"
	}
	return "--tls-cert, --tls-key and --tls-ca"
}
