// Package ort starts ONNX Runtime in this process and runs sessions on it.
//
// The shared library is found, in order, at ORT_LIB, or in the cache that
// `make setup` fills (.cache/ort/<version>/ inside the checkout, searched
// upwards from the working directory and from the executable). When none
// is there, Init returns ErrNoLibrary, whose message is one line with the
// fix; callers print it as is.
package ort

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	ort "github.com/yalue/onnxruntime_go"
)

// Version is the ONNX Runtime release `make setup` installs.
const Version = "1.30.0"

// CUDADir is the cache folder of the CUDA build `make setup-cuda`
// installs (ONNX Runtime 1.29.0 with its CUDA 13 execution provider),
// which the library search prefers where both are present.
const CUDADir = "1.29.0-cuda13"

// ErrNoLibrary is returned (wrapped) when the ONNX Runtime shared library
// cannot be found or loaded.
var ErrNoLibrary = errors.New("ONNX Runtime library not found")

var (
	initOnce sync.Once
	initErr  error
	libPath  string
)

// Init loads ONNX Runtime once per process. It is safe to call from many
// goroutines; later calls return the first call's result.
func Init() error {
	initOnce.Do(func() {
		p, err := FindLibrary()
		if err != nil {
			initErr = err
			return
		}
		ort.SetSharedLibraryPath(p)
		if err := ort.InitializeEnvironment(ort.WithLogLevelError()); err != nil {
			initErr = fmt.Errorf("%w: loading %s failed (%v): run `make setup` or set ORT_LIB=/path/to/libonnxruntime.so", ErrNoLibrary, p, err)
			return
		}
		libPath = p
	})
	return initErr
}

// LibraryPath is the library Init loaded, "" before a successful Init.
func LibraryPath() string { return libPath }

// FindLibrary returns the path of the shared library Init would load.
func FindLibrary() (string, error) {
	if p := os.Getenv("ORT_LIB"); p != "" {
		if st, err := os.Stat(p); err != nil || st.IsDir() {
			return "", fmt.Errorf("%w at ORT_LIB=%s: point ORT_LIB at libonnxruntime.so, or unset it and run `make setup`", ErrNoLibrary, p)
		}
		return p, nil
	}
	rel := filepath.Join(".cache", "ort", Version, "libonnxruntime.so")
	cuda := filepath.Join(".cache", "ort", CUDADir, "libonnxruntime.so")
	var starts []string
	if wd, err := os.Getwd(); err == nil {
		starts = append(starts, wd)
	}
	if exe, err := os.Executable(); err == nil {
		if exe, err = filepath.EvalSymlinks(exe); err == nil {
			starts = append(starts, filepath.Dir(exe))
		}
	}
	for _, dir := range starts {
		for {
			for _, r := range []string{cuda, rel} {
				p := filepath.Join(dir, r)
				if _, err := os.Stat(p); err == nil {
					return p, nil
				}
			}
			parent := filepath.Dir(dir)
			if parent == dir {
				break
			}
			dir = parent
		}
	}
	return "", fmt.Errorf("%w (no ORT_LIB, no %s in this checkout): run `make setup` or set ORT_LIB=/path/to/libonnxruntime.so", ErrNoLibrary, rel)
}
