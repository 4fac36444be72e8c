package auth

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strings"
)

// Layout is how a certificate folder (--certs DIR) holds a role's files.
type Layout int

const (
	// RoleFolder is one role's folder: DIR/cert.pem, DIR/key.pem,
	// DIR/ca.pem (what a host running that role is given).
	RoleFolder Layout = iota + 1
	// InitRoot is a folder certs init wrote: DIR/ROLE/ for each role.
	InitRoot
	// Flat is the layout certs init wrote before role folders, every
	// role's key in one folder: DIR/ROLE.pem, DIR/ROLE-key.pem,
	// DIR/ca.pem. Still read, with a warning.
	Flat
)

func (l Layout) String() string {
	switch l {
	case RoleFolder:
		return "role folder"
	case InitRoot:
		return "certs init folder"
	case Flat:
		return "flat (deprecated) folder"
	}
	return fmt.Sprintf("Layout(%d)", int(l))
}

// Resolved is what a certificate folder holds for a role.
type Resolved struct {
	Files
	Layout Layout
	// Warnings are one line each (no newline): the flat layout's
	// deprecation, a key readable by group or others.
	Warnings []string
}

// ResolveCerts finds role r's files in dir, which is either
//
//   - a role's folder (dir/cert.pem exists): its files are used, and its
//     certificate must carry role r;
//   - a folder certs init wrote (dir/ROLE/ exists): dir/ROLE's files
//     only, nothing else in dir is read;
//   - the flat layout of earlier releases (dir/ROLE.pem), with a
//     deprecation warning.
//
// The certificate's role is checked in each; the files must all exist.
func ResolveCerts(dir string, r Role) (Resolved, error) {
	var res Resolved
	st, err := os.Stat(dir)
	if err != nil {
		return res, fmt.Errorf("certificate folder: %w", err)
	}
	if !st.IsDir() {
		return res, fmt.Errorf("certificate folder %s is not a folder", dir)
	}
	switch {
	case exists(filepath.Join(dir, certFile)):
		res.Files, res.Layout = FolderFiles(dir), RoleFolder
	case isDir(RoleDir(dir, r)):
		res.Files, res.Layout = FilesFor(dir, r), InitRoot
	case exists(flatFiles(dir, r).Cert):
		res.Files, res.Layout = flatFiles(dir, r), Flat
		res.Warnings = append(res.Warnings, fmt.Sprintf("%s has the old flat layout, every role's key in one folder (deprecated): make a new one with prism certs init and give each process only its role's folder", dir))
	default:
		return res, fmt.Errorf("certificate folder %s holds no %s certificate: want %s (a role's folder), %s%c (a prism certs init folder) or %s (the old flat layout)",
			dir, r, filepath.Join(dir, certFile), RoleDir(dir, r), filepath.Separator, flatFiles(dir, r).Cert)
	}
	for _, p := range []string{res.Cert, res.Key, res.CA} {
		if _, err := os.Stat(p); err != nil {
			return res, fmt.Errorf("certificate folder %s (%s): %w", dir, res.Layout, err)
		}
	}
	got, err := certRole(res.Cert)
	if err != nil {
		return res, err
	}
	if got != r {
		what := fmt.Sprintf("role %q", got)
		if got == "" {
			what = "no Prism role"
		}
		return res, fmt.Errorf("%s carries %s, but this process runs as %s: give it the %s folder (DIR/%s of prism certs init)", res.Cert, what, r, r, r)
	}
	if w := KeyModeWarning(res.Key); w != "" {
		res.Warnings = append(res.Warnings, w)
	}
	return res, nil
}

// CheckCertRole refuses a certificate file (--tls-cert) that does not
// carry role r: a process serving or announcing as r with another role's
// certificate would start and then be refused by every peer.
func CheckCertRole(path string, r Role) error {
	got, err := certRole(path)
	if err != nil {
		return err
	}
	if got != r {
		what := fmt.Sprintf("role %q", got)
		if got == "" {
			what = "no Prism role"
		}
		return fmt.Errorf("--tls-cert %s carries %s, but this process runs as %s: give it a %s certificate (URI SAN %s)", path, what, r, r, RoleURI(r))
	}
	return nil
}

// KeyModeWarning is a one-line warning when the key file at path is
// readable by group or others, "" otherwise (or where file modes do not
// say: Windows, or a file it cannot stat, which loading reports).
func KeyModeWarning(path string) string { return secretModeWarning("key", path) }

// TokenModeWarning is KeyModeWarning for a bearer token file
// (--auth-token-file): whoever reads it may call what the token opens.
func TokenModeWarning(path string) string { return secretModeWarning("bearer token file", path) }

func secretModeWarning(what, path string) string {
	if runtime.GOOS == "windows" {
		return ""
	}
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm()&0o044 == 0 {
		return ""
	}
	if st.Mode().Perm()&0o004 == 0 && kubeletVolume(path) {
		return ""
	}
	return fmt.Sprintf("%s %s is readable by group or others (mode %04o): chmod 600 it", what, path, st.Mode().Perm())
}

// kubeletVolume says whether the file at path is one of a Kubernetes
// Secret or projected volume, as the kubelet writes them (DIR/FILE a
// link to ..data/FILE, DIR/..data a link to the current files). The
// kubelet adds group read to their mode for the pod's fsGroup, the group
// of the pod's own processes, which a non-root pod needs to read them at
// all: a chmod is neither possible nor wanted there.
func kubeletVolume(path string) bool {
	target, err := os.Readlink(path)
	if err != nil || !strings.HasPrefix(target, "..data"+string(filepath.Separator)) {
		return false
	}
	st, err := os.Lstat(filepath.Join(filepath.Dir(path), "..data"))
	return err == nil && st.Mode()&fs.ModeSymlink != 0
}

// certRole is the role the first certificate in the PEM file at path
// carries.
// FolderRole is the role of the certificate in dir when dir is one
// role's folder (dir/cert.pem), and false otherwise (another layout, or
// a certificate that does not read).
func FolderRole(dir string) (Role, bool) {
	if !exists(filepath.Join(dir, certFile)) {
		return "", false
	}
	r, err := certRole(filepath.Join(dir, certFile))
	return r, err == nil && r != ""
}

func certRole(path string) (Role, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("read certificate: %w", err)
	}
	// The first CERTIFICATE block, as crypto/tls takes it: a file may
	// hold the key before it.
	var blk *pem.Block
	for rest := b; ; {
		blk, rest = pem.Decode(rest)
		if blk == nil || blk.Type == "CERTIFICATE" {
			break
		}
	}
	if blk == nil {
		return "", fmt.Errorf("certificate %s: no PEM certificate in it", path)
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		return "", fmt.Errorf("certificate %s: %w", path, err)
	}
	return RoleOf(c), nil
}

func exists(path string) bool {
	_, err := os.Stat(path)
	return err == nil || !errors.Is(err, fs.ErrNotExist)
}

func isDir(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.IsDir()
}
