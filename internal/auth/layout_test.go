package auth

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func copyFile(t *testing.T, from, to string, perm os.FileMode) {
	t.Helper()
	b, err := os.ReadFile(from)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(to, b, perm); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(to, perm); err != nil { // past the umask
		t.Fatal(err)
	}
}

// TestResolveCerts: --certs takes a role's folder, a certs init folder
// (of which only DIR/ROLE is read) or the old flat layout (with a
// warning); the certificate must carry the process's role.
func TestResolveCerts(t *testing.T) {
	root := t.TempDir()
	initDir := filepath.Join(root, "init")
	if err := InitCerts(initDir, CertOptions{}); err != nil {
		t.Fatal(err)
	}
	// The old flat layout, from the same certificates.
	flat := filepath.Join(root, "flat")
	os.Mkdir(flat, 0o755)
	for _, r := range Roles {
		f := FilesFor(initDir, r)
		copyFile(t, f.Cert, filepath.Join(flat, string(r)+".pem"), 0o644)
		copyFile(t, f.Key, filepath.Join(flat, string(r)+"-key.pem"), 0o600)
		copyFile(t, f.CA, filepath.Join(flat, "ca.pem"), 0o644)
	}
	// A host given only the router's folder, beside decoys that must
	// not be read: a root's own ca.pem and flat files.
	host := filepath.Join(root, "host")
	os.MkdirAll(filepath.Join(host, "router"), 0o700)
	for _, name := range []string{"cert.pem", "key.pem", "ca.pem"} {
		copyFile(t, filepath.Join(initDir, "router", name), filepath.Join(host, "router", name), 0o600)
	}
	for _, name := range []string{"ca.pem", "router.pem", "router-key.pem"} {
		os.WriteFile(filepath.Join(host, name), []byte("not PEM"), 0o600)
	}
	// A role folder without its key.
	noKey := filepath.Join(root, "nokey")
	os.Mkdir(noKey, 0o700)
	copyFile(t, FilesFor(initDir, Dense).Cert, filepath.Join(noKey, "cert.pem"), 0o644)
	copyFile(t, FilesFor(initDir, Dense).CA, filepath.Join(noKey, "ca.pem"), 0o644)
	// A certs init folder missing the role's CA.
	noCA := filepath.Join(root, "noca")
	os.MkdirAll(filepath.Join(noCA, "embedding"), 0o700)
	copyFile(t, FilesFor(initDir, Embedding).Cert, filepath.Join(noCA, "embedding", "cert.pem"), 0o644)
	copyFile(t, FilesFor(initDir, Embedding).Key, filepath.Join(noCA, "embedding", "key.pem"), 0o600)
	// A role folder whose key others may read.
	open := filepath.Join(root, "open")
	os.Mkdir(open, 0o755)
	copyFile(t, FilesFor(initDir, Admin).Cert, filepath.Join(open, "cert.pem"), 0o644)
	copyFile(t, FilesFor(initDir, Admin).Key, filepath.Join(open, "key.pem"), 0o644)
	copyFile(t, FilesFor(initDir, Admin).CA, filepath.Join(open, "ca.pem"), 0o644)
	// A Kubernetes Secret volume, as the kubelet writes it (atomic
	// writer: links through ..data), its modes set by defaultMode 0440
	// and the pod's fsGroup: group read is the pod's own; others' is not.
	secret := filepath.Join(root, "secret")
	secretOpen := filepath.Join(root, "secret-open")
	for dir, keyMode := range map[string]os.FileMode{secret: 0o440, secretOpen: 0o444} {
		ts := filepath.Join(dir, "..2026_11_30_01_02_03.000000001")
		os.MkdirAll(ts, 0o755)
		copyFile(t, FilesFor(initDir, Router).Cert, filepath.Join(ts, "cert.pem"), 0o440)
		copyFile(t, FilesFor(initDir, Router).Key, filepath.Join(ts, "key.pem"), keyMode)
		copyFile(t, FilesFor(initDir, Router).CA, filepath.Join(ts, "ca.pem"), 0o440)
		os.Symlink(filepath.Base(ts), filepath.Join(dir, "..data"))
		for _, f := range []string{"cert.pem", "key.pem", "ca.pem"} {
			os.Symlink(filepath.Join("..data", f), filepath.Join(dir, f))
		}
	}
	file := filepath.Join(root, "a-file")
	os.WriteFile(file, nil, 0o644)

	for _, tc := range []struct {
		name     string
		dir      string
		role     Role
		layout   Layout
		want     Files
		warnings []string // substrings, one per warning
		err      []string // substrings of the error
	}{
		{name: "role folder", dir: RoleDir(initDir, Dense), role: Dense, layout: RoleFolder, want: FolderFiles(RoleDir(initDir, Dense))},
		{name: "certs init folder", dir: initDir, role: Embedding, layout: InitRoot, want: FilesFor(initDir, Embedding)},
		{name: "only the role's part of a root", dir: host, role: Router, layout: InitRoot, want: FilesFor(host, Router)},
		{name: "flat", dir: flat, role: Admin, layout: Flat,
			want:     Files{Cert: filepath.Join(flat, "admin.pem"), Key: filepath.Join(flat, "admin-key.pem"), CA: filepath.Join(flat, "ca.pem")},
			warnings: []string{"old flat layout"}},
		{name: "wrong role folder", dir: RoleDir(initDir, Admin), role: Embedding,
			err: []string{"carries role \"admin\"", "runs as embedding", "give it the embedding folder"}},
		{name: "root without the role", dir: host, role: Dense, err: []string{"holds no dense certificate", "prism certs init folder"}},
		{name: "empty folder", dir: t.TempDir(), role: Router, err: []string{"holds no router certificate"}},
		{name: "missing key", dir: noKey, role: Dense, err: []string{"key.pem"}},
		{name: "missing CA", dir: noCA, role: Embedding, err: []string{"ca.pem"}},
		{name: "absent", dir: filepath.Join(root, "nope"), role: Router, err: []string{"nope"}},
		{name: "a file", dir: file, role: Router, err: []string{"is not a folder"}},
		{name: "key readable by others", dir: open, role: Admin, layout: RoleFolder, want: FolderFiles(open),
			warnings: []string{"readable by group or others (mode 0644)"}},
		{name: "Kubernetes Secret volume", dir: secret, role: Router, layout: RoleFolder, want: FolderFiles(secret)},
		{name: "Kubernetes Secret volume readable by others", dir: secretOpen, role: Router, layout: RoleFolder, want: FolderFiles(secretOpen),
			warnings: []string{"readable by group or others (mode 0444)"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res, err := ResolveCerts(tc.dir, tc.role)
			if len(tc.err) > 0 {
				if err == nil {
					t.Fatalf("resolved %+v, want an error", res)
				}
				for _, w := range tc.err {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error %q lacks %q", err, w)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if res.Layout != tc.layout || res.Files != tc.want {
				t.Fatalf("resolved %+v, want %s %+v", res, tc.layout, tc.want)
			}
			if len(res.Warnings) != len(tc.warnings) {
				t.Fatalf("warnings %q, want %q", res.Warnings, tc.warnings)
			}
			for i, w := range tc.warnings {
				if !strings.Contains(res.Warnings[i], w) || strings.Contains(res.Warnings[i], "\n") {
					t.Errorf("warning %q, want one line with %q", res.Warnings[i], w)
				}
			}
			if _, err := ServerTLS(res.Files, ServerTLSOptions{}); err != nil {
				t.Errorf("the files do not load: %v", err)
			}
		})
	}
}
