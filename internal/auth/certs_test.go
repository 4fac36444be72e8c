package auth

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func readCert(t *testing.T, path string) *x509.Certificate {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		t.Fatalf("%s: no PEM block", path)
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestInitCerts(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "certs")
	if err := InitCerts(dir, CertOptions{Hosts: []string{"10.1.2.3", "worker-7.example"}}); err != nil {
		t.Fatal(err)
	}
	ca := readCert(t, FilesFor(dir, Admin).CA)
	if !ca.IsCA {
		t.Fatal("ca.pem is not a CA")
	}
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	for _, r := range Roles {
		f := FilesFor(dir, r)
		c := readCert(t, f.Cert)
		if got := RoleOf(c); got != r {
			t.Errorf("%s.pem carries role %q", r, got)
		}
		if c.Subject.OrganizationalUnit[0] != string(r) {
			t.Errorf("%s.pem OU %v", r, c.Subject.OrganizationalUnit)
		}
		if _, err := c.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
			t.Errorf("%s.pem does not verify against ca.pem as a client's: %v", r, err)
		}
		// The tiers serve; an admin only dials, and its certificate is
		// no server's, for no host.
		_, err := c.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}})
		if serves := r != Admin; (err == nil) != serves {
			t.Errorf("%s.pem as a server's: %v, want it to verify: %v", r, err, serves)
		}
		for _, host := range []string{"127.0.0.1", "::1", "localhost", "10.1.2.3", "worker-7.example"} {
			if err := c.VerifyHostname(host); (err == nil) != (r != Admin) {
				t.Errorf("%s.pem for host %s: %v", r, host, err)
			}
		}
		if err := c.VerifyHostname("10.9.9.9"); err == nil {
			t.Errorf("%s.pem is valid for a host it was not made for", r)
		}
		st, err := os.Stat(f.Key)
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != 0o600 {
			t.Errorf("%s: mode %v, want 0600", f.Key, st.Mode().Perm())
		}
		// Each role's folder is its owner's alone, and holds the same CA.
		if st, err := os.Stat(RoleDir(dir, r)); err != nil || st.Mode().Perm() != 0o700 {
			t.Errorf("%s: %v, want mode 0700", RoleDir(dir, r), err)
		}
		if !slices.Equal(readCert(t, f.CA).Raw, ca.Raw) {
			t.Errorf("%s is another CA", f.CA)
		}
		// The CA's key is not kept, nor another role's key.
		if got := listDir(t, RoleDir(dir, r)); !slices.Equal(got, []string{"ca.pem", "cert.pem", "key.pem"}) {
			t.Errorf("%s holds %v", RoleDir(dir, r), got)
		}
	}
	if got := listDir(t, dir); !slices.Equal(got, []string{"admin", "dense", "embedding", "router"}) {
		t.Errorf("certs init wrote %v", got)
	}
	before, _ := os.ReadFile(FilesFor(dir, Admin).CA)
	if err := InitCerts(dir, CertOptions{}); !errors.Is(err, ErrCAExists) {
		t.Fatalf("second init: %v, want ErrCAExists", err)
	}
	if after, _ := os.ReadFile(FilesFor(dir, Admin).CA); !slices.Equal(before, after) {
		t.Fatal("second init replaced the CA")
	}
	// A folder of the old flat layout has a CA too.
	flat := t.TempDir()
	os.WriteFile(filepath.Join(flat, "ca.pem"), []byte("x"), 0o644)
	if err := InitCerts(flat, CertOptions{}); !errors.Is(err, ErrCAExists) {
		t.Fatalf("init over a flat folder: %v, want ErrCAExists", err)
	}
}

func listDir(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

func TestInitCertsOptions(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    CertOptions
		ok   bool
	}{
		{"defaults", CertOptions{}, true},
		{"hosts", CertOptions{Hosts: []string{"a.example", "::2"}}, true},
		{"empty host", CertOptions{Hosts: []string{""}}, false},
		{"host with a space", CertOptions{Hosts: []string{"a b"}}, false},
		{"host with a port", CertOptions{Hosts: []string{"10.0.0.1:8500"}}, false},
		{"name with a port", CertOptions{Hosts: []string{"node7.example:8500"}}, false},
		{"bracketed IPv6", CertOptions{Hosts: []string{"[fd00::7]"}}, true},
		{"negative validity", CertOptions{Validity: -time.Hour}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := InitCerts(t.TempDir(), tc.o)
			if (err == nil) != tc.ok {
				t.Fatalf("err %v, want ok=%v", err, tc.ok)
			}
		})
	}
}

func TestParseRoleAndURI(t *testing.T) {
	for _, r := range Roles {
		got, err := ParseRole(string(r))
		if err != nil || got != r {
			t.Errorf("ParseRole(%q) = %q, %v", r, got, err)
		}
		c := &x509.Certificate{URIs: []*url.URL{RoleURI(r)}}
		if RoleOf(c) != r {
			t.Errorf("RoleOf(%s) = %q", RoleURI(r), RoleOf(c))
		}
	}
	for _, s := range []string{"", "token", "root", "Admin"} {
		if _, err := ParseRole(s); err == nil {
			t.Errorf("ParseRole(%q) accepted", s)
		}
	}
	other, _ := url.Parse("spiffe://other/role/admin")
	for name, c := range map[string]*x509.Certificate{
		"no URI":           {IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}},
		"other trust":      {URIs: []*url.URL{other}},
		"unknown role":     {URIs: []*url.URL{mustURL(t, "spiffe://prism/role/root")}},
		"token is no role": {URIs: []*url.URL{mustURL(t, "spiffe://prism/role/token")}},
	} {
		if r := RoleOf(c); r != "" {
			t.Errorf("%s: role %q", name, r)
		}
	}
}

func mustURL(t *testing.T, s string) *url.URL {
	t.Helper()
	u, err := url.Parse(s)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// TestInitCertsInstances: --instances makes, per worker role, folders of
// their own whose certificates carry the role and distinct identities,
// each a role's folder ResolveCerts takes.
func TestInitCertsInstances(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "certs")
	if err := InitCerts(dir, CertOptions{Instances: 2}); err != nil {
		t.Fatal(err)
	}
	ca := readCert(t, FilesFor(dir, Admin).CA)
	pool := x509.NewCertPool()
	pool.AddCert(ca)
	seen := map[string]bool{}
	for _, r := range WorkerRoles {
		shared := readCert(t, FilesFor(dir, r).Cert)
		if InstanceOf(shared) != "" {
			t.Errorf("the %s role's certificate names an instance: %q", r, InstanceOf(shared))
		}
		for i := range 2 {
			d := InstanceDir(dir, r, i)
			res, err := ResolveCerts(d, r)
			if err != nil || res.Layout != RoleFolder {
				t.Fatalf("%s: %+v %v", d, res, err)
			}
			c := readCert(t, res.Cert)
			name := InstanceName(r, i)
			if RoleOf(c) != r || InstanceOf(c) != name || c.Subject.CommonName != name {
				t.Errorf("%s: role %q, instance %q, CN %q", d, RoleOf(c), InstanceOf(c), c.Subject.CommonName)
			}
			if _, err := c.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
				t.Errorf("%s: %v", d, err)
			}
			if !slices.Equal(readCert(t, res.CA).Raw, ca.Raw) {
				t.Errorf("%s holds another CA", d)
			}
			if st, err := os.Stat(d); err != nil || st.Mode().Perm() != 0o700 {
				t.Errorf("%s: %v, want mode 0700", d, err)
			}
			if st, err := os.Stat(res.Key); err != nil || st.Mode().Perm() != 0o600 {
				t.Errorf("%s: %v, want mode 0600", res.Key, err)
			}
			if seen[string(c.RawSubjectPublicKeyInfo)] {
				t.Errorf("%s shares a key with another certificate", d)
			}
			seen[string(c.RawSubjectPublicKeyInfo)] = true
		}
	}
	if _, err := os.Stat(InstanceDir(dir, Router, 0)); err == nil {
		t.Error("instances made for the router role")
	}
	for _, n := range []int{-1, maxInstances + 1} {
		if err := InitCerts(filepath.Join(t.TempDir(), "x"), CertOptions{Instances: n}); err == nil {
			t.Errorf("%d instances accepted", n)
		}
	}
}

// InitCerts signs the role certificates with an operator's own CA, as
// OpenSSL writes one (testdata/orgca): RSA with a PKCS #1 key, EC with a
// SEC 1 or PKCS #8 key. Each folder's ca.pem is that CA, each role's
// certificate chains to it and carries its role, the CA's key is not
// copied, and what is not a usable CA is refused.
func TestInitCertsWithOrgCA(t *testing.T) {
	ca := func(name string) string { return filepath.Join("testdata", "orgca", name) }
	for _, tc := range []struct {
		name, cert, key string
		err             string
	}{
		{"rsa pkcs1", ca("rsa-ca.pem"), ca("rsa-ca-key.pem"), ""},
		{"ec sec1", ca("ec-ca.pem"), ca("ec-ca-key.pem"), ""},
		{"ec pkcs8", ca("ec-ca.pem"), ca("ec-ca-key-pkcs8.pem"), ""},
		{"another CA's key", ca("rsa-ca.pem"), ca("ec-ca-key.pem"), "is not the key of CA certificate"},
		{"not a CA", ca("leaf-not-ca.pem"), ca("ec-ca-key.pem"), "is not a CA's"},
		{"a key for a certificate", ca("ec-ca-key.pem"), ca("ec-ca-key.pem"), "no PEM CERTIFICATE block"},
		{"a certificate for a key", ca("ec-ca.pem"), ca("ec-ca.pem"), `a PEM "CERTIFICATE" block`},
		{"the certificate alone", ca("ec-ca.pem"), "", "go together"},
		{"missing", ca("nope.pem"), ca("ec-ca-key.pem"), "no such file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "certs")
			err := InitCerts(dir, CertOptions{CACert: tc.cert, CAKey: tc.key, Instances: 1})
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want one saying %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			want := readCert(t, tc.cert)
			roots := x509.NewCertPool()
			roots.AddCert(want)
			for _, f := range []Files{FilesFor(dir, Router), FilesFor(dir, Embedding), FilesFor(dir, Dense), FilesFor(dir, Admin), FolderFiles(InstanceDir(dir, Embedding, 0))} {
				if got := readCert(t, f.CA); !got.Equal(want) {
					t.Fatalf("%s is %s, want the given CA %s", f.CA, got.Subject, want.Subject)
				}
				leaf := readCert(t, f.Cert)
				if _, err := leaf.Verify(x509.VerifyOptions{Roots: roots, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
					t.Fatalf("%s does not chain to the given CA: %v", f.Cert, err)
				}
				if RoleOf(leaf) == "" {
					t.Fatalf("%s carries no role", f.Cert)
				}
				if leaf.NotAfter.After(want.NotAfter) {
					t.Fatalf("%s outlives its CA (%s > %s)", f.Cert, leaf.NotAfter, want.NotAfter)
				}
			}
			err = filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
				if err != nil || d.IsDir() {
					return err
				}
				b, err := os.ReadFile(path)
				if err != nil {
					return err
				}
				key, _ := os.ReadFile(tc.key)
				if strings.Contains(string(b), strings.TrimSpace(string(key))) {
					t.Errorf("%s holds the CA's key", path)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestCertsFromAClockAhead: certificates made on a host whose clock is
// ahead of this one's (NTP broken there or here, a VM resumed from a
// snapshot) load here, and verify here as a peer's, unless the clocks
// disagree by more than Backdate. They were valid from a minute before
// their making: a host a few minutes behind refused to start, and
// refused every peer's certificate.
func TestCertsFromAClockAhead(t *testing.T) {
	for _, tc := range []struct {
		name  string
		ahead time.Duration
		err   string
	}{
		{"same clock", 0, ""},
		{"30s ahead", 30 * time.Second, ""},
		{"5 minutes ahead", 5 * time.Minute, ""},
		{"50 minutes ahead", 50 * time.Minute, ""},
		{"two hours ahead", 2 * time.Hour, "is not valid before"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "certs")
			if err := InitCerts(dir, CertOptions{Now: func() time.Time { return time.Now().Add(tc.ahead) }}); err != nil {
				t.Fatal(err)
			}
			f := FilesFor(dir, Router)
			err := CheckFiles(f)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("CheckFiles: %v, want an error saying %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("CheckFiles (as the router starts): %v", err)
			}
			pool := x509.NewCertPool()
			pool.AddCert(readCert(t, f.CA))
			peer := readCert(t, FilesFor(dir, Embedding).Cert)
			if _, err := peer.Verify(x509.VerifyOptions{Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
				t.Errorf("a peer's certificate, verified here: %v", err)
			}
		})
	}
}

// TestCertsNotBeforeTheirCA: backdated certificates signed by a CA made
// less than Backdate ago start with the CA, not before it.
func TestCertsNotBeforeTheirCA(t *testing.T) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now().Add(-10 * time.Minute).Truncate(time.Second)
	tmpl := &x509.Certificate{SerialNumber: serial(), Subject: pkix.Name{CommonName: "young CA"}, NotBefore: start, NotAfter: start.Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	caDir := t.TempDir()
	caCert, caKey := filepath.Join(caDir, "ca.pem"), filepath.Join(caDir, "ca-key.pem")
	if err := writePEM(caCert, "CERTIFICATE", der, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := writePEM(caKey, "PRIVATE KEY", keyDER, 0o600); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "certs")
	if err := InitCerts(dir, CertOptions{CACert: caCert, CAKey: caKey}); err != nil {
		t.Fatal(err)
	}
	if got := readCert(t, FilesFor(dir, Router).Cert).NotBefore; !got.Equal(start) {
		t.Errorf("the router's certificate is valid from %s, want its CA's start %s", got, start)
	}
}
