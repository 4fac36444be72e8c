package auth

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/prism-serve/prism/internal/atomicfile"
)

// ErrCAExists is returned by InitCerts when the folder holds a CA
// already: a second one would orphan every certificate the first signed.
var ErrCAExists = errors.New("a CA exists there already")

// CertOptions configure InitCerts.
type CertOptions struct {
	// Hosts are names and addresses the certificates are valid for,
	// besides 127.0.0.1, ::1 and localhost (which they always are).
	Hosts []string
	// Validity is how long the CA and the certificates are valid
	// (default two years).
	Validity time.Duration
	// Now is when the certificates are made (default time.Now; tests
	// make expired certificates with it): they are valid from Backdate
	// before it.
	Now func() time.Time
	// Instances, when > 0, also makes that many certificates of their
	// own for each worker role (embedding, dense): DIR/ROLE-I for I in
	// 0..Instances-1 (InstanceDir), each with the role and a distinct
	// identity (InstanceURI, and the instance's name as its common
	// name), so that the router binds a worker id to one worker's
	// certificate, not to a certificate every worker of the role holds.
	Instances int
	// CACert and CAKey, both or neither, are the PEM files of a CA to
	// sign the certificates with (an organisation's, or an
	// intermediate of it) instead of a development CA made here: its
	// certificate is written as every folder's ca.pem; its key is read,
	// never copied. The certificates expire with it at the latest.
	CACert, CAKey string
}

// Backdate is how long before they are made the certificates InitCerts
// makes are valid from (not before the CA's own start): a host whose
// clock is behind the one that made them (NTP broken, a VM resumed from
// a snapshot) refused them, its own at start ("not valid before") and
// its peers' at every handshake, until its clock passed their making;
// they were valid from a minute before it. An hour, as client-go's
// self-signed certificates.
const Backdate = time.Hour

// WorkerRoles are the roles whose processes announce themselves to the
// router (and so get per-instance certificates).
var WorkerRoles = []Role{Embedding, Dense}

// maxInstances bounds CertOptions.Instances.
const maxInstances = 4096

// EnsureDefaults fills zero fields.
func (o *CertOptions) EnsureDefaults() {
	if o.Validity == 0 {
		o.Validity = 2 * 365 * 24 * time.Hour
	}
	if o.Now == nil {
		o.Now = time.Now
	}
}

// Validate checks the options.
func (o *CertOptions) Validate() error {
	if o.Instances < 0 || o.Instances > maxInstances {
		return fmt.Errorf("%d instances, want 0 to %d", o.Instances, maxInstances)
	}
	if o.Validity < 0 {
		return fmt.Errorf("certificate validity %s, want > 0", o.Validity)
	}
	for _, h := range o.Hosts {
		if h == "" || strings.ContainsAny(h, " \t/,") {
			return fmt.Errorf("host %q: want a host name or an IP address", h)
		}
		// A port ("10.0.0.7:8500") would make the certificate valid
		// for a DNS name no host has; a bare IPv6 address has colons too.
		if strings.Contains(h, ":") && net.ParseIP(strings.Trim(h, "[]")) == nil {
			host, _, err := net.SplitHostPort(h)
			if err == nil {
				return fmt.Errorf("host %q: want a host name or an IP address without a port (%s)", h, host)
			}
			return fmt.Errorf("host %q: want a host name or an IP address", h)
		}
	}
	if (o.CACert == "") != (o.CAKey == "") {
		return errors.New("a CA's certificate and its key go together")
	}
	return nil
}

// loadCA reads a CA's certificate and key (PEM; the key PKCS #8, SEC 1
// EC or PKCS #1 RSA), and checks that the certificate is a CA's that
// may sign certificates, valid at now, and that the key is its own.
func loadCA(certPath, keyPath string, now time.Time) (*x509.Certificate, crypto.Signer, error) {
	certPEM, err := os.ReadFile(certPath)
	if err != nil {
		return nil, nil, fmt.Errorf("CA certificate: %w", err)
	}
	block, _ := pem.Decode(certPEM)
	if block == nil || block.Type != "CERTIFICATE" {
		return nil, nil, fmt.Errorf("CA certificate %s: no PEM CERTIFICATE block", certPath)
	}
	ca, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil, nil, fmt.Errorf("CA certificate %s: %w", certPath, err)
	}
	switch {
	case !ca.BasicConstraintsValid || !ca.IsCA:
		return nil, nil, fmt.Errorf("CA certificate %s (%s) is not a CA's (basic constraints CA:TRUE)", certPath, ca.Subject)
	case ca.KeyUsage != 0 && ca.KeyUsage&x509.KeyUsageCertSign == 0:
		return nil, nil, fmt.Errorf("CA certificate %s (%s) may not sign certificates (no keyCertSign usage)", certPath, ca.Subject)
	case now.Before(ca.NotBefore) || !now.Before(ca.NotAfter):
		return nil, nil, fmt.Errorf("CA certificate %s (%s) is valid from %s to %s, not now", certPath, ca.Subject, ca.NotBefore.Format(time.RFC3339), ca.NotAfter.Format(time.RFC3339))
	}
	keyPEM, err := os.ReadFile(keyPath)
	if err != nil {
		return nil, nil, fmt.Errorf("CA key: %w", err)
	}
	kb, _ := pem.Decode(keyPEM)
	if kb == nil {
		return nil, nil, fmt.Errorf("CA key %s: no PEM block", keyPath)
	}
	var key any
	switch kb.Type {
	case "PRIVATE KEY":
		key, err = x509.ParsePKCS8PrivateKey(kb.Bytes)
	case "EC PRIVATE KEY":
		key, err = x509.ParseECPrivateKey(kb.Bytes)
	case "RSA PRIVATE KEY":
		key, err = x509.ParsePKCS1PrivateKey(kb.Bytes)
	default:
		return nil, nil, fmt.Errorf("CA key %s: a PEM %q block, want PRIVATE KEY, EC PRIVATE KEY or RSA PRIVATE KEY (an encrypted key must be decrypted first)", keyPath, kb.Type)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("CA key %s: %w", keyPath, err)
	}
	signer, ok := key.(crypto.Signer)
	if !ok {
		return nil, nil, fmt.Errorf("CA key %s: a %T cannot sign", keyPath, key)
	}
	pub, ok := signer.Public().(interface{ Equal(crypto.PublicKey) bool })
	if !ok || !pub.Equal(ca.PublicKey) {
		return nil, nil, fmt.Errorf("CA key %s is not the key of CA certificate %s", keyPath, certPath)
	}
	return ca, signer, nil
}

// Files are the PEM files of one identity: its certificate and key, and
// the CA it trusts.
type Files struct {
	Cert, Key, CA string
}

// The files of a role's folder (what InitCerts writes into DIR/ROLE).
const (
	certFile = "cert.pem"
	keyFile  = "key.pem"
	caFile   = "ca.pem"
)

// RoleDir is role r's folder in a folder InitCerts wrote: DIR/ROLE, the
// only part of it a process of that role needs.
func RoleDir(dir string, r Role) string { return filepath.Join(dir, string(r)) }

// InstanceName is the name of instance i of role r: "ROLE-I".
func InstanceName(r Role, i int) string { return fmt.Sprintf("%s-%d", r, i) }

// InstanceDir is instance i of role r's folder in a folder InitCerts
// wrote with Instances > i: DIR/ROLE-I, a role's folder (cert.pem,
// key.pem, ca.pem) like DIR/ROLE, whose certificate is that instance's
// alone.
func InstanceDir(dir string, r Role, i int) string {
	return filepath.Join(dir, InstanceName(r, i))
}

// FolderFiles are the files of one role's folder: cert.pem, key.pem and
// ca.pem.
func FolderFiles(dir string) Files {
	return Files{Cert: filepath.Join(dir, certFile), Key: filepath.Join(dir, keyFile), CA: filepath.Join(dir, caFile)}
}

// FilesFor are role r's files in a folder InitCerts wrote:
// DIR/ROLE/{cert.pem,key.pem,ca.pem}.
func FilesFor(dir string, r Role) Files { return FolderFiles(RoleDir(dir, r)) }

// flatFiles are role r's files in the flat layout certs init wrote
// before role folders (ROLE.pem, ROLE-key.pem, ca.pem), still read.
func flatFiles(dir string, r Role) Files {
	return Files{Cert: filepath.Join(dir, string(r)+".pem"), Key: filepath.Join(dir, string(r)+"-key.pem"), CA: filepath.Join(dir, caFile)}
}

// InitCerts makes a development CA and, for each role, a folder DIR/ROLE
// (readable by the owner only) holding the role's certificate and key
// and the CA's certificate (cert.pem, key.pem, ca.pem; the key readable
// by the owner only), all ECDSA P-256, so that each process can be given
// its own role's folder and nothing else. With o.Instances, also a
// folder of the same form per worker instance (InstanceDir), whose
// certificate is that worker's alone. It refuses a folder that holds
// a CA already, in either layout (ErrCAExists). The CA's key is not
// kept: to add a host, make a new folder. dir is created if missing.
func InitCerts(dir string, o CertOptions) error {
	o.EnsureDefaults()
	if err := o.Validate(); err != nil {
		return err
	}
	cas := []string{filepath.Join(dir, caFile)}
	for _, r := range Roles {
		cas = append(cas, FilesFor(dir, r).CA)
	}
	for _, ca := range cas {
		if _, err := os.Stat(ca); err == nil {
			return fmt.Errorf("certs %s: %w", dir, ErrCAExists)
		} else if !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, syscall.ENOTDIR) {
			return fmt.Errorf("certs %s: %w", dir, err)
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("certs %s: %w", dir, err)
	}
	now := o.Now()
	notBefore, notAfter := now.Add(-Backdate), now.Add(o.Validity)
	var ca *x509.Certificate
	var caKey crypto.Signer
	if o.CACert != "" {
		var err error
		if ca, caKey, err = loadCA(o.CACert, o.CAKey, now); err != nil {
			return err
		}
		if ca.NotAfter.Before(notAfter) {
			notAfter = ca.NotAfter
		}
		if ca.NotBefore.After(notBefore) {
			notBefore = ca.NotBefore
		}
	} else {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return fmt.Errorf("CA key: %w", err)
		}
		caTmpl := &x509.Certificate{
			SerialNumber:          serial(),
			Subject:               pkix.Name{Organization: []string{"Prism"}, CommonName: "Prism development CA"},
			NotBefore:             notBefore,
			NotAfter:              notAfter,
			KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
			BasicConstraintsValid: true,
			IsCA:                  true,
			MaxPathLenZero:        true,
		}
		der, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &key.PublicKey, key)
		if err != nil {
			return fmt.Errorf("CA certificate: %w", err)
		}
		if ca, err = x509.ParseCertificate(der); err != nil {
			return fmt.Errorf("CA certificate: %w", err)
		}
		caKey = key
	}
	caDER := ca.Raw
	dns, ips := []string{"localhost"}, []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
	for _, h := range o.Hosts {
		if ip := net.ParseIP(strings.Trim(h, "[]")); ip != nil {
			ips = append(ips, ip)
		} else {
			dns = append(dns, h)
		}
	}
	// The role certificates first, the CA last: a folder with a ca.pem
	// is complete, so an interrupted run can be repeated.
	type leaf struct {
		dir      string
		role     Role
		instance string // "" for the role's shared certificate
	}
	var leaves []leaf
	for _, r := range Roles {
		leaves = append(leaves, leaf{RoleDir(dir, r), r, ""})
	}
	for _, r := range WorkerRoles {
		for i := range o.Instances {
			leaves = append(leaves, leaf{InstanceDir(dir, r, i), r, InstanceName(r, i)})
		}
	}
	for _, l := range leaves {
		r := l.role
		rd := l.dir
		if err := os.Mkdir(rd, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("certs %s: %w", dir, err)
		}
		// Mkdir's mode is masked by the umask, and a folder left by an
		// interrupted run may have another.
		if err := os.Chmod(rd, 0o700); err != nil {
			return fmt.Errorf("certs %s: %w", dir, err)
		}
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return fmt.Errorf("%s key: %w", r, err)
		}
		cn, uris := string(r), []*url.URL{RoleURI(r)}
		if l.instance != "" {
			cn, uris = l.instance, append(uris, InstanceURI(l.instance))
		}
		tmpl := &x509.Certificate{
			SerialNumber: serial(),
			Subject:      pkix.Name{Organization: []string{"Prism"}, OrganizationalUnit: []string{string(r)}, CommonName: cn},
			NotBefore:    notBefore,
			NotAfter:     notAfter,
			KeyUsage:     x509.KeyUsageDigitalSignature,
			// Every tier both serves and dials.
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
			DNSNames:    dns,
			IPAddresses: ips,
			URIs:        uris,
		}
		if r == Admin {
			// An admin only dials: its certificate, which every client
			// and operator holds, is no server's, for no host, so that
			// its holder cannot stand in for the router to a client that
			// checks only the CA and the host name (grpcurl, ghz).
			tmpl.ExtKeyUsage, tmpl.DNSNames, tmpl.IPAddresses = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, nil, nil
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			return fmt.Errorf("%s certificate: %w", cn, err)
		}
		keyDER, err := x509.MarshalPKCS8PrivateKey(key)
		if err != nil {
			return fmt.Errorf("%s key: %w", cn, err)
		}
		f := FolderFiles(rd)
		if err := writePEM(f.Key, "PRIVATE KEY", keyDER, 0o600); err != nil {
			return err
		}
		if err := writePEM(f.Cert, "CERTIFICATE", der, 0o644); err != nil {
			return err
		}
	}
	var caPaths []string
	for _, l := range leaves[len(Roles):] {
		caPaths = append(caPaths, FolderFiles(l.dir).CA)
	}
	for _, r := range Roles {
		caPaths = append(caPaths, FilesFor(dir, r).CA)
	}
	return writeCAs(caPaths, caDER)
}

// writeCAs writes the CA's certificate to every path, all or none: each
// to a temporary file first, renamed only once all are written. A ca.pem
// marks a folder complete (a later init refuses it), so one left by a
// run that failed part-way (a full disk: an empty ca.pem beside the
// others) made the folder neither usable nor made again.
func writeCAs(paths []string, der []byte) error {
	var files []*atomicfile.File
	defer func() {
		for _, f := range files {
			f.Abort()
		}
	}()
	for _, path := range paths {
		f, err := atomicfile.Create(path)
		if err != nil {
			return fmt.Errorf("write %w", err)
		}
		files = append(files, f)
		if err := pem.Encode(f, &pem.Block{Type: "CERTIFICATE", Bytes: der}); err != nil {
			return fmt.Errorf("write %s: %w", path, err)
		}
	}
	for _, f := range files {
		if err := f.Commit(0o644); err != nil {
			return fmt.Errorf("write %w", err)
		}
	}
	return nil
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(fmt.Sprintf("crypto/rand: %v", err))
	}
	return n
}

// writePEM writes one PEM block to path with perm, replacing a file left
// by an interrupted run (the folder had no CA, so nothing trusts it).
// Whole or not at all (atomicfile): the temporary file is the owner's
// only until renamed with perm, so a key is never readable by others.
func writePEM(path, typ string, der []byte, perm os.FileMode) error {
	f, err := atomicfile.Create(path)
	if err != nil {
		return fmt.Errorf("write %w", err)
	}
	defer f.Abort()
	if err := pem.Encode(f, &pem.Block{Type: typ, Bytes: der}); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Commit(perm); err != nil {
		return fmt.Errorf("write %w", err)
	}
	return nil
}
