// Package kubetest runs a real Kubernetes API server for tests: etcd
// (Debian's etcd-server) and kube-apiserver built from the
// k8s.io/kubernetes module with the Go toolchain (`make kube-apiserver`
// builds it once into .cache/k8s). There is no kubelet and no
// controller manager: objects are stored, validated, admitted and
// served as on a cluster, but Pods are not run.
//
// Tests call Start and skip, with the reason, where either binary is
// missing.
package kubetest

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"testing"
	"time"
)

// Server is a running API server.
type Server struct {
	// URL is its https address; Token a bearer token of a cluster admin
	// (group system:masters); Kubeconfig a file for kubectl and
	// client-go naming both (the serving certificate is self-signed and
	// not checked).
	URL, Token, Kubeconfig string
}

// APIServerPath is where the kube-apiserver binary is looked for: env
// PRISM_KUBE_APISERVER, else .cache/k8s/kube-apiserver at the
// repository root, else kube-apiserver on PATH.
func APIServerPath() (string, error) {
	if p := os.Getenv("PRISM_KUBE_APISERVER"); p != "" {
		return p, nil
	}
	if root, err := repoRoot(); err == nil {
		p := filepath.Join(root, ".cache", "k8s", "kube-apiserver")
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	if p, err := exec.LookPath("kube-apiserver"); err == nil {
		return p, nil
	}
	return "", errors.New("no kube-apiserver (build it once with `make kube-apiserver`, about 15 minutes on 2 cores, or set PRISM_KUBE_APISERVER)")
}

// repoRoot is the folder holding go.mod above this source file.
func repoRoot() (string, error) {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "", errors.New("no caller")
	}
	dir := filepath.Dir(file)
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("no go.mod above " + file)
		}
		dir = parent
	}
}

// Start runs etcd and kube-apiserver until the test ends, or skips the
// test saying what is missing.
func Start(t testing.TB) *Server {
	t.Helper()
	apiserver, err := APIServerPath()
	if err != nil {
		t.Skipf("skipping the test against a real API server: %v", err)
	}
	etcd, err := exec.LookPath("etcd")
	if err != nil {
		t.Skip("skipping the test against a real API server: no etcd (apt-get install etcd-server)")
	}
	dir := t.TempDir()
	clientPort, peerPort, securePort := freePort(t), freePort(t), freePort(t)
	etcdURL := "http://127.0.0.1:" + strconv.Itoa(clientPort)
	start(t, dir, "etcd", etcd,
		"--data-dir", filepath.Join(dir, "etcd"),
		"--listen-client-urls", etcdURL, "--advertise-client-urls", etcdURL,
		"--listen-peer-urls", "http://127.0.0.1:"+strconv.Itoa(peerPort),
		"--initial-advertise-peer-urls", "http://127.0.0.1:"+strconv.Itoa(peerPort),
		"--initial-cluster", "default=http://127.0.0.1:"+strconv.Itoa(peerPort),
		"--log-level", "warn")

	token := randomHex(t, 16)
	if err := os.WriteFile(filepath.Join(dir, "tokens.csv"), []byte(token+",prism-test-admin,1,system:masters\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	keyFile := filepath.Join(dir, "sa.key")
	pubFile := filepath.Join(dir, "sa.pub")
	writeServiceAccountKey(t, keyFile, pubFile)
	start(t, dir, "kube-apiserver", apiserver,
		"--etcd-servers", etcdURL,
		"--bind-address", "127.0.0.1", "--secure-port", strconv.Itoa(securePort),
		"--cert-dir", filepath.Join(dir, "certs"),
		"--token-auth-file", filepath.Join(dir, "tokens.csv"),
		"--authorization-mode", "RBAC",
		"--service-account-issuer", "https://kubernetes.default.svc",
		"--service-account-key-file", pubFile,
		"--service-account-signing-key-file", keyFile,
		"--service-cluster-ip-range", "10.96.0.0/16",
		"--allow-privileged",
		// No controller manager creates the default ServiceAccount.
		"--disable-admission-plugins", "ServiceAccount")

	s := &Server{URL: "https://127.0.0.1:" + strconv.Itoa(securePort), Token: token, Kubeconfig: filepath.Join(dir, "kubeconfig")}
	kubeconfig := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: test
  cluster:
    server: %s
    insecure-skip-tls-verify: true
users:
- name: admin
  user:
    token: %s
contexts:
- name: test
  context:
    cluster: test
    user: admin
current-context: test
`, s.URL, token)
	if err := os.WriteFile(s.Kubeconfig, []byte(kubeconfig), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := s.waitReady(90 * time.Second); err != nil {
		t.Fatalf("kube-apiserver: %v (its log: %s)", err, filepath.Join(dir, "kube-apiserver.log"))
	}
	return s
}

// waitReady polls /readyz until it answers 200.
func (s *Server) waitReady(within time.Duration) error {
	c := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	var last error
	for deadline := time.Now().Add(within); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		req, _ := http.NewRequest(http.MethodGet, s.URL+"/readyz", nil)
		req.Header.Set("Authorization", "Bearer "+s.Token)
		resp, err := c.Do(req)
		if err != nil {
			last = err
			continue
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			return nil
		}
		last = fmt.Errorf("/readyz: %s", resp.Status)
	}
	return fmt.Errorf("not ready after %s: %v", within, last)
}

// start runs a process until the test ends, its output in DIR/NAME.log.
func start(t testing.TB, dir, name, path string, args ...string) {
	t.Helper()
	logf, err := os.Create(filepath.Join(dir, name+".log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(path, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		logf.Close()
	})
}

func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func randomHex(t testing.TB, n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// writeServiceAccountKey writes an RSA key pair for service-account
// tokens (the API server requires one).
func writeServiceAccountKey(t testing.TB, keyFile, pubFile string) {
	t.Helper()
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := x509.MarshalPKIXPublicKey(&k.PublicKey)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(k)}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(pubFile, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), 0o600); err != nil {
		t.Fatal(err)
	}
}
