package router

import (
	"encoding/binary"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
)

// TestMergeRandom drives one sequence through seeded random histories of
// group commit (sequencer_merge.go): clients proposing one-to-three-row
// updates (some with an id outside the table), clients giving up,
// deadlines passing, heartbeats, workers answering in any order, late
// (the per-worker timeout) or not at all until a replay. Two workers
// keep a store as cpuserve's does (an update in turn is written, one
// with an id outside the table takes its number and writes nothing).
// With diverge, the second worker's table is half the first's (workers
// mid-rollout): some clients' ids are in range on the first only, and
// the workers answer their updates differently.
// Whatever the history, once every apply is answered:
//   - every client is answered once;
//   - the workers still in the model (not diverged) hold the same
//     copy: the same rows written in the same order (with diverge, a
//     worker applying by a catch-up replay of the update in flight an
//     update its peer refused, or the reverse, is diverged);
//   - on each worker, the rows of an id are written in the order the
//     router accepted their clients (a client's number here);
//   - a client answered OK has its rows on every worker still in the
//     model (not diverged); one answered InvalidArgument is one with an
//     id outside a table (with diverge, possibly the second worker's
//     alone); the rows of one with an id outside every table are on no
//     worker, as are those of a client that gave up while its update
//     waited;
//   - a client whose update both workers were sent, and answered OK or
//     InvalidArgument each, is not told Unavailable below the quorum:
//     a refuser of an update the other applied is out of the model and
//     not counted (outOfModel), so no client of a merged update hears
//     Unavailable for another's rows.
func TestMergeRandom(t *testing.T) {
	for _, diverge := range []bool{false, true} {
		for _, q := range []Quorum{QuorumOne, QuorumAll} {
			merged := 0
			for seed := range uint64(*mergeSeeds) {
				n, err := mergeHistory(seed, q, diverge)
				if err != nil {
					t.Fatalf("quorum %s, diverge %v, seed %d: %v", q, diverge, seed, err)
				}
				merged += n
			}
			if merged == 0 {
				t.Fatalf("quorum %s, diverge %v: no history merged an update", q, diverge)
			}
		}
	}
}

var mergeSeeds = flag.Int("merge-seeds", 400, "the histories TestMergeRandom runs of each kind")

// mergeWorker is a worker's store in TestMergeRandom: the seq it holds
// and, in order, each row written (its id and its client); its table t
// has rows ids below rows.
type mergeWorker struct {
	id           string
	rows         int64
	held         int64
	ids, clients []int64
	inbox        []message
}

// take applies m as cpuserve's store would and says how. As there,
// an update is judged before its number is: one with an id outside the
// table is refused, held already or not (SkipSeqsAt takes a held number
// as nothing to take), so a replay of a number the worker refused is
// refused again, not answered as held.
func (w *mergeWorker) take(m message) error {
	a := m.Apply
	seq := a.GetSeq()
	if seq > w.held+1 {
		return status.Error(codes.FailedPrecondition, "behind")
	}
	u := a.GetUpdate()
	for _, id := range u.GetIds() {
		if id >= w.rows {
			w.held = max(w.held, seq)
			return status.Error(codes.InvalidArgument, "id outside the table")
		}
	}
	switch {
	case seq <= w.held && a.GetFresh():
		return status.Error(codes.AlreadyExists, "held already")
	case seq <= w.held:
		return nil
	}
	w.held = seq
	for i, id := range u.GetIds() {
		if u.GetTable() == "u" {
			id += 1000 // a row of the other table
		}
		w.ids = append(w.ids, id)
		w.clients = append(w.clients, int64(math.Float32frombits(binary.LittleEndian.Uint32(u.GetRows()[4*i:]))))
	}
	return nil
}

func mergeHistory(seed uint64, q Quorum, diverge bool) (merged int, _ error) {
	r := rand.New(rand.NewPCG(seed, 7))
	now := time.Unix(1000, 0)
	s := newSequencer(now, time.Second, 256<<20, 0, q)
	if r.IntN(2) == 0 {
		// A merged update of two or three one-row updates at most: the
		// byte bound ends gathering midway, with updates of the other
		// table passed over before it and waiting after it.
		s.mergeBytes = int64(60 + r.IntN(40))
	}
	ws := []*mergeWorker{{id: "w1", rows: 100}, {id: "w2", rows: 100}}
	if diverge {
		ws[1].rows = 50
	}
	for _, w := range ws {
		s.announced(now, &prismv1.WorkerInfo{Id: w.id, Addr: "a-" + w.id, Role: prismv1.Role_ROLE_EMBEDDING, Models: []string{"m"}, UpdateSeq: map[string]int64{"m": 0}})
	}
	now = now.Add(3 * time.Second)
	answers := map[uint64][]error{}
	gaveUp, bad, half := map[uint64]bool{}, map[uint64]bool{}, map[uint64]bool{}
	// last is the update each client was last sent in, sent how many
	// client applies each update had, said their answers' codes.
	last, sent, said := map[uint64]int64{}, map[int64]int{}, map[int64][]codes.Code{}
	next := uint64(1)
	carry := func() {
		for _, m := range s.ready() {
			switch m.Type {
			case msgApply:
				if len(m.Merged) > 1 {
					merged++
				}
				if m.Client != 0 {
					sent[m.Apply.GetSeq()]++
					last[m.Client] = m.Apply.GetSeq()
					for _, c := range m.Merged {
						last[c] = m.Apply.GetSeq()
					}
				}
				for _, w := range ws {
					if w.id == m.Worker {
						w.inbox = append(w.inbox, m)
					}
				}
			case msgAnswer:
				answers[m.Client] = append(answers[m.Client], m.Err)
			}
		}
	}
	deliver := func(w *mergeWorker, late bool) {
		m := w.inbox[0]
		w.inbox = w.inbox[1:]
		err := w.take(m)
		if late && m.Client != 0 {
			err = errWorkerTimeout // applied or not, answered too late
		}
		if m.Client != 0 {
			said[m.Apply.GetSeq()] = append(said[m.Apply.GetSeq()], status.Code(err))
		}
		s.applied(now, m.Client, "m", w.id, m.Apply.GetSeq(), err)
		carry()
	}
	for range 200 {
		switch k := r.IntN(10); {
		case k < 4 && next < 60:
			c := next
			next++
			ids := make([]int64, 1+r.IntN(3))
			rows := make([]byte, 0, 4*len(ids))
			for i := range ids {
				ids[i] = int64(r.IntN(5))
				rows = binary.LittleEndian.AppendUint32(rows, math.Float32bits(float32(c)))
			}
			if r.IntN(8) == 0 {
				ids[r.IntN(len(ids))] = 999
				bad[c] = true
			}
			if diverge && !bad[c] && r.IntN(6) == 0 {
				ids[r.IntN(len(ids))] = 50 + int64(r.IntN(50)) // outside w2's table only
				half[c] = true
			}
			table := "t"
			if r.IntN(3) == 0 {
				table = "u"
			}
			s.propose(now, c, &prismv1.UpdateRequest{Model: "m", Table: table, Ids: ids, Rows: rows}, now.Add(time.Duration(1+r.IntN(20))*time.Second))
			carry()
		case k == 4 && next > 1:
			c := 1 + uint64(r.IntN(int(next-1)))
			if len(answers[c]) == 0 {
				s.cancel(now, c, status.Error(codes.Canceled, "gave up"))
				carry()
				gaveUp[c] = len(answers[c]) > 0 // answered at once: it was waiting
			}
		case k == 5:
			now = now.Add(time.Duration(r.IntN(1500)) * time.Millisecond)
			s.tick(now)
			carry()
		default:
			if w := ws[r.IntN(len(ws))]; len(w.inbox) > 0 {
				// Some answers come too late, with diverge too: the worker
				// is left slow, and the catch-up replays it the update
				// still in flight, whose answer counts as its own in the
				// fan-out (countReplays), or a refusal whose answer was
				// lost, which it refuses again.
				deliver(w, r.IntN(8) == 0)
			}
		}
	}
	// Every apply answered, heartbeats replaying what a worker lacks.
	for range 1000 {
		if len(ws[0].inbox)+len(ws[1].inbox) == 0 {
			now = now.Add(time.Second)
			s.tick(now)
			carry()
			if len(ws[0].inbox)+len(ws[1].inbox) == 0 {
				break
			}
		}
		for _, w := range ws {
			for len(w.inbox) > 0 {
				deliver(w, false)
			}
		}
	}
	for c := uint64(1); c < next; c++ {
		if len(answers[c]) != 1 {
			return merged, fmt.Errorf("client %d answered %d times: %v", c, len(answers[c]), answers[c])
		}
		err := answers[c][0]
		if status.Code(err) == codes.InvalidArgument && !bad[c] && !half[c] {
			return merged, fmt.Errorf("client %d, whose ids are all in the table, refused: %v", c, err)
		}
		if seq, ok := last[c]; ok && status.Code(err) == codes.Unavailable && strings.Contains(status.Convert(err).Message(), "below the update quorum") && sent[seq] == len(ws) &&
			!slices.ContainsFunc(said[seq], func(k codes.Code) bool { return k != codes.OK && k != codes.InvalidArgument }) {
			return merged, fmt.Errorf("client %d told %v, though every worker its update %d went to applied it or refused it as bad input (%v)", c, err, seq, said[seq])
		}
	}
	// The workers still in the model hold one copy: the same rows,
	// written in the same order. One that answered an update otherwise
	// than its peer (applied where the other refused it as bad input)
	// holds another and must be out of the model (diverged), however it
	// was sent the update: fan-out, replay, or a replay of the update in
	// flight.
	var in []*mergeWorker
	for _, w := range ws {
		if _, diverged := s.models["m"].diverged[w.id]; !diverged {
			in = append(in, w)
		}
	}
	for _, w := range in[min(1, len(in)):] {
		if !slices.Equal(w.ids, in[0].ids) || !slices.Equal(w.clients, in[0].clients) {
			return merged, fmt.Errorf("workers %s and %s both serve, with different copies: ids %v clients %v, and ids %v clients %v", in[0].id, w.id, in[0].ids, in[0].clients, w.ids, w.clients)
		}
	}
	for _, w := range in {
		if w.held != s.models["m"].next {
			return merged, fmt.Errorf("worker %s holds %d of %d", w.id, w.held, s.models["m"].next)
		}
		wrote := map[int64]bool{}
		last := map[int64]int64{}
		for i, id := range w.ids {
			c := w.clients[i]
			if l, ok := last[id]; ok && c < l {
				return merged, fmt.Errorf("worker %s: row %d written by client %d after client %d (ids %v, clients %v)", w.id, id, c, l, w.ids, w.clients)
			}
			last[id], wrote[c] = c, true
		}
		for c := uint64(1); c < next; c++ {
			switch err := answers[c][0]; {
			case err == nil && !wrote[int64(c)]:
				return merged, fmt.Errorf("worker %s: client %d answered OK, its rows not written", w.id, c)
			case bad[c] && wrote[int64(c)]:
				return merged, fmt.Errorf("worker %s: client %d's update with an id outside the table written", w.id, c)
			case gaveUp[c] && wrote[int64(c)]:
				return merged, fmt.Errorf("worker %s: client %d gave up while waiting, and its rows were written", w.id, c)
			}
		}
	}
	return merged, nil
}
