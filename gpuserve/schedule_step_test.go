package gpuserve

import (
	"testing"
	"time"

	"github.com/prism-serve/prism/internal/clockstep"
)

// TestEDFAcrossAClockStep: requests queued on either side of a step of
// the wall clock (NTP correcting it) are ordered by their deadlines as
// the monotonic clock has them. Keyed by the wall clock, a request
// queued after a step back of 10 s went before one due 50 ms sooner.
func TestEDFAcrossAClockStep(t *testing.T) {
	for _, tc := range []struct {
		name string
		step time.Duration
		// bDue is b's deadline after its arrival, 1 ms after a's, whose
		// deadline is 50 ms after its own.
		bDue time.Duration
		want []uint64
	}{
		{"back 10s, b due later", -10 * time.Second, 100 * time.Millisecond, []uint64{1, 2}},
		{"forward 10s, b due sooner", 10 * time.Second, 20 * time.Millisecond, []uint64{2, 1}},
		{"no step, b due later", 0, 100 * time.Millisecond, []uint64{1, 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			now := time.Now()
			a := &pending{}
			a.seq, a.n, a.arrived, a.deadline = 1, 1, now, now.Add(50*time.Millisecond)
			// b's times as time.Now reads them after the step.
			bAt, ok := clockstep.Step(now.Add(time.Millisecond), tc.step)
			if !ok {
				t.Skip("no stepped clock readings on this runtime")
			}
			b := &pending{}
			b.seq, b.n, b.arrived, b.deadline = 2, 1, bAt, bAt.Add(tc.bDue)
			o := BatchOptions{MaxBatch: 8, MaxDelay: time.Hour, MaxQueue: 64}
			d := formBatch([]*pending{a, b}, bAt, o, nil, true)
			var got []uint64
			for _, p := range d.batch {
				got = append(got, p.seq)
			}
			if len(got) != 2 || got[0] != tc.want[0] || got[1] != tc.want[1] {
				t.Errorf("run order %v, want %v (late %d)", got, tc.want, len(d.late))
			}
		})
	}
}
