// Package clockstep makes, for tests, the readings of time.Now that a
// step of the wall clock would give (NTP correcting it by seconds, a VM
// resumed from a snapshot): the wall reading moved, the monotonic one
// not. No API of package time makes one, and Go binaries ignore
// libfaketime. Code that compares two readings of time.Now (Sub, Before,
// After) uses their monotonic readings and is immune to a step; code
// that drops them (UnixNano, Unix, Round(0), a time stored or sent)
// compares wall clocks and is not: tests tell the two apart with these
// readings.
package clockstep

import (
	"time"
	"unsafe"
)

// layout is time.Time's (Go 1.9 on): wall holds, when its top bit says
// a monotonic reading is present, the wall clock's seconds since 1885
// in the next 33 bits and its nanoseconds in the low 30; ext holds the
// monotonic reading.
type layout struct {
	wall uint64
	ext  int64
	loc  *time.Location
}

const (
	hasMonotonic = 1 << 63
	nsecBits     = 30
	secBits      = 33
)

// Step returns t, a reading of time.Now, as time.Now would have read it
// had the wall clock been stepped by d (forward when d > 0) before it:
// its wall reading moved by d, its monotonic reading kept. ok is false,
// and t returned as it is, when t has no monotonic reading, the wall
// reading leaves what time.Time keeps beside one, or package time lays
// Time out otherwise than this package knows (checked on the result:
// the test using it skips).
func Step(t time.Time, d time.Duration) (time.Time, bool) {
	if unsafe.Sizeof(t) != unsafe.Sizeof(layout{}) {
		return t, false
	}
	out := t
	l := (*layout)(unsafe.Pointer(&out))
	if l.wall&hasMonotonic == 0 {
		return t, false
	}
	sec := int64(l.wall << 1 >> (nsecBits + 1))
	ns := sec*int64(time.Second) + int64(l.wall&(1<<nsecBits-1)) + int64(d)
	sec, nsec := ns/int64(time.Second), ns%int64(time.Second)
	if nsec < 0 {
		sec, nsec = sec-1, nsec+int64(time.Second)
	}
	if sec < 0 || sec >= 1<<secBits {
		return t, false
	}
	l.wall = hasMonotonic | uint64(sec)<<nsecBits | uint64(nsec)
	// What a step is: the same monotonic reading, the wall's moved by d.
	if out.Sub(t) != 0 || out.Round(0).Sub(t.Round(0)) != d || out.Location() != t.Location() {
		return t, false
	}
	return out, true
}
