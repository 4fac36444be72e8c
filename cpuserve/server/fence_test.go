package server_test

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/cpuserve/store"
	"github.com/prism-serve/prism/internal/leview"
)

// TestUpdateFencedByEpoch (issue 14): a worker that has heard of a
// hold of the sequencing Lease (a router's answer to its announcement,
// Server.Announced, or an update) refuses the updates of an earlier
// hold of the same Lease with FailedPrecondition naming both epochs
// (prismv1.IsStaleEpoch), writing nothing and taking no number: a
// client's update, its replay, one of bad input. A later epoch raises
// the kept one; among legacy epochs (routers of earlier releases: a
// uid's hash in the high 32 bits) another Lease's is not compared; 0
// (no election) is not checked. Ordered epochs (what routers send now,
// prismv1.OrderedEpoch: the Lease's creation time in the high 32 bits)
// are compared across Leases, and once one is heard legacy epochs are
// refused.
func TestUpdateFencedByEpoch(t *testing.T) {
	fx := ownFixture(t)
	model, tab := fx.plan.Model.Name, fx.plan.Tables[0]
	ctx := context.Background()
	const lease, other = uint64(0xfe11ce00) << 32, uint64(0x0c0ffee0) << 32
	const oldLease, newLease = uint64(1796126400)<<32 | prismv1.OrderedEpoch, uint64(1796126460)<<32 | prismv1.OrderedEpoch
	read := func() float32 {
		t.Helper()
		l := store.TableLookup{Table: tab.Name, IDs: []int64{4}, Pooling: store.PoolNone, Out: make([]float32, tab.Dim)}
		if err := fx.st.Lookup(model, []store.TableLookup{l}); err != nil {
			t.Fatal(err)
		}
		return l.Out[0]
	}
	base := fx.srv.WorkerInfo("w", "addr").GetUpdateSeq()[model]
	before := read()
	steps := []struct {
		announce uint64 // an announcement's answer carrying this epoch (no update)
		seq      int64  // past base
		epoch    uint64
		table    string // "": the model's first
		fresh    bool
		val      float32
		want     codes.Code
		stale    bool
		held     uint64  // the epoch a fenced refusal names as heard of
		after    int64   // seq held afterwards, past base
		row      float32 // row 4 afterwards (0: as before the test)
	}{
		{announce: lease | 5},
		{seq: 1, epoch: lease | 4, fresh: true, val: 0.25, want: codes.FailedPrecondition, stale: true, held: lease | 5, after: 0},
		{seq: 1, epoch: lease | 4, table: "nope", fresh: true, want: codes.FailedPrecondition, stale: true, held: lease | 5, after: 0}, // bad input: no number taken either
		{seq: 1, epoch: 0, fresh: true, val: 0.5, after: 1, row: 0.5},                                                                  // unchecked
		{seq: 1, epoch: lease | 4, val: 0.5, want: codes.FailedPrecondition, stale: true, held: lease | 5, after: 1, row: 0.5},         // a replay is not acknowledged
		{seq: 2, epoch: lease | 6, fresh: true, val: 0.75, after: 2, row: 0.75},                                                        // raises to 6
		{seq: 3, epoch: lease | 5, fresh: true, val: 0.125, want: codes.FailedPrecondition, stale: true, held: lease | 6, after: 2, row: 0.75},
		{seq: 3, epoch: other | 1, fresh: true, val: 1, after: 3, row: 1},                                                                     // another legacy Lease: not compared
		{seq: 4, epoch: newLease | 1, fresh: true, val: 2, after: 4, row: 2},                                                                  // ordered after legacy: raises
		{seq: 5, epoch: oldLease | 9, fresh: true, val: 3, want: codes.FailedPrecondition, stale: true, held: newLease | 1, after: 4, row: 2}, // a Lease made earlier: refused
		{seq: 5, epoch: other | 2, fresh: true, val: 3, want: codes.FailedPrecondition, stale: true, held: newLease | 1, after: 4, row: 2},    // legacy after ordered: refused
		{announce: oldLease | 12}, // a deposed holder's answer raises nothing
		{seq: 5, epoch: newLease | 1, fresh: true, val: 4, after: 5, row: 4},
	}
	for i, st := range steps {
		if st.announce != 0 {
			if err := fx.srv.Announced(&prismv1.AnnounceResponse{Epoch: st.announce}); err != nil {
				t.Fatalf("step %d: announced epoch %#x: %v", i, st.announce, err)
			}
			continue
		}
		table := st.table
		if table == "" {
			table = tab.Name
		}
		rows := make([]float32, tab.Dim)
		for j := range rows {
			rows[j] = st.val
		}
		_, err := fx.srv.Update(ctx, &prismv1.ApplyUpdateRequest{Seq: base + st.seq, Epoch: st.epoch, Fresh: st.fresh,
			Update: &prismv1.UpdateRequest{Model: model, Table: table, Ids: []int64{4}, Rows: leview.Bytes(rows)}})
		if status.Code(err) != st.want || prismv1.IsStaleEpoch(err) != st.stale {
			t.Fatalf("step %d: update %d of epoch %#x: %v, want %v (fenced: %v)", i, base+st.seq, st.epoch, err, st.want, st.stale)
		}
		if st.stale {
			msg := status.Convert(err).Message()
			if !strings.Contains(msg, prismv1.FormatEpoch(st.epoch)) || !strings.Contains(msg, prismv1.FormatEpoch(st.held)) {
				t.Errorf("step %d: %q does not name both epochs", i, msg)
			}
		}
		if got := fx.srv.WorkerInfo("w", "addr").GetUpdateSeq()[model]; got != base+st.after {
			t.Fatalf("step %d: worker holds update %d, want %d", i, got, base+st.after)
		}
		want := st.row
		if want == 0 {
			want = before
		}
		if got := read(); got != want {
			t.Fatalf("step %d: row 4 reads %v, want %v", i, got, want)
		}
	}
	if got, err := fx.st.Epoch(); err != nil || got != newLease|1 {
		t.Fatalf("kept epoch %#x, %v; want %#x", got, err, newLease|1)
	}
}

// TestDivergedMarkRecorded (issue 14): the sequencing router's answer
// names the models whose copy it found diverged; the worker records each
// in its store before it announces again and announces it from then on
// (WorkerInfo.diverged), so a router that restarts, or another one,
// still keeps it out. Later answers repeat it, changing nothing; a model
// the worker does not serve is not recorded, nor a mark past the update
// it holds.
func TestDivergedMarkRecorded(t *testing.T) {
	fx := ownFixture(t)
	model, tab := fx.plan.Model.Name, fx.plan.Tables[0]
	if got := fx.srv.WorkerInfo("w", "addr").GetDiverged(); got != nil {
		t.Fatalf("a fresh worker announces diverged %v", got)
	}
	base := fx.srv.WorkerInfo("w", "addr").GetUpdateSeq()[model]
	_, err := fx.srv.Update(context.Background(), &prismv1.ApplyUpdateRequest{Seq: base + 1, Fresh: true,
		Update: &prismv1.UpdateRequest{Model: model, Table: tab.Name, Ids: []int64{4}, Rows: leview.Bytes(make([]float32, tab.Dim))}})
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range []map[string]int64{{"other": 1, model: base + 9}, {model: base + 1}, {model: base + 1}} {
		if err := fx.srv.Announced(&prismv1.AnnounceResponse{Diverged: d}); err != nil {
			t.Fatalf("announced diverged %v: %v", d, err)
		}
	}
	if got := fx.srv.WorkerInfo("w", "addr").GetDiverged(); len(got) != 1 || got[model] != base+1 {
		t.Fatalf("the worker announces diverged %v, want %s at %d", got, model, base+1)
	}
	if got, err := fx.st.Diverged(); err != nil || got[model] != base+1 {
		t.Fatalf("its store records %v, %v", got, err)
	}
}

// TestOutForGood: what a worker mending itself (prism serve embedding
// --mend) acts on: the models its store marks diverged and those the
// sequencing router said it is stranded on (kept for the process's
// life, as no replay brings it back), each heard of once on OutNews; a
// model it does not serve is neither, and an answer that says nothing
// (another router's) takes nothing back.
func TestOutForGood(t *testing.T) {
	fx := ownFixture(t)
	model := fx.plan.Model.Name
	news := func() bool {
		select {
		case <-fx.srv.OutNews():
			return true
		default:
			return false
		}
	}
	if out, err := fx.srv.OutForGood(); err != nil || len(out) != 0 || news() {
		t.Fatalf("a fresh worker: out %v, %v", out, err)
	}
	for _, step := range []struct {
		resp *prismv1.AnnounceResponse
		want string // model's reason, "" none
		news bool
	}{
		{&prismv1.AnnounceResponse{Stranded: []string{"other"}}, "", false},
		{&prismv1.AnnounceResponse{Stranded: []string{model}}, "stranded", true},
		{&prismv1.AnnounceResponse{Stranded: []string{model}}, "stranded", false},
		{&prismv1.AnnounceResponse{}, "stranded", false},
		{&prismv1.AnnounceResponse{Diverged: map[string]int64{model: 0}}, "stranded", false}, // no update 0: not recorded
	} {
		if err := fx.srv.Announced(step.resp); err != nil && len(step.resp.GetDiverged()) == 0 {
			t.Fatal(err)
		}
		out, err := fx.srv.OutForGood()
		if err != nil || out[model] != step.want || len(out) > 1 {
			t.Fatalf("after %v: out %v, %v; want %s %q", step.resp, out, err, model, step.want)
		}
		if got := news(); got != step.news {
			t.Fatalf("after %v: news %v, want %v", step.resp, got, step.news)
		}
	}
}

// TestOutForGoodDiverged: a diverged mark is out for good, from the
// answer that marks it and, the store holding it, after a restart.
func TestOutForGoodDiverged(t *testing.T) {
	fx := ownFixture(t)
	model, tab := fx.plan.Model.Name, fx.plan.Tables[0]
	base := fx.srv.WorkerInfo("w", "addr").GetUpdateSeq()[model]
	if _, err := fx.srv.Update(context.Background(), &prismv1.ApplyUpdateRequest{Seq: base + 1, Fresh: true,
		Update: &prismv1.UpdateRequest{Model: model, Table: tab.Name, Ids: []int64{4}, Rows: leview.Bytes(make([]float32, tab.Dim))}}); err != nil {
		t.Fatal(err)
	}
	if err := fx.srv.Announced(&prismv1.AnnounceResponse{Diverged: map[string]int64{model: base + 1}, Stranded: []string{model}}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-fx.srv.OutNews():
	default:
		t.Fatal("no news of the model diverged")
	}
	want := fmt.Sprintf("diverged at update %d", base+1)
	if out, err := fx.srv.OutForGood(); err != nil || len(out) != 1 || out[model] != want {
		t.Fatalf("out %v, %v; want %s %q (the mark, not stranded)", out, err, model, want)
	}
}
