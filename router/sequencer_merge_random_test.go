package router

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
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
// Whatever the history, once every apply is answered:
//   - every client is answered once;
//   - on each worker, the rows of an id are written in the order the
//     router accepted their clients (a client's number here);
//   - a client answered OK has its rows on every worker; one answered
//     InvalidArgument is the one with the bad id, whose rows are on no
//     worker, as are those of a client that gave up while its update
//     waited.
func TestMergeRandom(t *testing.T) {
	for _, q := range []Quorum{QuorumOne, QuorumAll} {
		merged := 0
		for seed := range uint64(400) {
			n, err := mergeHistory(seed, q)
			if err != nil {
				t.Fatalf("quorum %s, seed %d: %v", q, seed, err)
			}
			merged += n
		}
		if merged == 0 {
			t.Fatalf("quorum %s: no history merged an update", q)
		}
	}
}

// mergeWorker is a worker's store in TestMergeRandom: the seq it holds
// and, in order, each row written (its id and its client).
type mergeWorker struct {
	id           string
	held         int64
	ids, clients []int64
	inbox        []message
}

// take applies m as cpuserve's store would and says how.
func (w *mergeWorker) take(m message) error {
	a := m.Apply
	seq := a.GetSeq()
	switch {
	case seq <= w.held && a.GetFresh():
		return status.Error(codes.AlreadyExists, "held already")
	case seq <= w.held:
		return nil
	case seq > w.held+1:
		return status.Error(codes.FailedPrecondition, "behind")
	}
	w.held = seq
	u := a.GetUpdate()
	for _, id := range u.GetIds() {
		if id >= 100 {
			return status.Error(codes.InvalidArgument, "id outside the table")
		}
	}
	for i, id := range u.GetIds() {
		if u.GetTable() == "u" {
			id += 1000 // a row of the other table
		}
		w.ids = append(w.ids, id)
		w.clients = append(w.clients, int64(math.Float32frombits(binary.LittleEndian.Uint32(u.GetRows()[4*i:]))))
	}
	return nil
}

func mergeHistory(seed uint64, q Quorum) (merged int, _ error) {
	r := rand.New(rand.NewPCG(seed, 7))
	now := time.Unix(1000, 0)
	s := newSequencer(now, time.Second, 256<<20, 0, q)
	if r.IntN(2) == 0 {
		// A merged update of two or three one-row updates at most: the
		// byte bound ends gathering midway, with updates of the other
		// table passed over before it and waiting after it.
		s.mergeBytes = int64(60 + r.IntN(40))
	}
	ws := []*mergeWorker{{id: "w1"}, {id: "w2"}}
	for _, w := range ws {
		s.announced(now, &prismv1.WorkerInfo{Id: w.id, Addr: "a-" + w.id, Role: prismv1.Role_ROLE_EMBEDDING, Models: []string{"m"}, UpdateSeq: map[string]int64{"m": 0}})
	}
	now = now.Add(3 * time.Second)
	answers := map[uint64][]error{}
	gaveUp, bad := map[uint64]bool{}, map[uint64]bool{}
	next := uint64(1)
	carry := func() {
		for _, m := range s.ready() {
			switch m.Type {
			case msgApply:
				if len(m.Merged) > 1 {
					merged++
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
		if err := answers[c][0]; status.Code(err) == codes.InvalidArgument && !bad[c] {
			return merged, fmt.Errorf("client %d, whose ids are all in the table, refused: %v", c, err)
		}
	}
	for _, w := range ws {
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
