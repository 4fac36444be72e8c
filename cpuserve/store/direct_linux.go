//go:build linux

package store

import (
	"errors"
	"io"
	"math/bits"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// openDirect opens name for reading with O_DIRECT; -1 where the file
// system refuses it.
func openDirect(name string) int {
	fd, err := unix.Open(name, unix.O_RDONLY|unix.O_DIRECT|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1
	}
	return fd
}

func closeDirect(fd int) { _ = unix.Close(fd) }

// directBufs pools aligned read buffers by size class: class c holds
// buffers of directAlign << c bytes, up to maxDirectRead plus the page a
// misaligned read spills into.
var directBufs [8]sync.Pool

// alignedBuf is an aligned buffer of at least n bytes, and its class.
func alignedBuf(n int) ([]byte, int) {
	c := bits.Len(uint((n - 1) / directAlign))
	if b, ok := directBufs[c].Get().(*[]byte); ok {
		return *b, c
	}
	size := directAlign << c
	raw := make([]byte, size+directAlign)
	skip := (directAlign - int(uintptr(unsafe.Pointer(unsafe.SliceData(raw)))%directAlign)) % directAlign
	return raw[skip : skip+size : skip+size], c
}

// readDirect reads len(p) bytes at off through the O_DIRECT descriptor
// fd: the aligned pages around the range into a pooled buffer, then the
// range into p. As os.File.ReadAt, fewer bytes than asked come with
// io.EOF. errDirectRefused says the file system refused the read (EINVAL:
// alignment rules stricter than directAlign), and the caller reads
// buffered instead; a device error is returned as it is.
func readDirect(fd int, p []byte, off int64) (n int, err error) {
	if len(p) == 0 {
		return 0, nil
	}
	start := off &^ (directAlign - 1)
	end := (off + int64(len(p)) + directAlign - 1) &^ (directAlign - 1)
	buf, class := alignedBuf(int(end - start))
	defer directBufs[class].Put(&buf)
	want := buf[:end-start]
	got, err := preadFull(fd, want, start)
	if err != nil {
		return 0, err
	}
	skip := int(off - start)
	if got <= skip {
		return 0, io.EOF
	}
	n = copy(p, want[skip:got])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// preadFull reads len(buf) bytes at off (both aligned for O_DIRECT) from
// fd, fewer only at the end of the file. errDirectRefused: the file
// system refused the read (EINVAL).
func preadFull(fd int, buf []byte, off int64) (int, error) {
	got := 0
	for got < len(buf) {
		m, err := unix.Pread(fd, buf[got:], off+int64(got))
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if errors.Is(err, unix.EINVAL) {
			return got, errDirectRefused
		}
		if err != nil {
			return got, err
		}
		if m == 0 {
			break // end of file
		}
		got += m
	}
	return got, nil
}
