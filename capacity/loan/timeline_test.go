package loan

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/prism-serve/prism/capacity"
)

// TestTimelineBounded: a loan runs for weeks, borrowing for every peak
// and returning after it. Each borrow and return added to the driver's
// timeline (GET /loan) and to its sets of workers seen serving or failed,
// and nothing ever left them: the process grew, and every GET /loan
// copied and sent the whole history under the driver's lock. After many
// cycles the timeline holds the newest maxEvents events and says how
// many older ones it dropped (their counts by kind and reason stay in
// events_by_kind_reason), and the sets hold only workers still lent.
func TestTimelineBounded(t *testing.T) {
	for _, tc := range []struct {
		name string
		// deadOnArrival: every borrowed worker fails to start.
		deadOnArrival bool
		cycles        int
	}{
		{name: "served and returned", cycles: 3 * maxEvents / 8},
		{name: "failed borrows", deadOnArrival: true, cycles: 3 * maxEvents / 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, capacity.Options{MinLease: 2 * time.Second, CoolDown: time.Second, MaxBorrowed: 2}, true)
			r.lender.deadOnArrival = tc.deadOnArrival
			var first Status
			for cycle := range tc.cycles {
				for i := range 10 {
					r.step(180+float64(i%3)*40, false) // a peak, wobbling: the shed advice moves
				}
				for range 10 {
					r.step(10, false)
				}
				if cycle == 0 {
					first = r.d.Status()
				}
			}
			st := r.d.Status()
			if len(first.Events) == 0 {
				t.Fatalf("no event in the first cycle: %+v", first)
			}
			total := 0
			for _, n := range st.Counts {
				total += n
			}
			if len(st.Events) > maxEvents {
				t.Errorf("after %d cycles the timeline holds %d events, want at most %d", tc.cycles, len(st.Events), maxEvents)
			}
			if st.EventsDropped == 0 || st.EventsDropped+len(st.Events) < len(first.Events)*tc.cycles/2 {
				t.Errorf("timeline of %d events says %d dropped after %d cycles of about %d events each", len(st.Events), st.EventsDropped, tc.cycles, len(first.Events))
			}
			if last, newest := st.Events[len(st.Events)-1].T, r.now.Sub(r.d.start).Seconds(); newest-last > 20 {
				t.Errorf("the timeline's last event is at %.0fs, the run at %.0fs: the newest were dropped", last, newest)
			}
			r.d.mu.Lock()
			serving, failed, kept := len(r.d.serving), len(r.d.failed), cap(r.d.events)
			r.d.mu.Unlock()
			if lent := len(r.lender.Workers()); serving > lent || failed > lent {
				t.Errorf("the driver remembers %d workers serving and %d failed, the lender lends %d", serving, failed, lent)
			}
			if kept > 2*maxEvents {
				t.Errorf("the timeline's slice holds room for %d events", kept)
			}
			b, err := json.Marshal(st)
			if err != nil {
				t.Fatal(err)
			}
			if limit := 300 * maxEvents; len(b) > limit {
				t.Errorf("GET /loan answers %d bytes after %d cycles, want under %d", len(b), tc.cycles, limit)
			}
			t.Logf("%d cycles: %d events shown, %d dropped, /loan %d bytes", tc.cycles, len(st.Events), st.EventsDropped, len(b))
		})
	}
}
