package up

import (
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
