package store

import "golang.org/x/sys/unix"

// dropPages tells the kernel a file's range will not be read again
// (POSIX_FADV_DONTNEED): its clean pages leave the page cache now.
// Advice only; an error changes nothing the caller needs.
func dropPages(fd int, off, n int64) { _ = unix.Fadvise(fd, off, n, unix.FADV_DONTNEED) }
