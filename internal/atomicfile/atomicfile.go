// Package atomicfile writes a file whole or not at all: through a
// temporary file beside it, synced and renamed over it at the end, so a
// reader, a run killed part-way or a full disk finds the old file or the
// new one, never a part. A path that is a symbolic link is followed (the
// file it points to is replaced, the link stays); a path that is not a
// regular file (a pipe, a terminal, /dev/stdout) is written straight
// into, there being nothing to rename over.
package atomicfile

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// File is a file being written: Write to it, then Commit, or Abort
// (after Commit, a no-op: defer it).
type File struct {
	name   string // as the caller gave it, for errors
	path   string // the file renamed over: name, its links followed
	f      *os.File
	stream bool
	done   bool
}

// Create opens the temporary file for path (or path itself, a stream).
// It fails at once on a folder that is missing or not writable, so a
// long job finds out before it starts; its errors name path.
func Create(path string) (*File, error) {
	fi, err := os.Stat(path)
	switch {
	case err == nil && fi.IsDir():
		return nil, fmt.Errorf("%s: is a folder", path)
	case err == nil && !fi.Mode().IsRegular():
		f, err := os.OpenFile(path, os.O_WRONLY, 0)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		return &File{name: path, path: path, f: f, stream: true}, nil
	}
	target := path
	if err == nil {
		if target, err = filepath.EvalSymlinks(path); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
	}
	f, err := os.CreateTemp(filepath.Dir(target), "."+filepath.Base(target)+".tmp-")
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &File{name: path, path: target, f: f}, nil
}

func (a *File) Write(p []byte) (int, error) { return a.f.Write(p) }

// Commit makes the file path's, with mode perm: synced, renamed over
// path, and the folder synced (a folder that cannot be, on some file
// systems, keeps the file written). On failure path is as it was.
func (a *File) Commit(perm fs.FileMode) error {
	var err error
	if !a.stream {
		err = errors.Join(a.f.Chmod(perm), a.f.Sync())
	}
	if cerr := a.f.Close(); err == nil {
		err = cerr
	}
	if err == nil && !a.stream {
		err = os.Rename(a.f.Name(), a.path)
	}
	if err != nil {
		a.remove()
		return fmt.Errorf("%s: %w", a.name, err)
	}
	a.done = true
	if !a.stream {
		if d, derr := os.Open(filepath.Dir(a.path)); derr == nil {
			d.Sync()
			d.Close()
		}
	}
	return nil
}

// Abort drops the file unless Commit made it path's.
func (a *File) Abort() {
	if !a.done {
		a.f.Close()
		a.remove()
	}
}

func (a *File) remove() {
	if !a.stream {
		os.Remove(a.f.Name())
	}
	a.done = true
}

// WriteFile writes path (mode 0644) with write, whole or not at all.
func WriteFile(path string, write func(io.Writer) error) error {
	a, err := Create(path)
	if err != nil {
		return err
	}
	defer a.Abort()
	if err := write(a); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return a.Commit(0o644)
}

// Name is the path the file was created for.
func (a *File) Name() string { return a.name }
