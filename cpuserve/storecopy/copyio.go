package storecopy

import (
	"context"
	"hash/crc32"
	"io"
	"time"
)

// What both ends of a copy share: the checksum of a file (the sender's
// of each file it sends or keeps, the receiver's of each it has) and the
// pace of the sender's reads.

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// CRC32C extends sum, a CRC-32C (Castagnoli), with p.
func CRC32C(sum uint32, p []byte) uint32 { return crc32.Update(sum, castagnoli, p) }

// Checksum reads r to its end: the CRC-32C of what it read and its
// length. read, if set, hears each read's bytes (a Pacer, a progress
// bar).
func Checksum(r io.Reader, buf []byte, read func(n int)) (sum uint32, size int64, err error) {
	for {
		n, err := r.Read(buf)
		sum = CRC32C(sum, buf[:n])
		size += int64(n)
		if read != nil {
			read(n)
		}
		if err == io.EOF {
			return sum, size, nil
		} else if err != nil {
			return 0, 0, err
		}
	}
}

// MinRate is the least rate a copy may be paced to (SnapshotRequest.rate):
// a slower one would hold the sender's one copy at a time for hours.
const MinRate = 1 << 20

// Pacer holds a copy's reads of the store's files to a rate
// (SnapshotRequest.rate): after each read it sleeps off the lead the
// bytes read so far have over the rate. A nil Pacer does not pace.
type Pacer struct {
	rate  float64
	start time.Time
	done  int64
}

// NewPacer paces to rate bytes a second; nil (no pace) for rate <= 0.
func NewPacer(rate int64) *Pacer {
	if rate <= 0 {
		return nil
	}
	return &Pacer{rate: float64(rate), start: time.Now()}
}

// Read counts n bytes read, and waits while they are ahead of the rate
// (or until ctx ends).
func (p *Pacer) Read(ctx context.Context, n int) {
	if p == nil {
		return
	}
	p.done += int64(n)
	due := time.Duration(float64(p.done) / p.rate * float64(time.Second))
	if ahead := due - time.Since(p.start); ahead > 0 {
		t := time.NewTimer(ahead)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
		}
	}
}
