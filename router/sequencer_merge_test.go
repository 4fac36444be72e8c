package router

import (
	"testing"
	"time"

	"github.com/prism-serve/prism/api/prismv1"
)

// TestMergeBounds: a merged update carries at most maxMergeUpdates
// updates, and no more bytes than the router's message limit allows
// (mergeBytesFor); testdata/sequencer/groupcommit.txt has the rest.
func TestMergeBounds(t *testing.T) {
	for _, c := range []struct {
		maxMessage int
		want       int64
	}{
		{64 << 20, defaultMergeBytes},
		{4<<20 + logPageMargin + applyWrapBytes, defaultMergeBytes},
		{MinMessageBytes, MinMessageBytes - logPageMargin - applyWrapBytes},
		{512 << 20, defaultMergeBytes},
	} {
		if got := mergeBytesFor(c.maxMessage); got != c.want {
			t.Errorf("mergeBytesFor(%d) = %d, want %d", c.maxMessage, got, c.want)
		}
	}

	start := time.Unix(1000, 0)
	s := newSequencer(start, time.Second, 256<<20, 0, QuorumOne)
	s.announced(start, &prismv1.WorkerInfo{Id: "w1", Addr: "a1", Role: prismv1.Role_ROLE_EMBEDDING, Models: []string{"m"}, UpdateSeq: map[string]int64{"m": 0}})
	now := start.Add(3 * time.Second)
	const n = maxMergeUpdates + 6
	for c := uint64(1); c <= n; c++ {
		s.propose(now, c, &prismv1.UpdateRequest{Model: "m", Table: "t", Ids: []int64{int64(c)}, Rows: make([]byte, 4)}, now.Add(time.Minute))
	}
	// sent are the updates each apply of the step carries.
	sent := func() (out []int) {
		for _, m := range s.ready() {
			if m.Type == msgApply {
				out = append(out, max(1, len(m.Merged)))
				if k := len(m.Apply.GetUpdate().GetIds()); k != out[len(out)-1] {
					t.Fatalf("apply of %d updates carries %d ids", out[len(out)-1], k)
				}
			}
		}
		return out
	}
	for seq, want := range []int{1, maxMergeUpdates, n - 1 - maxMergeUpdates} {
		if got := sent(); len(got) != 1 || got[0] != want {
			t.Fatalf("update %d carries %v updates, want %d", seq+1, got, want)
		}
		s.applied(now, s.models["m"].inflight.client, "m", "w1", int64(seq+1), nil)
	}
	if m := s.models["m"]; m.inflight != nil || len(m.queue) != 0 || m.committed != 3 {
		t.Fatalf("after three updates: committed %d, queue %d", m.committed, len(m.queue))
	}
}
