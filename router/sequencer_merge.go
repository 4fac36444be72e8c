package router

import (
	"context"
	"log/slog"

	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/prism-serve/prism/api/prismv1"
)

// Group commit: the updates of one sequence waiting behind the one in
// flight are numbered together when their turn comes. startNext takes
// the head of the queue and, behind it, the run of waiting updates of
// the same table and row width (gather), and sends them as ONE update:
// their ids and rows concatenated in the order the router accepted
// them, so a later client's row of an id is written after an earlier
// one's in the same synced batch and wins, exactly as if they had been
// applied one after another (a worker writes an update's rows in order:
// cpuserve/store upsertOnce). It takes one number, one entry of the
// update log (and of its copies on other routers, replica.go) and one
// synced write on each worker; an embedding worker of any release
// applies it, as it is an ordinary UpdateRequest. Each client is
// answered when it is, with what its own update would have got (the
// workers, the refusals, the shards, held: every part of it holds the
// same number).
//
// Every waiting update of the head's table merges with it, in the order
// the router took them, wherever it waits in the queue; the updates of
// other tables keep their order among themselves and go after. Rows of
// two tables never meet, and none of the waiting updates was
// acknowledged before another was taken, so either order is one the
// clients could have seen: a trainer writing every table it touched
// each step (updates of tables in turn) merges per table, where a run
// from the head of the queue alone would merge nothing. An update of
// the head's table that must not be merged (another row width, a part
// sent again alone) ends the gathering: none passes another of its
// table.
//
// A merged update that its workers all refuse as bad input (one
// client's id outside the table, a row width the table has not, as the
// router cannot know for a model it does not know the tables of) took
// its number, and nothing of it was written: its parts go back to the
// head of the queue, each to be sent on its own (alone), so each client
// gets the answer its own update gets. A divergent answer (some
// workers applied it, some refused it) is what it is for one update:
// every client of it is answered OK with the refusals named, the
// refusers out of serving, and out of the workers its quorum counts
// (outOfModel): counted, they failed every client of the merge with
// Unavailable under all (or a majority of two), though each client's
// rows were on every worker still in the model, and its update alone
// (or its retry, numbered without them) was acknowledged.
//
// A client whose context ends while its update waits is dropped from
// the queue (cancel), as before: it is never merged, so never applied.
// One ending while the merged update is in flight is answered as for
// an update of its own in flight, and a part of it is not sent again
// after a refusal (ended).

// maxMergeUpdates bounds how many updates one merged update carries.
const maxMergeUpdates = 1024

// defaultMergeBytes bounds the size of a merged update (the sum of its
// parts' sizes): a few MiB are hundreds of one-row updates, a synced
// write on each worker that takes about as long as one row's, while a
// worker's answer to it still comes well within its update timeout. The
// router makes it no larger than an update it takes (Updater.maxBytes),
// so a merged update fits every message limit an update does (a worker's,
// a page of the update log served to other routers).
const defaultMergeBytes = 4 << 20

// mergeBytesFor is the sequencer's mergeBytes for a router whose
// message limit is maxMessage (Options.MaxMessageBytes): a merged update
// is no larger than the largest update the router takes (Updater.maxBytes,
// less what wrapping it for a worker adds), nor than defaultMergeBytes.
func mergeBytesFor(maxMessage int) int64 {
	return max(0, min(defaultMergeBytes, int64(min(maxUpdateBytes, maxMessage-logPageMargin))-applyWrapBytes))
}

// applyWrapBytes is at least what an ApplyUpdateRequest adds to the
// UpdateRequest it carries, its sequence name aside (the Updater's check
// counts the same).
const applyWrapBytes = 64

// gather takes from m's queue the waiting updates that merge with p,
// the update whose turn it is (just taken off the queue): those of p's
// table and row width, in queue order, passing over the updates of
// other tables (which keep their places), until one of p's table that
// must not merge (another width, one to be sent alone), maxMergeUpdates
// or the byte bounds: s.mergeBytes of the parts' wire size (a message
// limit), and m's log budget of the heap the merged entry would hold
// (mergedHeldBytes, as the log counts it), so one entry never fills
// the log. A waiting update of p's table whose deadline
// passed on the way is answered DeadlineExceeded and dropped (it is not
// applied, merged or not), as is one whose caller is gone (ended),
// answered its context's end. It returns the updates, p first.
func (s *sequencer) gather(model string, m *modelSeq, p *proposal) []*proposal {
	batch := []*proposal{p}
	if p.alone || s.mergeBytes <= 0 || len(m.queue) == 0 {
		return batch
	}
	budget := s.budget(m)
	size := int64(proto.Size(p.req))
	ids, rows := len(p.req.GetIds()), len(p.req.GetRows())
	width := rowWidth(p.req)
	rest := m.queue[:0:0] // a new slice: m.queue is read as it is rebuilt
	i := 0
	for ; i < len(m.queue) && len(batch) < maxMergeUpdates; i++ {
		q := m.queue[i]
		if q.req.GetTable() != p.req.GetTable() || q.req.GetModel() != p.req.GetModel() {
			rest = append(rest, q)
			continue
		}
		if q.alone || rowWidth(q.req) != width {
			break
		}
		if !s.now.Before(q.deadline) {
			s.answer(q.client, model, nil, status.FromContextError(context.DeadlineExceeded).Err())
			continue
		}
		if err := s.endedErr(q.client); err != nil {
			s.answer(q.client, model, nil, err) // its caller is gone
			continue
		}
		n := int64(proto.Size(q.req))
		qids, qrows := len(q.req.GetIds()), len(q.req.GetRows())
		if size+n > s.mergeBytes || mergedHeldBytes(p.req, ids+qids, rows+qrows) > budget {
			break
		}
		size, ids, rows = size+n, ids+qids, rows+qrows
		batch = append(batch, q)
	}
	m.queue = append(rest, m.queue[i:]...)
	return batch
}

// rowWidth is the bytes of one row of req (whole float32 rows, checked
// at the RPC boundary; 0 for none).
func rowWidth(req *prismv1.UpdateRequest) int {
	if len(req.GetIds()) == 0 {
		return 0
	}
	return len(req.GetRows()) / len(req.GetIds())
}

// merged is the one update that applies batch's updates in order: the
// ids and rows concatenated (batch[0]'s own request when it is alone).
// The requests are not changed (a split update's parts may share one).
func merged(batch []*proposal) *prismv1.UpdateRequest {
	if len(batch) == 1 {
		return batch[0].req
	}
	var ids, rows int
	for _, p := range batch {
		ids += len(p.req.GetIds())
		rows += len(p.req.GetRows())
	}
	out := &prismv1.UpdateRequest{Model: batch[0].req.GetModel(), Table: batch[0].req.GetTable(), Ids: make([]int64, 0, ids), Rows: make([]byte, 0, rows)}
	for _, p := range batch {
		out.Ids = append(out.Ids, p.req.GetIds()...)
		out.Rows = append(out.Rows, p.req.GetRows()...)
	}
	return out
}

// clientsOf are the clients of a merged update, in order (nil for one
// update alone): applies name them (message.Merged).
func clientsOf(batch []*proposal) []uint64 {
	if len(batch) < 2 {
		return nil
	}
	out := make([]uint64, len(batch))
	for i, p := range batch {
		out[i] = p.client
	}
	return out
}

// unmerge is the end of a merged update f that every worker answering
// refused as bad input: it took its number and wrote nothing, so each
// part goes back to the head of the queue, in order, to be sent on its
// own and answered as its own update is; a part whose client's context
// ended meanwhile is answered that, and not sent again.
func (s *sequencer) unmerge(model string, m *modelSeq, f *fanout) {
	again := make([]*proposal, 0, len(f.parts)+len(m.queue))
	for _, p := range f.parts {
		if p.ended != nil {
			s.answer(p.client, model, nil, p.ended)
			continue
		}
		again = append(again, &proposal{client: p.client, req: p.req, deadline: p.deadline, alone: true})
	}
	s.floodf(model+" unmerge", slog.LevelInfo, "embedding workers refused a merged update as bad input; its updates are sent again one by one, so each client gets its own answer",
		"model", model, "seq", f.seq, "updates", len(f.parts), "refusal", status.Convert(f.inputErr).Message())
	m.queue = append(again, m.queue...)
}
