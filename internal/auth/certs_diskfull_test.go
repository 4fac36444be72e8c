package auth

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// mountSmall mounts a tmpfs of size bytes at a new folder (root only),
// unmounted at the end of the test.
func mountSmall(t *testing.T, size int) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "small")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mount("tmpfs", dir, "tmpfs", 0, fmt.Sprintf("size=%d", size)); err != nil {
		t.Skipf("a full disk needs a tmpfs mount (root): %v", err)
	}
	t.Cleanup(func() { syscall.Unmount(dir, 0) })
	return dir
}

// TestInitCertsDiskFull: certs init on a disk that fills part-way left
// an empty ca.pem (and the other roles' whole ones): the folder served
// no TLS, and init run again refused it, a CA being there already. A
// failed init leaves no ca.pem, whatever file the disk filled at, so it
// can be run again once space is freed and makes a whole folder.
func TestInitCertsDiskFull(t *testing.T) {
	// Each file takes a 4 KiB page: 8 role files, then the 4 CA copies.
	for _, pages := range []int{6, 8, 9, 10, 11, 12, 14} {
		t.Run(fmt.Sprintf("%d_pages", pages), func(t *testing.T) {
			small := mountSmall(t, pages<<12)
			dir := filepath.Join(small, "certs")
			err := InitCerts(dir, CertOptions{})
			if err != nil && !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("init on a full disk: %v, want ENOSPC", err)
			}
			t.Logf("init: %v", err)
			if err != nil {
				filepath.WalkDir(dir, func(path string, d fs.DirEntry, _ error) error {
					if d != nil && d.Name() == caFile {
						t.Errorf("a failed init (%v) left %s", err, path)
					}
					return nil
				})
				if err := syscall.Mount("tmpfs", small, "tmpfs", syscall.MS_REMOUNT, "size=1m"); err != nil {
					t.Fatal(err)
				}
				if err := InitCerts(dir, CertOptions{}); err != nil {
					t.Fatalf("init again once space was freed: %v", err)
				}
			}
			ca := readCert(t, FilesFor(dir, Admin).CA)
			for _, r := range Roles {
				if got := readCert(t, FilesFor(dir, r).CA); !got.Equal(ca) {
					t.Errorf("%s: another CA than admin's", r)
				}
				if err := readCert(t, FilesFor(dir, r).Cert).CheckSignatureFrom(ca); err != nil {
					t.Errorf("%s certificate: %v", r, err)
				}
			}
		})
	}
}
