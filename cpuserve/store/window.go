package store

import (
	"io"
	"sync"
)

// directAlign is the alignment O_DIRECT asks of a read's offset, length
// and buffer: 4096 covers devices of 512-byte and 4 KiB logical blocks.
const directAlign = 4096

// window serves the reads of a table file opened for sequential reads
// (a preload's or a warm restart's scan, a compaction, an iterator Pebble
// switched to its sequential file) from ranges of the file read ahead
// with O_DIRECT into process memory, up to maxWindow bytes a read.
// Through the page cache each 4 KiB block was a read call of its own plus
// the advice that drops its pages behind: most of a warm restart's CPU
// in its profile, about 10 us a block.
//
// Reads that continue the window double the next one (from minWindow);
// a jump elsewhere starts again from minWindow, so a file read sparsely
// does not read half a megabyte per block. Once reads run in order at
// the full size, the next window is read in the background while the
// current one is consumed (two buffers), as the kernel's readahead
// overlapped the device with the scan's CPU.
type window struct {
	mu   sync.Mutex
	cur  winBuf
	size int // bytes of the next read
	// next is the window after cur, being read (nil: none); spare is a
	// buffer for it.
	next  *winFill
	spare winBuf
}

// winBuf is an aligned buffer holding n bytes of the file from off.
type winBuf struct {
	buf   []byte
	class int
	off   int64
	n     int
}

// winFill is a window read in the background.
type winFill struct {
	done chan struct{}
	b    winBuf
	err  error
}

const (
	minWindow = 64 << 10
	maxWindow = 512 << 10
)

func (b *winBuf) covers(off, end int64) bool {
	return b.buf != nil && off >= b.off && end <= b.off+int64(b.n)
}

func (b *winBuf) release() {
	if b.buf != nil {
		buf := b.buf[:cap(b.buf)]
		directBufs[b.class].Put(&buf)
	}
	*b = winBuf{}
}

func newWinBuf() winBuf {
	buf, class := alignedBuf(maxWindow)
	return winBuf{buf: buf[:maxWindow], class: class}
}

// readWindow serves a read from the window, reading it first when the
// range is not in it. ok is false when the window cannot serve it (a read
// larger than the window, O_DIRECT refused): the caller reads as without
// one.
func (f *dropBehindFile) readWindow(p []byte, off int64) (n int, err error, ok bool) {
	w := f.win
	w.mu.Lock()
	defer w.mu.Unlock()
	end := off + int64(len(p))
	if w.cur.covers(off, end) {
		n = copy(p, w.cur.buf[off-w.cur.off:])
		f.readNext(w, end)
		return n, nil, true
	}
	sequential := w.cur.n > 0 && off >= w.cur.off && off <= w.cur.off+int64(w.cur.n)+minWindow
	if fill := w.next; fill != nil {
		<-fill.done
		w.next = nil
		if fill.err == nil && fill.b.covers(max(off, fill.b.off), end) &&
			(off >= fill.b.off || w.cur.covers(off, fill.b.off)) {
			// In the next window, or straddling the edge of the two.
			if off < fill.b.off {
				n = copy(p, w.cur.buf[off-w.cur.off:w.cur.n])
			}
			w.spare, w.cur = w.cur, fill.b
			n += copy(p[n:], w.cur.buf[off+int64(n)-w.cur.off:])
			f.readNext(w, end)
			return n, nil, true
		}
		w.spare.release()
		w.spare = fill.b
	}
	if f.directOff.Load() {
		return 0, nil, false
	}
	if w.cur.buf == nil {
		w.cur = newWinBuf()
	}
	if sequential {
		w.size = min(2*max(w.size, minWindow), maxWindow)
	} else {
		w.size = minWindow
	}
	start := off &^ (directAlign - 1)
	size := max(w.size, int((end+directAlign-1)&^(directAlign-1)-start))
	if size > maxWindow {
		return 0, nil, false
	}
	got, err := f.fill(&w.cur, start, size)
	if err == errDirectRefused {
		return 0, nil, false
	}
	if err != nil {
		return 0, err, true
	}
	skip := int(off - start)
	if got <= skip {
		return 0, io.EOF, true
	}
	n = copy(p, w.cur.buf[skip:got])
	if n < len(p) {
		return n, io.EOF, true
	}
	f.readNext(w, end)
	return n, nil, true
}

// fill reads size bytes of the file at start (aligned) into b.
func (f *dropBehindFile) fill(b *winBuf, start int64, size int) (int, error) {
	got, err := preadFull(f.direct, b.buf[:size], start)
	if err == errDirectRefused {
		f.directOff.Store(true)
		b.n = 0
		return 0, err
	}
	f.reads.Add(1)
	b.off, b.n = start, got
	// Pages of the range a Prefetch on the file's random-read descriptor
	// brought in before Pebble switched to this one leave too.
	if got > 0 {
		dropPages(f.fd, start, int64(got))
	}
	if err != nil {
		b.n = 0
	}
	return got, err
}

// readNext starts reading the window after cur in the background once
// reads run in order at the full size and have passed half of cur.
// Caller holds w.mu.
func (f *dropBehindFile) readNext(w *window, end int64) {
	if w.next != nil || w.size < maxWindow || w.cur.n < maxWindow || end < w.cur.off+int64(w.cur.n/2) {
		return
	}
	b := w.spare
	w.spare = winBuf{}
	if b.buf == nil {
		b = newWinBuf()
	}
	fill := &winFill{done: make(chan struct{}), b: b}
	w.next = fill
	start := w.cur.off + int64(w.cur.n)
	go func() {
		defer close(fill.done)
		_, fill.err = f.fill(&fill.b, start, maxWindow)
	}()
}

// close waits for a background read and gives the buffers back.
func (w *window) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.next != nil {
		<-w.next.done
		w.next.b.release()
		w.next = nil
	}
	w.cur.release()
	w.spare.release()
}
