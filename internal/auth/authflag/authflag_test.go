package authflag

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/prism-serve/prism/internal/auth"
)

// TestFlags: --certs resolves the command's role in either layout, says
// once what deserves a warning, and refuses another role's folder.
func TestFlags(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "certs")
	if err := auth.InitCerts(dir, auth.CertOptions{}); err != nil {
		t.Fatal(err)
	}
	flags := func(args ...string) *Flags {
		var f Flags
		cmd := &cobra.Command{}
		f.Register(cmd, auth.Embedding)
		if err := cmd.ParseFlags(args); err != nil {
			t.Fatal(err)
		}
		return &f
	}
	for _, d := range []string{dir, auth.RoleDir(dir, auth.Embedding)} {
		f := flags("--certs", d)
		files, ok, err := f.Files(auth.Embedding, false)
		if err != nil || !ok || files != auth.FilesFor(dir, auth.Embedding) {
			t.Fatalf("--certs %s: %+v %v %v", d, files, ok, err)
		}
		var w bytes.Buffer
		f.Warn(&w, "test")
		if w.Len() != 0 {
			t.Errorf("--certs %s warns: %s", d, w.String())
		}
	}
	if _, err := flags("--certs", auth.RoleDir(dir, auth.Dense)).Server(auth.Embedding, auth.ServerTLSOptions{}); err == nil || !strings.Contains(err.Error(), `carries role "dense"`) {
		t.Errorf("another role's folder: %v", err)
	}
	// The same mistake with explicit files is refused at start as well (it
	// started, and every peer refused it); an admin client may hold any
	// certificate the CA signed.
	dense := auth.FilesFor(dir, auth.Dense)
	explicit := flags("--tls-cert", dense.Cert, "--tls-key", dense.Key, "--tls-ca", dense.CA)
	if _, err := explicit.Server(auth.Embedding, auth.ServerTLSOptions{}); err == nil || !strings.Contains(err.Error(), `--tls-cert `+dense.Cert+` carries role "dense", but this process runs as embedding`) {
		t.Errorf("another role's --tls-cert: %v", err)
	}
	if _, err := explicit.Dial(auth.Admin, auth.Router); err != nil {
		t.Errorf("an admin client with a dense certificate: %v", err)
	}
	// So may it under --certs: a tier's own folder (prism status inside
	// its Pod); an init folder still gives it admin/.
	if files, ok, err := flags("--certs", auth.RoleDir(dir, auth.Dense)).Files(auth.Admin, false); err != nil || !ok || files != dense {
		t.Errorf("an admin client with the dense folder: %+v %v %v", files, ok, err)
	}
	if files, ok, err := flags("--certs", dir).Files(auth.Admin, false); err != nil || !ok || files != auth.FilesFor(dir, auth.Admin) {
		t.Errorf("an admin client with the init folder: %+v %v %v", files, ok, err)
	}

	// A key others may read warns once, however often the files are
	// used.
	key := auth.FilesFor(dir, auth.Embedding).Key
	os.Chmod(key, 0o640)
	for _, args := range [][]string{{"--certs", dir}, {"--tls-cert", auth.FilesFor(dir, auth.Embedding).Cert, "--tls-key", key, "--tls-ca", auth.FilesFor(dir, auth.Embedding).CA}} {
		f := flags(args...)
		var w bytes.Buffer
		f.Warn(&w, "test")
		for range 3 {
			if _, err := f.Dial(auth.Embedding, auth.Router); err != nil {
				t.Fatal(err)
			}
		}
		f.Warn(&w, "test")
		if got := w.String(); strings.Count(got, "\n") != 1 || !strings.Contains(got, "prism: warning: key "+key+" is readable by group or others") {
			t.Errorf("%v: warnings %q", args, got)
		}
	}
}

// TestCombinedPEM: one PEM file holding the key, then the certificate,
// given as both --tls-key and --tls-cert (crypto/tls takes it), passes
// the role check at start, which read only the file's first block.
func TestCombinedPEM(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "certs")
	if err := auth.InitCerts(dir, auth.CertOptions{}); err != nil {
		t.Fatal(err)
	}
	e := auth.FilesFor(dir, auth.Embedding)
	key, _ := os.ReadFile(e.Key)
	cert, _ := os.ReadFile(e.Cert)
	both := filepath.Join(t.TempDir(), "embedding.pem")
	os.WriteFile(both, append(key, cert...), 0o600)
	var f Flags
	cmd := &cobra.Command{}
	f.Register(cmd, auth.Embedding)
	if err := cmd.ParseFlags([]string{"--tls-cert", both, "--tls-key", both, "--tls-ca", e.CA}); err != nil {
		t.Fatal(err)
	}
	if _, err := auth.ServerTLS(auth.Files{Cert: both, Key: both, CA: e.CA}, auth.ServerTLSOptions{}); err != nil {
		t.Fatalf("ServerTLS itself refuses the combined file: %v", err)
	}
	if _, err := f.Server(auth.Embedding, auth.ServerTLSOptions{}); err != nil {
		t.Fatalf("an embedding certificate in a combined PEM: %v", err)
	}
}

// TestMismatchedFiles: a certificate whose key is another's, or which
// the CA given did not sign, stops the process at start with an error
// naming the files (it started, and every peer refused it).
func TestMismatchedFiles(t *testing.T) {
	root := t.TempDir()
	a, b := filepath.Join(root, "a"), filepath.Join(root, "b")
	for _, d := range []string{a, b} {
		if err := auth.InitCerts(d, auth.CertOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	fa, fb := auth.FilesFor(a, auth.Router), auth.FilesFor(b, auth.Router)
	for _, tc := range []struct {
		name          string
		cert, key, ca string
		want          []string
	}{
		{"key of another certificate", fa.Cert, fb.Key, fa.CA, []string{fa.Cert, fb.Key, "private key does not match"}},
		{"CA that did not sign the certificate", fa.Cert, fa.Key, fb.CA, []string{fa.Cert, fb.CA, "does not chain to CA"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var f Flags
			cmd := &cobra.Command{}
			f.Register(cmd, auth.Router)
			if err := cmd.ParseFlags([]string{"--tls-cert", tc.cert, "--tls-key", tc.key, "--tls-ca", tc.ca}); err != nil {
				t.Fatal(err)
			}
			_, serr := f.Server(auth.Router, auth.ServerTLSOptions{})
			_, derr := f.Dial(auth.Router, auth.Embedding)
			for _, err := range []error{serr, derr} {
				for _, w := range tc.want {
					if err == nil || !strings.Contains(err.Error(), w) {
						t.Errorf("%v, want an error saying %q", err, w)
					}
				}
			}
		})
	}
}
