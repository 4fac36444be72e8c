package router

import (
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/prism-serve/prism/api/prismv1"
)

// logChange is one change of a model's update log: the state after it,
// the entries that leave it (DropFrom+1 .. Floor) and the one that joins
// it (Entry, nil when only the numbers change). A rewrite after a failed
// write (Rewrite, the failure's generation, not 0) writes Entries, every
// entry the failed writes held that the log still keeps, instead.
type logChange struct {
	Next, Committed, Floor int64
	DropFrom               int64
	Entry                  *prismv1.ApplyUpdateRequest
	Entries                []*prismv1.ApplyUpdateRequest
	Rewrite                uint64
	// Diverged are the workers the model's sequence found diverged
	// (modelSeq.diverged: worker id -> seq), written with the numbers:
	// a worker learns its mark only from the answer to its next
	// announcement (AnnounceResponse.diverged), and a router restarted
	// before that, with no record of it, took the worker's update number
	// for an up-to-date copy and served it again.
	Diverged map[string]int64
	// Outcomes are the outcomes of logged updates decided since the last
	// persist (modelSeq.outcomeNew; a rewrite: every one the sequence
	// knows), seq -> +1 applied, -1 refused as bad input. A router
	// restarted without them judged a replay's answer by the first
	// worker to answer it: one refusing what the update's first holders
	// applied set the outcome, was not marked, and served a copy lacking
	// the rows, while the workers applying it after were marked.
	Outcomes map[int64]int8
}

// persist asks the caller to write m's log state durably, entry (nil:
// none) joining it and dropFrom+1 .. m.floor leaving it.
func (s *sequencer) persist(model string, m *modelSeq, entry *prismv1.ApplyUpdateRequest, dropFrom int64) {
	s.send(message{Type: msgPersist, Model: model, Persist: &logChange{Next: m.next, Committed: m.committed, Floor: m.floor, DropFrom: dropFrom, Entry: entry, Diverged: divergedCopy(m), Outcomes: m.outcomeNew}})
	m.outcomeNew = nil
}

// divergedCopy is m.diverged as a persist carries it (nil: none).
func divergedCopy(m *modelSeq) map[string]int64 {
	if len(m.diverged) == 0 {
		return nil
	}
	return maps.Clone(m.diverged)
}

// restoreDiverged is the event "the update log read back at start holds
// these diverged marks of sequence model" (logChange.Diverged); it comes
// after restore, before any other. A worker so marked stays out of
// serving and takes no updates, as before the restart, and the answer
// to its announcement tells it (divergedOf), so its store records it.
func (s *sequencer) restoreDiverged(model string, marks map[string]int64) {
	s.restoreMarks(model, marks, "the update log records that an embedding worker's copy of the model diverged from its peers'; it stays out of serving the model and takes no updates: give it a copy of a serving worker's store (prism store copy --from A_SERVING_WORKER --db ITS_STORE) and restart it")
}

// restoreOutcomes is the event "the update log read back at start holds
// these outcomes of sequence model's logged updates" (logChange.Outcomes);
// it comes after restore, before any other. A replay is judged by them
// as before the restart.
func (s *sequencer) restoreOutcomes(model string, outcomes map[int64]int8) {
	if len(outcomes) == 0 {
		return
	}
	m := s.model(model)
	for seq, v := range outcomes {
		if seq > m.floor && seq <= m.next {
			m.outcome[seq] = v
		}
	}
	m.runsDirty = true
}

// restoreMarks takes marks (worker id -> seq) of sequence model in, read
// back from a log (restoreDiverged, restoreCopy), each logged with msg.
func (s *sequencer) restoreMarks(model string, marks map[string]int64, msg string) {
	if len(marks) == 0 {
		return
	}
	m := s.model(model)
	for _, id := range slices.Sorted(maps.Keys(marks)) {
		m.diverged[id] = marks[id]
		s.logf(slog.LevelError, msg, "model", model, "worker", id, "seq", marks[id])
	}
	s.any = true
}

// writeFailed is the event "the write of msgs, the messages of one step,
// failed": the driver sent none of their applies (each is reported not
// sent, errNotLogged, as the step's other replays are), and the models
// they persisted are unwritten: the log on disk may lack their latest
// updates. Two ways out were possible: take the numbers back, or refuse
// the model until its log is written again. Taking back is not enough
// (the same write may have dropped trimmed entries or changed committed
// or the adopted sequence, which memory cannot undo); refusing is simple
// and always right: the model numbers no update and replays none
// (Unavailable) until a rewrite of what the failed writes held, sent at
// each heartbeat, has been written (rewritten). The numbered update
// keeps its number, like one no worker acknowledged, and reaches the
// workers by catch-up once it is on disk.
func (s *sequencer) writeFailed(now time.Time, msgs []message) {
	s.advance(now)
	for _, msg := range msgs {
		m := s.models[msg.Model]
		if msg.Type != msgPersist || m == nil {
			continue
		}
		c := msg.Persist
		if !m.unwritten {
			s.logf(slog.LevelError, "cannot write the update log of a model: it takes no updates and replays none until the router has written it again (retried each heartbeat)",
				"model", msg.Model, "latest", m.next)
			m.unwritten, m.unwrittenFrom, m.unwrittenDrop = true, 0, c.DropFrom
		}
		m.wgen++
		m.unwrittenDrop = min(m.unwrittenDrop, c.DropFrom)
		entries := slices.Clip(c.Entries) // a rewrite's; an append copies
		if c.Entry != nil {
			entries = append(entries, c.Entry)
		}
		for _, e := range entries {
			if m.unwrittenFrom == 0 || e.GetSeq() < m.unwrittenFrom {
				m.unwrittenFrom = e.GetSeq()
			}
		}
	}
	for _, msg := range msgs {
		if msg.Type == msgApply {
			s.applied(s.now, msg.Client, msg.Model, msg.Worker, msg.Apply.GetSeq(), errNotLogged)
		}
	}
}

// rewrite asks the caller to write what the failed writes of m held:
// the numbers, the entries from the lowest they held, the drops.
func (s *sequencer) rewrite(model string, m *modelSeq) {
	var entries []*prismv1.ApplyUpdateRequest
	if from := max(m.unwrittenFrom, m.floor+1); m.unwrittenFrom != 0 && from <= m.next {
		entries = slices.Clone(m.log[from-m.floor-1:])
	}
	s.send(message{Type: msgPersist, Model: model, Persist: &logChange{Next: m.next, Committed: m.committed, Floor: m.floor,
		DropFrom: min(m.unwrittenDrop, m.floor), Entries: entries, Rewrite: m.wgen, Diverged: divergedCopy(m), Outcomes: maps.Clone(m.outcome)}})
	m.outcomeNew = nil
}

// rewritten is the event "the rewrite of model for failure generation
// gen was written": unless a write failed since, the log on disk holds
// what memory does again, and the model takes updates and replays.
func (s *sequencer) rewritten(now time.Time, model string, gen uint64) {
	s.advance(now)
	m := s.models[model]
	if m == nil || !m.unwritten || gen != m.wgen {
		return
	}
	m.unwritten, m.unwrittenFrom, m.unwrittenDrop = false, 0, 0
	s.logf(slog.LevelInfo, "update log of the model written again; it takes updates again", "model", model, "latest", m.next)
}
