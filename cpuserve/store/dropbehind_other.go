//go:build !linux

package store

// dropPages is a no-op where posix_fadvise is not available here.
func dropPages(fd int, off, n int64) {}
