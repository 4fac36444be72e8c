package up

import (
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prism-serve/prism/gpuserve/devices"
	"github.com/prism-serve/prism/internal/auth"
)

// TestChildrenInstanceCerts: with per-instance certificates (certs init
// --instances, or the folder up makes), each worker gets its own
// folder; a worker beyond them gets its role's shared one.
func TestChildrenInstanceCerts(t *testing.T) {
	certs := filepath.Join(t.TempDir(), "certs")
	made, _, err := ensureCerts(certs, "127.0.0.1:0", 1, "", "")
	if err != nil || !made {
		t.Fatalf("made %v: %v", made, err)
	}
	c := Config{Plans: []string{"p"}, DB: "db", EmbeddingWorkers: 2, Threads: 1, MaxBatch: 512, MaxDelay: time.Millisecond, Certs: certs}
	kids := Children(c, "127.0.0.1:9", []devices.Worker{{}, {}})
	want := map[string]string{
		"dense0":     auth.InstanceDir(certs, auth.Dense, 0),
		"dense1":     auth.RoleDir(certs, auth.Dense),
		"embedding0": auth.InstanceDir(certs, auth.Embedding, 0),
		"embedding1": auth.RoleDir(certs, auth.Embedding),
	}
	for _, k := range kids {
		if args := strings.Join(k.Args, " "); !strings.Contains(args, " --certs "+want[k.Name]+" ") {
			t.Errorf("%s: %q, want --certs %s", k.Name, args, want[k.Name])
		}
	}
	if n := certInstances(Config{EmbeddingWorkers: 3, DenseWorkers: 12}); n != 12 {
		t.Errorf("certInstances: %d, want 12", n)
	}
}

// With an operator's CA, up makes its folder's certificates with it; a
// folder made before with that CA is used again, and one of another CA
// is refused rather than silently served with.
func TestEnsureCertsOrgCA(t *testing.T) {
	caCert := filepath.Join("..", "auth", "testdata", "orgca", "ec-ca.pem")
	caKey := filepath.Join("..", "auth", "testdata", "orgca", "ec-ca-key.pem")
	certs := filepath.Join(t.TempDir(), "certs")
	if made, _, err := ensureCerts(certs, "127.0.0.1:0", 1, caCert, caKey); err != nil || !made {
		t.Fatalf("made %v: %v", made, err)
	}
	if made, _, err := ensureCerts(certs, "127.0.0.1:0", 1, caCert, caKey); err != nil || made {
		t.Fatalf("again: made %v: %v", made, err)
	}
	dev := filepath.Join(t.TempDir(), "dev")
	if _, _, err := ensureCerts(dev, "127.0.0.1:0", 1, "", ""); err != nil {
		t.Fatal(err)
	}
	if _, _, err := ensureCerts(dev, "127.0.0.1:0", 1, caCert, caKey); err == nil || !strings.Contains(err.Error(), "another CA") {
		t.Fatalf("a development folder with --tls-ca: %v, want refused", err)
	}
}

// TestRouterDialAddr: the workers (and up, and its clients) dial a
// router listening on every interface at loopback, which the
// certificates up makes are valid for; [::]:P, its ready line's
// address, no certificate covers.
func TestRouterDialAddr(t *testing.T) {
	for _, tc := range []struct{ addr, bound, want string }{
		{"127.0.0.1:0", "127.0.0.1:4100", "127.0.0.1:4100"},
		{"localhost:8500", "127.0.0.1:8500", "localhost:8500"},
		// A name: the certificates up makes are for it, not for the
		// address it resolved to, which the ready line names.
		{"node7.example:0", "192.0.2.7:4100", "node7.example:4100"},
		{"192.0.2.7:0", "192.0.2.7:4100", "192.0.2.7:4100"},
		{"0.0.0.0:0", "[::]:4100", "127.0.0.1:4100"},
		{":8500", "[::]:8500", "127.0.0.1:8500"},
		{"0.0.0.0:8500", "0.0.0.0:8500", "127.0.0.1:8500"},
		{"[::]:8500", "[::]:8500", "[::1]:8500"},
		{"[::1]:0", "[::1]:4100", "[::1]:4100"},
	} {
		got := RouterDialAddr(tc.addr, tc.bound)
		if got != tc.want {
			t.Errorf("RouterDialAddr(%q, %q) = %q, want %q", tc.addr, tc.bound, got, tc.want)
			continue
		}
		// The certificates up makes for that --addr.
		certs := filepath.Join(t.TempDir(), "certs")
		if _, _, err := EnsureCerts(certs, tc.addr); err != nil {
			t.Fatal(err)
		}
		host, _, _ := net.SplitHostPort(got)
		if err := coversHost(certs, host); err != nil {
			t.Errorf("--addr %s: the workers dial %s, which the router's certificate does not cover: %v", tc.addr, got, err)
		}
	}
}

// TestEnsureCertsOtherAddr: a certificate folder made for another
// --addr, whose router certificate the workers would refuse at the new
// address, is an error at once, not a wait for --ready-timeout.
func TestEnsureCertsOtherAddr(t *testing.T) {
	root := t.TempDir()
	local := filepath.Join(root, "local")
	if _, _, err := EnsureCerts(local, "127.0.0.1:8500"); err != nil {
		t.Fatal(err)
	}
	host := filepath.Join(root, "host")
	if _, _, err := EnsureCerts(host, "192.0.2.7:8500"); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		dir, addr string
		ok        bool
	}{
		{local, "127.0.0.1:9000", true},
		{local, "0.0.0.0:8500", true},
		{local, "localhost:8500", true},
		{local, "192.0.2.7:8500", false},
		{local, "prism.example:8500", false},
		{host, "192.0.2.7:0", true},
		{host, "192.0.2.8:8500", false},
		{host, "127.0.0.1:8500", true},
	} {
		made, _, err := EnsureCerts(tc.dir, tc.addr)
		if made || (err == nil) != tc.ok {
			t.Errorf("EnsureCerts(%s, %s): made %v, err %v; want ok %v", filepath.Base(tc.dir), tc.addr, made, err, tc.ok)
		}
		if err != nil && !strings.Contains(err.Error(), "--host") {
			t.Errorf("EnsureCerts(%s, %s): %v, which does not say how to make a folder for it", filepath.Base(tc.dir), tc.addr, err)
		}
	}
}
