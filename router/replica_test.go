package router

import (
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/prism-serve/prism/api/prismv1"
)

func entries(from, to int64) []*prismv1.ApplyUpdateRequest {
	var out []*prismv1.ApplyUpdateRequest
	for seq := from; seq <= to; seq++ {
		out = append(out, &prismv1.ApplyUpdateRequest{Seq: seq, Update: &prismv1.UpdateRequest{Model: "m", Table: "t", Ids: []int64{seq}, Rows: make([]byte, 4)}})
	}
	return out
}

// A copy takes in what the holder answers, and refuses answers that do
// not fit it (a holder's bug, or a peer that is not one) without
// keeping a wrong entry: it starts that model over at the holder's
// floor.
func TestReplicaMerge(t *testing.T) {
	type step struct {
		ml      *prismv1.ModelLog // model "m"; nil: the answer has no model
		term    uint64
		wantErr string
		// the copy after: floor+1 .. end, next and committed; absent:
		// it has no model m
		floor, end, next, committed int64
		absent                      bool
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"pages then more", []step{
			{ml: &prismv1.ModelLog{Next: 5, Committed: 4, Entries: entries(1, 2)}, term: 7, end: 2, next: 5, committed: 4},
			{ml: &prismv1.ModelLog{Next: 5, Committed: 5, Entries: entries(3, 5)}, term: 7, end: 5, next: 5, committed: 5},
			{ml: &prismv1.ModelLog{Next: 5, Committed: 5}, term: 7, end: 5, next: 5, committed: 5},
		}},
		{"trimmed by the holder", []step{
			{ml: &prismv1.ModelLog{Next: 3, Committed: 3, Entries: entries(1, 3)}, term: 7, end: 3, next: 3, committed: 3},
			{ml: &prismv1.ModelLog{Next: 4, Committed: 4, Floor: 2, Entries: entries(4, 4)}, term: 7, floor: 2, end: 4, next: 4, committed: 4},
			// The holder trimmed past the copy's end: it starts over.
			{ml: &prismv1.ModelLog{Next: 9, Committed: 9, Floor: 6, Entries: entries(7, 9)}, term: 7, floor: 6, end: 9, next: 9, committed: 9},
		}},
		{"another term starts over", []step{
			{ml: &prismv1.ModelLog{Next: 3, Committed: 3, Entries: entries(1, 3)}, term: 7, end: 3, next: 3, committed: 3},
			{ml: &prismv1.ModelLog{Next: 2, Committed: 2, Entries: entries(1, 2)}, term: 8, end: 2, next: 2, committed: 2},
		}},
		{"a model the holder no longer keeps", []step{
			{ml: &prismv1.ModelLog{Next: 3, Committed: 3, Entries: entries(1, 3)}, term: 7, end: 3, next: 3, committed: 3},
			{ml: nil, term: 7},
		}},
		{"entries with a gap", []step{
			{ml: &prismv1.ModelLog{Next: 5, Committed: 5, Entries: append(entries(1, 2), entries(4, 5)...)}, term: 7, wantErr: "not the next of the log", next: 0},
		}},
		{"entries past the holder's latest", []step{
			{ml: &prismv1.ModelLog{Next: 2, Committed: 2, Entries: entries(1, 3)}, term: 7, wantErr: "not the next of the log"},
		}},
		{"entries below the holder's floor", []step{
			{ml: &prismv1.ModelLog{Next: 5, Committed: 5, Floor: 3, Entries: entries(3, 5)}, term: 7, wantErr: "not the next of the log", floor: 3, end: 3},
		}},
		{"numbers out of order", []step{
			{ml: &prismv1.ModelLog{Next: 2, Committed: 3}, term: 7, wantErr: "numbers out of order", absent: true},
		}},
		// Nothing of an answer whose numbers are out of order is taken:
		// its floor, taken, had the copy end past the holder's latest
		// (FuzzReplicaMerge).
		{"a floor past the latest", []step{
			{ml: &prismv1.ModelLog{Next: 2, Committed: 2, Entries: entries(1, 2)}, term: 7, end: 2, next: 2, committed: 2},
			{ml: &prismv1.ModelLog{Floor: 48}, term: 7, wantErr: "numbers out of order", end: 2, next: 2, committed: 2},
		}},
		{"a copy past the holder's latest", []step{
			{ml: &prismv1.ModelLog{Next: 3, Committed: 3, Entries: entries(1, 3)}, term: 7, end: 3, next: 3, committed: 3},
			{ml: &prismv1.ModelLog{Next: 2, Committed: 2}, term: 7, wantErr: "past the holder's latest", end: 0},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var c replica
			for i, st := range tc.steps {
				resp := &prismv1.UpdateLogResponse{Term: st.term, Epoch: 3, Models: map[string]*prismv1.ModelLog{}}
				if st.ml != nil {
					resp.Models["m"] = st.ml
				}
				err := c.merge(resp)
				if (err == nil) != (st.wantErr == "") || (err != nil && !strings.Contains(err.Error(), st.wantErr)) {
					t.Fatalf("step %d: %v, want error %q", i, err, st.wantErr)
				}
				rm := c.models["m"]
				if st.ml == nil || st.absent {
					if rm != nil {
						t.Fatalf("step %d: the copy keeps model m", i)
					}
					continue
				}
				if rm.floor != st.floor || rm.end() != st.end || ((err == nil || st.next > 0) && (rm.next != st.next || rm.committed != st.committed)) || rm.end() > rm.next {
					t.Fatalf("step %d: copy floor=%d end=%d next=%d committed=%d, want %d %d %d %d", i, rm.floor, rm.end(), rm.next, rm.committed, st.floor, st.end, st.next, st.committed)
				}
				for j, e := range rm.log {
					if e.GetSeq() != rm.floor+1+int64(j) {
						t.Fatalf("step %d: entry %d has seq %d", i, j, e.GetSeq())
					}
				}
			}
		})
	}
}

// Registry.UpdateLog is served by the router that sequences, and
// refused by one that follows a named sequencer (it keeps no log).
func TestUpdateLogServedBySequencerOnly(t *testing.T) {
	seq := testRouter(Options{})
	if _, err := seq.Reg.UpdateLog(t.Context(), &prismv1.UpdateLogRequest{}); err != nil {
		t.Fatalf("sequencer: %v", err)
	}
	fol := testRouter(Options{Sequencer: "10.0.0.9:8500"})
	_, err := fol.Reg.UpdateLog(t.Context(), &prismv1.UpdateLogRequest{})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "10.0.0.9:8500") {
		t.Fatalf("follower: %v, want FailedPrecondition naming the sequencer", err)
	}
	el := testRouter(Options{Election: &handElection{self: "10.0.0.1:8500"}})
	el.el.setLeader("10.0.0.2:8500", 0)
	_, err = el.Reg.UpdateLog(t.Context(), &prismv1.UpdateLogRequest{})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "10.0.0.2:8500") {
		t.Fatalf("elected follower: %v, want FailedPrecondition naming the holder", err)
	}
}

// FuzzUpdateLog decodes any bytes as a Registry.UpdateLog request and
// serves it from a sequencer holding logs: the answer never panics, its
// entries are consecutive within each log, and a copy takes it in
// without error.
func FuzzUpdateLog(f *testing.F) {
	for _, req := range []*prismv1.UpdateLogRequest{
		{},
		{Term: 1, After: map[string]int64{"m": 3}},
		{Term: 2, After: map[string]int64{"m": -5, "other": 1 << 62}, MaxBytes: 1},
		{Term: 1, After: map[string]int64{"m": 9, "n": 4}, MaxBytes: -1},
	} {
		b, err := proto.Marshal(req)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		req := &prismv1.UpdateLogRequest{}
		if proto.Unmarshal(b, req) != nil {
			return
		}
		s := newSequencer(time.Unix(0, 0), time.Second, 1<<20, 0, QuorumOne)
		s.restore("m", 9, 8, 2, entries(3, 9))
		s.restore("n", 4, 4, 4, nil)
		d := newUpdateDriver(s, time.Now, nil, time.Second, 0, nil)
		d.term = 1
		resp, err := d.readLog(req)
		if err != nil {
			t.Fatal(err)
		}
		for name, ml := range resp.GetModels() {
			for i, e := range ml.GetEntries() {
				if i > 0 && e.GetSeq() != ml.GetEntries()[i-1].GetSeq()+1 || e.GetSeq() <= ml.GetFloor() || e.GetSeq() > ml.GetNext() {
					t.Fatalf("model %s: entry %d has seq %d (floor %d, next %d)", name, i, e.GetSeq(), ml.GetFloor(), ml.GetNext())
				}
			}
		}
		var c replica
		if err := c.merge(resp); err != nil {
			t.Fatal(err)
		}
	})
}

// bigEntry is an update of model of at most bytes as Updater measures
// it.
func bigEntry(model string, seq int64, bytes int) *prismv1.ApplyUpdateRequest {
	req := &prismv1.UpdateRequest{Model: model, Table: "t", Ids: []int64{1}}
	n := bytes - proto.Size(&prismv1.ApplyUpdateRequest{Update: req, Seq: math.MaxInt64}) - 5
	n -= n % 4
	for {
		req.Rows = make([]byte, n)
		if proto.Size(&prismv1.ApplyUpdateRequest{Update: req, Seq: math.MaxInt64}) <= bytes {
			return &prismv1.ApplyUpdateRequest{Update: req, Seq: seq}
		}
		n -= 4
	}
}

// Pages of the update log fit the holder's message limit (its
// --max-message-bytes), headers of many models and the largest update
// it accepts included: the copy gets everything over a few pulls.
// Before, a page of the largest update beside 60 models' numbers, or of
// three 4 MiB updates under an 8 MiB limit, was over the limit: every
// pull failed and the copy never moved (found by review).
func TestUpdateLogPagesFitTheLimit(t *testing.T) {
	for _, tc := range []struct {
		name    string
		maxSend int
		fill    func(s *sequencer, largest int)
		want    map[string]int64
	}{
		{"default limit, largest update, 60 models", 64 << 20, func(s *sequencer, largest int) {
			s.restore("big", 1, 1, 0, []*prismv1.ApplyUpdateRequest{bigEntry("big", 1, largest)})
			for i := range 60 {
				s.restore(fmt.Sprintf("model-with-a-longer-name-%02d", i), 2, 2, 1, entries(2, 2))
			}
		}, map[string]int64{"big": 1, "model-with-a-longer-name-00": 2, "model-with-a-longer-name-59": 2}},
		{"8 MiB limit, updates of 4 MiB", 8 << 20, func(s *sequencer, largest int) {
			var log []*prismv1.ApplyUpdateRequest
			for seq := int64(1); seq <= 3; seq++ {
				log = append(log, bigEntry("m", seq, 4<<20))
			}
			log = append(log, bigEntry("m", 4, largest))
			s.restore("m", 4, 4, 0, log)
		}, map[string]int64{"m": 4}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := testRouter(Options{MaxMessageBytes: tc.maxSend})
			tc.fill(r.upd.seq, r.Updater().maxBytes)
			addr, lis := listen(t)
			s := grpc.NewServer(grpc.MaxRecvMsgSize(tc.maxSend), grpc.MaxSendMsgSize(tc.maxSend)) // as internal/serve does
			prismv1.RegisterRegistryServer(s, r.Reg)
			go s.Serve(lis)
			t.Cleanup(s.Stop)
			conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithContextDialer(dialInproc))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { conn.Close() })
			var c replica
			for hb := range 3 {
				if err := c.pull(t.Context(), conn, time.Minute, 16); err != nil {
					t.Fatalf("heartbeat %d: %v", hb, err)
				}
			}
			_, after := c.after()
			for model, end := range tc.want {
				if after[model] != end {
					t.Errorf("the copy of %s ends at %d, want %d", model, after[model], end)
				}
			}
			if len(after) != len(r.upd.seq.models) {
				t.Errorf("the copy holds %d models, the holder %d", len(after), len(r.upd.seq.models))
			}
		})
	}
}

// An update larger than a page in a model that is not the first by
// name is copied in a page of its own, and the models after it too.
// Before, every page began with the models before it and the large
// entry never fit: the copy stopped there (found by review).
func TestUpdateLogLargeEntryOfALaterModel(t *testing.T) {
	r := testRouter(Options{})
	largest := r.Updater().maxBytes
	s := r.upd.seq
	s.restore("a-small", 1, 1, 0, entries(1, 1))
	// Updates applied and refused by turns before the large one: 2,000
	// runs of outcomes (ModelLog.outcomes), about 16 KiB, more than the
	// margin the large entry's page leaves its model's numbers.
	var big []*prismv1.ApplyUpdateRequest
	outcomes := map[int64]int8{}
	for seq := int64(1); seq <= 2000; seq++ {
		big = append(big, bigEntry("m-big", seq, 1<<10))
		outcomes[seq] = []int8{1, -1}[seq%2]
	}
	big = append(big, bigEntry("m-big", 2001, largest))
	s.restore("m-big", 2001, 2001, 0, big)
	s.restoreOutcomes("m-big", outcomes)
	s.restore("z-small", 1, 1, 0, entries(1, 1))
	var c replica
	for page := 0; ; page++ {
		if page > 8 {
			t.Fatal("the copy is not complete after 8 pages")
		}
		term, after := c.after()
		resp, err := r.upd.readLog(&prismv1.UpdateLogRequest{Term: term, After: after})
		if err != nil {
			t.Fatal(err)
		}
		if size := proto.Size(resp); size > r.opts.MaxMessageBytes {
			t.Fatalf("page %d: %d bytes, over the limit %d", page, size, r.opts.MaxMessageBytes)
		}
		if err := c.merge(resp); err != nil {
			t.Fatal(err)
		}
		if !resp.GetMore() {
			break
		}
	}
	_, after := c.after()
	for model, want := range map[string]int64{"a-small": 1, "m-big": 2001, "z-small": 1} {
		if after[model] != want {
			t.Errorf("the copy of %s ends at %d, want %d", model, after[model], want)
		}
	}
	if got := outcomeMap(c.models["m-big"].outcomes, 0, 2001); !maps.Equal(got, outcomes) {
		t.Errorf("the copy holds %d outcomes of m-big, want the holder's %d", len(got), len(outcomes))
	}
}

// A copy converges on the holder's log from any start, whatever the
// page bound: random logs of up to five models (small entries, entries
// over the bound, logs trimmed from below), copies empty, partial, of
// this term or another, and bounds from below one entry to several.
// Each case ends with a page that is not cut short within a bounded
// number of pages, and the copy holds every model's numbers and its
// log's entries.
func TestUpdateLogCopyConverges(t *testing.T) {
	r := rand.New(rand.NewPCG(18, 14))
	for tc := range 2000 {
		s := newSequencer(time.Unix(0, 0), time.Second, 1<<30, 0, QuorumOne)
		names := []string{"a", "model-b", "m", "zz", "long-model-name-e"}[:1+r.IntN(5)]
		for _, name := range names {
			next := int64(r.IntN(8))
			floor := int64(0)
			if next > 0 {
				floor = int64(r.IntN(int(next) + 1))
			}
			var log []*prismv1.ApplyUpdateRequest
			for seq := floor + 1; seq <= next; seq++ {
				size := 8 + r.IntN(64)
				if r.IntN(4) == 0 {
					size = 400 + r.IntN(800) // over most bounds below
				}
				log = append(log, &prismv1.ApplyUpdateRequest{Seq: seq, Update: &prismv1.UpdateRequest{Model: name, Table: "t", Ids: []int64{seq}, Rows: make([]byte, size/4*4)}})
			}
			s.restore(name, next, next-int64(r.IntN(2))*min(next, 1), floor, log)
		}
		d := newUpdateDriver(s, time.Now, nil, time.Second, 0, nil)
		d.term, d.epoch, d.pageBytes = 7, 3, int64(150+r.IntN(2000))
		var c replica
		switch r.IntN(3) {
		case 1: // a copy of this term, part way
			resp, _ := d.readLog(&prismv1.UpdateLogRequest{})
			for _, ml := range resp.GetModels() {
				if n := len(ml.Entries); n > 0 {
					ml.Entries = ml.Entries[:r.IntN(n)]
				}
			}
			resp.More = true
			if err := c.merge(resp); err != nil {
				t.Fatalf("case %d: %v", tc, err)
			}
		case 2: // a copy of another term
			c.merge(&prismv1.UpdateLogResponse{Term: 5, Epoch: 3, Models: map[string]*prismv1.ModelLog{"a": {Next: 9, Committed: 9, Floor: 8, Entries: entries(9, 9)}}})
		}
		done := false
		for page := 0; page < 64 && !done; page++ {
			term, after := c.after()
			resp, err := d.readLog(&prismv1.UpdateLogRequest{Term: term, After: after})
			if err != nil {
				t.Fatal(err)
			}
			if err := c.merge(resp); err != nil {
				t.Fatalf("case %d page %d: %v", tc, page, err)
			}
			done = !resp.GetMore()
		}
		if !done {
			t.Fatalf("case %d (bound %d): still cut short after 64 pages", tc, d.pageBytes)
		}
		for name, m := range s.models {
			if m.next == 0 {
				continue
			}
			rm := c.models[name]
			if rm == nil || rm.next != m.next || rm.committed != m.committed || rm.floor != m.floor || rm.end() != m.next {
				t.Fatalf("case %d: the copy of %s is %+v, the holder's next=%d committed=%d floor=%d", tc, name, rm, m.next, m.committed, m.floor)
			}
			for i, e := range rm.log {
				if e != m.log[i] {
					t.Fatalf("case %d: entry %d of %s is not the holder's", tc, i, name)
				}
			}
		}
		if len(c.models) != len(slices.DeleteFunc(slices.Collect(maps.Values(s.models)), func(m *modelSeq) bool { return m.next == 0 })) {
			t.Fatalf("case %d: the copy holds %d models", tc, len(c.models))
		}
	}
}

// Pages whose bound the models' numbers alone exceed still carry every
// entry: the models with entries due come first. (The numbers of the
// models beyond the bound then wait; a page never ends uncut.)
func TestUpdateLogEntriesBeforeNumbers(t *testing.T) {
	s := newSequencer(time.Unix(0, 0), time.Second, 1<<30, 0, QuorumOne)
	for i := range 20 {
		s.restore(fmt.Sprintf("a-model-without-updates-due-%02d", i), 1, 1, 1, nil)
	}
	s.restore("z-model", 3, 3, 0, entries(1, 3))
	d := newUpdateDriver(s, time.Now, nil, time.Second, 0, nil)
	d.pageBytes = 300 // below the twenty models' numbers
	var c replica
	for range 16 {
		term, after := c.after()
		resp, err := d.readLog(&prismv1.UpdateLogRequest{Term: term, After: after})
		if err != nil {
			t.Fatal(err)
		}
		if err := c.merge(resp); err != nil {
			t.Fatal(err)
		}
	}
	if rm := c.models["z-model"]; rm == nil || rm.end() != 3 {
		t.Fatalf("the copy of z-model: %+v, want it to end at 3", rm)
	}
}

// TestReplicaOrderedEpochs: a copy of the new Lease's first hold drops
// an answer of the deleted Lease's holder (a call under way, or a
// deposed holder still answering), though its count is higher; the
// next hold of the new Lease starts from the copy, and a hold of the
// old Lease's next count does not.
func TestReplicaOrderedEpochs(t *testing.T) {
	const made = 1796126400
	oldHold := uint64(made)<<32 | prismv1.OrderedEpoch | 3
	newHold := uint64(made+60)<<32 | prismv1.OrderedEpoch | 1
	log := func(next int64) map[string]*prismv1.ModelLog {
		return map[string]*prismv1.ModelLog{"a": {Next: next, Committed: next, Entries: []*prismv1.ApplyUpdateRequest{{Seq: 1, Update: &prismv1.UpdateRequest{Model: "a"}}}}}
	}
	var c replica
	if err := c.merge(&prismv1.UpdateLogResponse{Term: 2, Epoch: newHold, Models: log(1)}); err != nil {
		t.Fatal(err)
	}
	if err := c.merge(&prismv1.UpdateLogResponse{Term: 1, Epoch: oldHold, Models: log(1)}); err != nil {
		t.Fatal(err)
	}
	if c.from() != newHold || c.term != 2 {
		t.Fatalf("copy of %s (term %d) after an answer of the old Lease's hold: want the new Lease's %s kept", prismv1.FormatEpoch(c.from()), c.term, prismv1.FormatEpoch(newHold))
	}
	s := newSequencer(time.Now(), time.Second, 1<<20, 0, QuorumOne)
	if models, _, stale := c.restoreTo(s, oldHold+1); models != 0 || !stale {
		t.Fatalf("restored %d models (stale %v) into the old Lease's next hold", models, stale)
	}
	if err := c.merge(&prismv1.UpdateLogResponse{Term: 2, Epoch: newHold, Models: log(1)}); err != nil {
		t.Fatal(err)
	}
	if models, _, stale := c.restoreTo(newSequencer(time.Now(), time.Second, 1<<20, 0, QuorumOne), newHold+1); models != 1 || stale {
		t.Fatalf("restored %d models (stale %v) into the new Lease's next hold, want its copy", models, stale)
	}
}

// The copy carries the holder's diverged marks (ModelLog.diverged) to
// the router elected next: taken from each answer whole (a mark the
// holder forgot leaves the copy), kept with a hold's own log (keep),
// joined by the marks of a hold that learnt its epoch late (extend),
// and restored with the copy (restoreTo). Without them a worker the
// holder had not told yet announced no mark and served again.
func TestReplicaDivergedMarks(t *testing.T) {
	marksOf := func(c *replica) map[string]int64 {
		if rm := c.models["m"]; rm != nil {
			return rm.diverged
		}
		return nil
	}
	holder := newSequencer(time.Now(), time.Second, 1<<20, 0, QuorumOne)
	holder.restore("m", 2, 2, 0, entries(1, 2))
	holder.restoreDiverged("m", map[string]int64{"w2": 1, "w3": 2})
	var c replica
	pull := func(s *sequencer, epoch uint64) {
		t.Helper()
		models, _ := s.readLog(nil, true, math.MaxInt64)
		if err := c.merge(&prismv1.UpdateLogResponse{Term: 1, Epoch: epoch, Models: models}); err != nil {
			t.Fatal(err)
		}
	}
	pull(holder, 5)
	if got, want := marksOf(&c), map[string]int64{"w2": 1, "w3": 2}; !maps.Equal(got, want) {
		t.Fatalf("copy's marks %v, want %v", got, want)
	}
	// w3's registration lapsed: the holder forgot it (its store's mark
	// brings it back when it announces).
	holder.models["m"].leave("w3")
	pull(holder, 5)
	if got, want := marksOf(&c), map[string]int64{"w2": 1}; !maps.Equal(got, want) {
		t.Fatalf("copy's marks after the holder forgot w3: %v, want %v", got, want)
	}
	// A holder of an earlier release sends none.
	if err := c.merge(&prismv1.UpdateLogResponse{Term: 1, Epoch: 5, Models: map[string]*prismv1.ModelLog{"m": {Next: 2, Committed: 2}}}); err != nil {
		t.Fatal(err)
	}
	if got := marksOf(&c); len(got) != 0 {
		t.Fatalf("copy's marks from an answer without any: %v", got)
	}
	pull(holder, 5)

	// The hold of epoch 6 began without its epoch: its sequencer numbered
	// update 3 and found w4 diverged, then learnt the epoch.
	own := newSequencer(time.Now(), time.Second, 1<<20, 0, QuorumOne)
	own.restore("m", 3, 3, 2, entries(3, 3))
	own.restoreDiverged("m", map[string]int64{"w4": 3})
	if !c.extend(own, 6) {
		t.Fatal("extend: no copy of the hold before")
	}
	if got, want := marksOf(&c), map[string]int64{"w2": 1, "w4": 3}; !maps.Equal(got, want) || c.models["m"].end() != 3 {
		t.Fatalf("extended copy's marks %v (ends at %d), want %v (at 3)", got, c.models["m"].end(), want)
	}
	next := newSequencer(time.Now(), time.Second, 1<<20, 0, QuorumOne)
	if models, _, stale := c.restoreTo(next, 6); models != 1 || stale {
		t.Fatalf("restored %d models (stale %v)", models, stale)
	}
	if got, want := next.models["m"].diverged, map[string]int64{"w2": 1, "w4": 3}; !maps.Equal(got, want) {
		t.Fatalf("the new holder's marks %v, want %v", got, want)
	}

	// A hold's own log kept as the copy when the hold ends keeps its
	// marks.
	var kept replica
	kept.keep(next, 2, 6)
	if got, want := marksOf(&kept), map[string]int64{"w2": 1, "w4": 3}; !maps.Equal(got, want) {
		t.Fatalf("kept copy's marks %v, want %v", got, want)
	}
}

// The runs a page carries (outcomeRunsOf, kept as outcomes are decided)
// equal the runs made from the outcomes whole (outcomeRuns), whatever
// the order of decisions and trims, and read back (outcomeMap) as the
// outcomes of the log's updates: random walks of decisions, mostly of
// the next update, some out of order, some repeated, with trims.
func TestOutcomeRunsKept(t *testing.T) {
	for seed := range uint64(200) {
		rng := rand.New(rand.NewPCG(seed, 7))
		m := &modelSeq{outcome: map[int64]int8{}}
		for step := range 300 {
			switch r := rng.IntN(20); {
			case r < 14: // the next update's outcome
				m.next++
				m.decide(m.next, []int8{1, -1}[rng.IntN(4)/3])
			case r < 16: // one numbered, not known yet
				m.next++
			case r < 18 && m.next > m.floor: // out of order, or again
				m.decide(m.floor+1+rng.Int64N(m.next-m.floor), []int8{1, -1}[rng.IntN(2)])
			default: // a trim
				m.log, m.bytes = nil, 0
				for seq := m.floor + 1; seq <= m.next; seq++ {
					e := &prismv1.ApplyUpdateRequest{Seq: seq}
					m.log = append(m.log, e)
					m.bytes += heldBytes(e)
				}
				m.trim(rng.Int64N(m.bytes+1), m.next)
				m.log, m.bytes = nil, 0
			}
			got := m.outcomeRunsOf()
			want := outcomeRuns(m.outcome, m.floor, m.next)
			if !slices.EqualFunc(got, want, func(a, b *prismv1.OutcomeRun) bool { return proto.Equal(a, b) }) {
				t.Fatalf("seed %d step %d: runs %v, want %v (floor %d, next %d)", seed, step, got, want, m.floor, m.next)
			}
			back := outcomeMap(got, m.floor, m.next)
			for seq := m.floor + 1; seq <= m.next; seq++ {
				if v, ok := m.outcome[seq]; back[seq] != v || (ok != (back[seq] != 0)) {
					t.Fatalf("seed %d step %d: update %d reads back %d, want %d", seed, step, seq, back[seq], v)
				}
			}
			if len(m.runs) > int(m.next-m.floor)+1 {
				t.Fatalf("seed %d step %d: %d runs kept for %d updates (trims drop the runs they end)", seed, step, len(m.runs), m.next-m.floor)
			}
			if len(back) > int(m.next-m.floor) {
				t.Fatalf("seed %d step %d: %d outcomes read back for %d updates", seed, step, len(back), m.next-m.floor)
			}
		}
	}
}

// A holder's runs are read only within its log: a run reaching below
// its floor or past its latest, or one of a huge or negative count, adds
// nothing outside floor+1 .. next.
func TestOutcomeMapBounds(t *testing.T) {
	for _, tc := range []struct {
		runs        []*prismv1.OutcomeRun
		floor, next int64
		want        map[int64]int8
	}{
		{nil, 0, 5, nil},
		{[]*prismv1.OutcomeRun{{First: 1, Count: 2}, {First: 3, Count: 1, Refused: true}}, 0, 5, map[int64]int8{1: 1, 2: 1, 3: -1}},
		{[]*prismv1.OutcomeRun{{First: 1, Count: 10}}, 3, 5, map[int64]int8{4: 1, 5: 1}},
		{[]*prismv1.OutcomeRun{{First: 4, Count: 1 << 62}}, 3, 6, map[int64]int8{4: 1, 5: 1, 6: 1}},
		{[]*prismv1.OutcomeRun{{First: 4, Count: -3}, {First: 9, Count: 1}}, 3, 6, nil},
		{[]*prismv1.OutcomeRun{{First: math.MinInt64, Count: math.MaxInt64}}, 0, 2, map[int64]int8{}},
	} {
		got := outcomeMap(tc.runs, tc.floor, tc.next)
		if len(tc.want) == 0 && len(got) == 0 {
			continue
		}
		if !maps.Equal(got, tc.want) {
			t.Errorf("outcomeMap(%v, %d, %d) = %v, want %v", tc.runs, tc.floor, tc.next, got, tc.want)
		}
	}
	if got := outcomeMap([]*prismv1.OutcomeRun{{First: 1, Count: 1 << 40}}, 0, 1<<40); len(got) != maxOutcomes {
		t.Errorf("a run of 2^40 updates read back %d outcomes, want the bound %d", len(got), maxOutcomes)
	}
}

// The outcomes of a holder's updates reach the copy (ModelLog.outcomes),
// an answer without them (a holder of an earlier release, or a page of
// one large entry) leaves the copy's, a hold that learnt its epoch late
// adds those of the updates it appends (extend) and none of a log that
// does not continue the copy (its numbers name other updates), and the
// router elected next (restoreTo) and a hold's own log kept (keep) start
// with them.
func TestReplicaOutcomes(t *testing.T) {
	outcomesOf := func(c *replica) map[int64]int8 {
		if rm := c.models["m"]; rm != nil {
			return outcomeMap(rm.outcomes, rm.floor, rm.next)
		}
		return nil
	}
	holder := newSequencer(time.Now(), time.Second, 1<<20, 0, QuorumOne)
	holder.restore("m", 4, 4, 0, entries(1, 4))
	holder.restoreOutcomes("m", map[int64]int8{1: 1, 2: -1, 3: 1, 4: 1})
	var c replica
	pull := func(s *sequencer, epoch uint64) {
		t.Helper()
		models, _ := s.readLog(nil, true, math.MaxInt64)
		if err := c.merge(&prismv1.UpdateLogResponse{Term: 1, Epoch: epoch, Models: models}); err != nil {
			t.Fatal(err)
		}
	}
	pull(holder, 5)
	want := map[int64]int8{1: 1, 2: -1, 3: 1, 4: 1}
	if got := outcomesOf(&c); !maps.Equal(got, want) {
		t.Fatalf("copy's outcomes %v, want %v", got, want)
	}
	if err := c.merge(&prismv1.UpdateLogResponse{Term: 1, Epoch: 5, Models: map[string]*prismv1.ModelLog{"m": {Next: 4, Committed: 4}}}); err != nil {
		t.Fatal(err)
	}
	if got := outcomesOf(&c); !maps.Equal(got, want) {
		t.Fatalf("copy's outcomes after an answer without any: %v, want %v", got, want)
	}

	// The hold of epoch 6 began without its epoch and adopted update 2
	// (no worker it heard held 3 or 4), then numbered 3' and 4' of its
	// own: the copy's 3 and 4 keep their outcomes.
	other := newSequencer(time.Now(), time.Second, 1<<20, 0, QuorumOne)
	other.restore("m", 4, 4, 2, entries(3, 4))
	other.restoreOutcomes("m", map[int64]int8{3: -1, 4: -1})
	if !c.extend(other, 6) {
		t.Fatal("extend: no copy of the hold before")
	}
	if got := outcomesOf(&c); !maps.Equal(got, want) || c.models["m"].end() != 4 {
		t.Fatalf("copy's outcomes after a log not continuing it: %v (ends at %d), want %v (at 4)", got, c.models["m"].end(), want)
	}
	// One continuing it: its update 5, refused, joins.
	own := newSequencer(time.Now(), time.Second, 1<<20, 0, QuorumOne)
	own.restore("m", 5, 5, 4, entries(5, 5))
	own.restoreOutcomes("m", map[int64]int8{5: -1})
	if !c.extend(own, 6) {
		t.Fatal("extend: no copy of the hold before")
	}
	want[5] = -1
	if got := outcomesOf(&c); !maps.Equal(got, want) || c.models["m"].end() != 5 {
		t.Fatalf("extended copy's outcomes %v (ends at %d), want %v (at 5)", got, c.models["m"].end(), want)
	}

	next := newSequencer(time.Now(), time.Second, 1<<20, 0, QuorumOne)
	if models, _, stale := c.restoreTo(next, 6); models != 1 || stale {
		t.Fatalf("restored %d models (stale %v)", models, stale)
	}
	if got := next.models["m"].outcome; !maps.Equal(got, want) {
		t.Fatalf("the new holder's outcomes %v, want %v", got, want)
	}
	var kept replica
	kept.keep(next, 2, 6)
	if got := outcomesOf(&kept); !maps.Equal(got, want) {
		t.Fatalf("kept copy's outcomes %v, want %v", got, want)
	}
}

// FuzzReplicaMerge: whatever a holder answers (Registry/UpdateLog's
// response, decoded), the copy takes it in or refuses it without a
// panic, holds its entries consecutive and never past the holder's
// latest, reads no more outcomes than its bound, and the router elected
// next starts from it without a panic.
func FuzzReplicaMerge(f *testing.F) {
	for _, resp := range []*prismv1.UpdateLogResponse{
		{},
		{Term: 1, Epoch: 5, Models: map[string]*prismv1.ModelLog{"m": {Next: 3, Committed: 3, Entries: entries(1, 3),
			Outcomes: []*prismv1.OutcomeRun{{First: 1, Count: 2}, {First: 3, Count: 1, Refused: true}}}}},
		{Term: 1, Epoch: 5, Models: map[string]*prismv1.ModelLog{"m": {Next: 9, Committed: 8, Floor: 2, Entries: entries(3, 4),
			Diverged: map[string]int64{"w": 3}, Outcomes: []*prismv1.OutcomeRun{{First: -7, Count: 1 << 62}, {First: 1 << 62, Count: 1 << 62, Refused: true}}}}, More: true},
		{Term: 2, Epoch: 4, Models: map[string]*prismv1.ModelLog{"m": {Next: 1, Committed: 2, Floor: 5}}},
	} {
		b, err := proto.Marshal(resp)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		resp := &prismv1.UpdateLogResponse{}
		if proto.Unmarshal(b, resp) != nil {
			return
		}
		var c replica
		c.merge(&prismv1.UpdateLogResponse{Term: 1, Epoch: 5, Models: map[string]*prismv1.ModelLog{"m": {Next: 2, Committed: 2, Entries: entries(1, 2)}}})
		c.merge(resp) // an error refuses the model's entries, nothing more
		for name, rm := range c.models {
			for i, e := range rm.log {
				if e.GetSeq() != rm.floor+1+int64(i) {
					t.Fatalf("model %s: entry %d has seq %d, floor %d", name, i, e.GetSeq(), rm.floor)
				}
			}
			if rm.end() > rm.next {
				t.Fatalf("model %s: the copy ends at %d, past the holder's latest %d", name, rm.end(), rm.next)
			}
			if n := len(outcomeMap(rm.outcomes, rm.floor, rm.next)); n > maxOutcomes {
				t.Fatalf("model %s: %d outcomes read, over the bound %d", name, n, maxOutcomes)
			}
		}
		s := newSequencer(time.Unix(0, 0), time.Second, 1<<20, 0, QuorumOne)
		c.restoreTo(s, c.epoch+1)
	})
}
