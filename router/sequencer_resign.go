package router

import (
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
// hold before it numbers anything, if they land within it. One landing
// later is not acknowledged here (the other router may number another
// update over it), and the other router finds the worker holding it
// foreign (announced), or diverged once its own update of that number
// reaches the worker (which answers AlreadyExists to an update sent
// fresh).
func (s *sequencer) resign(now time.Time) {
	s.advance(now)
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
