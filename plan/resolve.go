package plan

import (
	"fmt"
	"path/filepath"
)

// Resolve returns the path of the plan-relative file rel in the plan
// folder dir, for a tier or tool to open. Besides what Validate refuses
// (an absolute path, ".." leaving the folder), it resolves symlinks in
// both and refuses a file that lies outside the plan folder once they
// are followed, so a plan folder cannot make a tier read elsewhere. The
// file must exist. The returned path has no symlinks left.
func Resolve(dir, rel string) (string, error) {
	if rel == "" || !filepath.IsLocal(rel) {
		return "", fmt.Errorf("plan file %q is not a path inside the plan folder %q", rel, dir)
	}
	root, err := realPath(dir)
	if err != nil {
		return "", fmt.Errorf("plan folder %q: %w", dir, err)
	}
	real, err := realPath(filepath.Join(dir, rel))
	if err != nil {
		return "", fmt.Errorf("plan file %q: %w", rel, err)
	}
	if r, err := filepath.Rel(root, real); err != nil || !filepath.IsLocal(r) {
		return "", fmt.Errorf("plan file %q leaves the plan folder %q through a symlink (it resolves to %q)", rel, dir, real)
	}
	return real, nil
}

func realPath(path string) (string, error) {
	p, err := filepath.EvalSymlinks(path)
	if err != nil {
		return "", err
	}
	return filepath.Abs(p)
}
