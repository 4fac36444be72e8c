package router

import (
	"log/slog"
	"maps"
	"slices"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// errResigned answers the updates a sequencer no longer numbers because
// another router sequences them now (elect.go).
var errResigned = status.Error(codes.Unavailable, "this router stopped sequencing embedding updates (another router holds the sequencing lease now); not applied; retry")

// resign is the event "this router no longer sequences updates" (it
// lost the lease): from now on the sequencer hands out no number and
// starts no replay. The updates waiting their turn are answered
// Unavailable at once; the one being applied finishes (or fails) and
// is answered as usual, but OK only if its quorum held it before now,
// and a replay under way ends with its current update. Those in flight
// may still reach the workers after another router started numbering:
// that router's startup window of three heartbeats hears what they
// hold before it numbers anything, if they land within it. Once a
// worker has heard of the other router's epoch (its first heartbeat's
// answer, or an update of the other router) it refuses them (fenced),
// writing nothing, and this router resigns on hearing it (fenced, even
// before its election says so). One landing later on a worker that has
// not heard (workers of earlier releases, or no epoch known) is not
// acknowledged here (the other router may number another update over
// it), and the other router finds the worker holding it foreign
// (announced), or diverged once its own update of that number reaches
// the worker (which answers AlreadyExists to an update sent fresh).
func (s *sequencer) resign(now time.Time) {
	s.advance(now)
	s.stop()
}

// fenced is "worker refused an apply of sequence model as one of an
// earlier hold of the Lease than it has heard of" (err says which): a
// later holder sequences now, whether or not this router's election has
// said so yet. The sequencer resigns at once (no new number, no replay),
// and says so once.
func (s *sequencer) fenced(now time.Time, model, worker string, err error) {
	s.advance(now)
	if s.resigned {
		return
	}
	s.logf(slog.LevelError, "an embedding worker refused this router's update as one of an earlier hold of the sequencing lease than it has heard of: another router holds the lease and sequences updates now; this router stops sequencing (no update numbered or replayed; its clients get Unavailable and retry)",
		"model", model, "worker", worker, "epoch", s.epoch, "refusal", status.Convert(err).Message())
	s.stop()
}

// stop ends the sequencing: the updates waiting their turn are answered
// errResigned, and nothing more is numbered or replayed.
func (s *sequencer) stop() {
	if s.resigned {
		return
	}
	s.resigned = true
	for _, model := range slices.Sorted(maps.Keys(s.models)) {
		m := s.models[model]
		for _, p := range m.queue {
			s.answer(p.client, model, nil, errResigned)
		}
		m.queue = nil
	}
}
