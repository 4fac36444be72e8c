package plan

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestResolve: a plan-relative file is opened only inside the plan
// folder. Validate refuses ".." and absolute paths in plan.json, but a
// symlink inside the folder (tables/t0.arrow -> /etc/passwd) passes it;
// Resolve refuses that too, and keeps symlinks that stay inside.
func TestResolve(t *testing.T) {
	outside := t.TempDir()
	secret := filepath.Join(outside, "secret.arrow")
	if err := os.WriteFile(secret, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	mk := func(rel string) {
		p := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	link := func(target, rel string) {
		if err := os.Symlink(target, filepath.Join(dir, rel)); err != nil {
			t.Fatal(err)
		}
	}
	mk("dense.onnx")
	mk("tables/t0.arrow")
	link(secret, "tables/out.arrow")    // absolute symlink out
	link(outside, "ext")                // symlinked folder out
	link("t0.arrow", "tables/in.arrow") // stays inside
	link("tables", "tabs")              // folder symlink inside
	// The plan folder itself may be reached through a symlink.
	viaLink := filepath.Join(t.TempDir(), "plan")
	if err := os.Symlink(dir, viaLink); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		dir, rel string
		err      string // "" for allowed
	}{
		{dir, "dense.onnx", ""},
		{dir, "tables/t0.arrow", ""},
		{dir, "tables/in.arrow", ""},
		{dir, "tabs/t0.arrow", ""},
		{viaLink, "tables/t0.arrow", ""},
		{viaLink, "tabs/in.arrow", ""},
		{dir, "tables/out.arrow", "through a symlink"},
		{dir, "ext/secret.arrow", "through a symlink"},
		{viaLink, "ext/secret.arrow", "through a symlink"},
		{dir, "../x/secret.arrow", "not a path inside the plan folder"},
		{dir, secret, "not a path inside the plan folder"},
		{dir, "", "not a path inside the plan folder"},
		{dir, "missing.onnx", "no such file"},
	} {
		got, err := Resolve(tc.dir, tc.rel)
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("Resolve(%q, %q): %v", tc.dir, tc.rel, err)
		case tc.err == "" && !strings.HasPrefix(got, mustReal(t, dir)):
			t.Errorf("Resolve(%q, %q) = %q, outside %q", tc.dir, tc.rel, got, dir)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err) || !strings.Contains(err.Error(), tc.rel)):
			t.Errorf("Resolve(%q, %q) = %q, %v; want an error naming the file and saying %q", tc.dir, tc.rel, got, err, tc.err)
		}
	}
}

func mustReal(t *testing.T, p string) string {
	t.Helper()
	r, err := realPath(p)
	if err != nil {
		t.Fatal(err)
	}
	return r
}
