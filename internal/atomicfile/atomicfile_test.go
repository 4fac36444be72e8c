package atomicfile

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestWriteFile: a file is replaced whole or not at all, through a
// symbolic link (the link stays), and a failed write leaves the old
// file and no temporary one.
func TestWriteFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "f")
	write := func(s string) func(io.Writer) error {
		return func(w io.Writer) error { _, err := io.WriteString(w, s); return err }
	}
	if err := WriteFile(path, write("one")); err != nil {
		t.Fatal(err)
	}
	if err := WriteFile(path, func(w io.Writer) error { io.WriteString(w, "half"); return errors.New("cut") }); err == nil {
		t.Fatal("a failed write succeeded")
	}
	link := filepath.Join(dir, "link")
	if err := os.Symlink(path, link); err != nil {
		t.Fatal(err)
	}
	if err := WriteFile(link, write("two")); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(path); string(b) != "two" {
		t.Fatalf("target holds %q, want two", b)
	}
	if fi, _ := os.Lstat(link); fi.Mode()&os.ModeSymlink == 0 {
		t.Fatal("the link was replaced by a file")
	}
	ents, _ := os.ReadDir(dir)
	if len(ents) != 2 {
		t.Fatalf("%d entries left, want the file and the link", len(ents))
	}
	if _, err := Create(dir); err == nil || !strings.Contains(err.Error(), "is a folder") {
		t.Fatalf("a folder: %v", err)
	}
	if _, err := Create(filepath.Join(dir, "missing", "f")); err == nil {
		t.Fatal("a missing folder was accepted")
	}
}

// TestWriteIntoPipe: a path that is not a regular file is written
// straight into.
func TestWriteIntoPipe(t *testing.T) {
	fifo := filepath.Join(t.TempDir(), "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Skipf("mkfifo: %v", err)
	}
	got := make(chan string)
	go func() {
		f, _ := os.Open(fifo)
		b, _ := io.ReadAll(f)
		f.Close()
		got <- string(b)
	}()
	if err := WriteFile(fifo, func(w io.Writer) error { _, err := io.WriteString(w, "x\n"); return err }); err != nil {
		t.Fatal(err)
	}
	if s := <-got; s != "x\n" {
		t.Fatalf("the pipe's reader got %q", s)
	}
}
