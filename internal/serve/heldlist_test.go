package serve

import (
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/internal/grpctest"
)

// TestHeldList: one heartbeat loop's dense workers' list across a
// router's answers, in order. An answer with the list replaces the one
// held (an empty list too: no dense workers); one leaving it out
// (dense_unchanged, of the version announced) is handed on with the
// list held; answers without a version (routers of earlier releases)
// are taken whole, and the loop then announces no version; an answer
// leaving out a list of a version the loop does not hold keeps the
// last list and has the next announcement ask for the whole one.
func TestHeldList(t *testing.T) {
	v := func(process, gen uint64) *prismv1.ListVersion {
		return &prismv1.ListVersion{Process: process, Gen: gen}
	}
	full := func(version *prismv1.ListVersion, addrs ...string) *prismv1.AnnounceResponse {
		return &prismv1.AnnounceResponse{HeartbeatMs: 100, DenseAddrs: addrs, DenseVersion: version}
	}
	unchanged := func(version *prismv1.ListVersion) *prismv1.AnnounceResponse {
		return &prismv1.AnnounceResponse{HeartbeatMs: 100, DenseUnchanged: true, DenseVersion: version}
	}
	steps := []struct {
		name   string
		answer *prismv1.AnnounceResponse
		// announced is the version the loop announces before the
		// answer (nil: none); handed the list handed on with it.
		announced *prismv1.ListVersion
		handed    string
		bad       bool
	}{
		{name: "first answer", answer: full(v(7, 1), "a", "b"), handed: "a,b"},
		{name: "unchanged", announced: v(7, 1), answer: unchanged(v(7, 1)), handed: "a,b"},
		{name: "unchanged again", announced: v(7, 1), answer: unchanged(v(7, 1)), handed: "a,b"},
		{name: "changed", announced: v(7, 1), answer: full(v(7, 2), "b"), handed: "b"},
		{name: "unchanged after the change", announced: v(7, 2), answer: unchanged(v(7, 2)), handed: "b"},
		{name: "router restarted: another process's list", announced: v(7, 2), answer: full(v(9, 1), "c"), handed: "c"},
		{name: "no dense workers", announced: v(9, 1), answer: full(v(9, 2)), handed: ""},
		{name: "still none", announced: v(9, 2), answer: unchanged(v(9, 2)), handed: ""},
		{name: "a router of an earlier release: the whole list", announced: v(9, 2), answer: full(nil, "d"), handed: "d"},
		{name: "its empty list is no dense workers", answer: full(nil), handed: ""},
		{name: "again", answer: full(nil, "e"), handed: "e"},
		{name: "a new router again", answer: full(v(3, 4), "f"), handed: "f"},
		{name: "left out, of a version not held: the last list kept", announced: v(3, 4), answer: unchanged(v(3, 5)), handed: "f", bad: true},
		{name: "the whole list asked for", answer: full(v(3, 5), "g"), handed: "g"},
	}
	var h heldList
	for _, s := range steps {
		if got := h.held(); !(got == nil && s.announced == nil || prismv1.SameList(got, s.announced)) {
			t.Fatalf("%s: the loop announces %v, want %v", s.name, got, s.announced)
		}
		ok := h.take(s.answer)
		if got := strings.Join(s.answer.GetDenseAddrs(), ","); got != s.handed || s.answer.GetDenseUnchanged() {
			t.Errorf("%s: handed on %q (unchanged %v), want %q and the flag cleared", s.name, got, s.answer.GetDenseUnchanged(), s.handed)
		}
		if ok == s.bad {
			t.Errorf("%s: take %v, want %v", s.name, ok, !s.bad)
		}
	}
}

// TestAnnounceOldRouter: a router of an earlier release (fakeRouter:
// no version, the whole list in every answer) is announced no version,
// and every answer's list is handed on as it comes: a change at once,
// and an empty list as no dense workers, never as a list left out.
func TestAnnounceOldRouter(t *testing.T) {
	var bn grpctest.Net
	r := &fakeRouter{dense: []string{"d1:1", "d2:1"}}
	serveRegistry(t, &bn, "old-router", r)
	var mu sync.Mutex
	var last []string
	answers := 0
	ctx, cancel := context.WithCancel(context.Background())
	done := AnnounceWith(ctx, grpctest.Target("old-router"), func() *prismv1.WorkerInfo { return workerInfo("w:1") }, func(resp *prismv1.AnnounceResponse) {
		mu.Lock()
		last, answers = resp.GetDenseAddrs(), answers+1
		mu.Unlock()
	}, quiet(), bn.DialOption())
	defer func() { cancel(); <-done }()
	handed := func(want string) func() bool {
		return func() bool { mu.Lock(); defer mu.Unlock(); return answers > 0 && strings.Join(last, ",") == want }
	}
	eventually(t, "the old router's list", handed("d1:1,d2:1"))
	r.mu.Lock()
	r.dense = nil
	r.mu.Unlock()
	eventually(t, "no dense workers", handed(""))
	r.mu.Lock()
	r.dense = []string{"d3:1"}
	r.mu.Unlock()
	eventually(t, "a dense worker again", handed("d3:1"))
	if n, _, _ := r.counts(); n < 3 {
		t.Fatalf("%d announcements", n)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.held != 0 {
		t.Fatalf("%d of %d announcements to a router of an earlier release named a dense list version", r.held, r.announces)
	}
}
