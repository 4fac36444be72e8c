package router

import "fmt"

// Quorum says how many of a model's embedding workers must hold an
// update before Embeddings.Update answers OK (Options.UpdateQuorum,
// --update-quorum). Below it the caller gets Unavailable naming how
// many of how many hold it; the update keeps its number all the same
// and reaches the other workers by catch-up, so a retry applies the
// same rows again (harmless: an upsert).
//
// A model sharded over its embedding workers (prism shard; each worker
// announces its shard) counts per shard: each shard numbers its own
// updates (sequencer_split.go), so an update is acknowledged once, for
// every shard holding its rows, the quorum of that shard's workers
// holds it; the other shards' workers are not sent it at all.
//
// The workers counted are the live embedding workers serving the model
// when the update is numbered, but those out of the model until an
// operator gives them a store: claiming updates this router never
// numbered, refusing one others applied, or behind what the update log
// still holds. One that leaves the model so while the update is in
// flight (refusing this very update as bad input while another applies
// it) no longer counts for it either (sequencer.outOfModel). A worker
// left behind as slow, or catching up, counts, and lacks the update
// until it is caught up.
type Quorum int

const (
	// QuorumMajority: more than half of them (the default). An
	// acknowledged update survives losing any minority of the workers'
	// stores, and one slow or dying worker among three does not fail
	// every update until it expires.
	QuorumMajority Quorum = iota
	// QuorumOne: one of them (the behaviour before --update-quorum).
	QuorumOne
	// QuorumAll: every one of them.
	QuorumAll
)

// need is how many of members workers must hold an update.
func (q Quorum) need(members int) int {
	switch q {
	case QuorumOne:
		return min(1, members)
	case QuorumAll:
		return members
	}
	return members/2 + 1
}

func (q Quorum) String() string {
	switch q {
	case QuorumOne:
		return "one"
	case QuorumAll:
		return "all"
	case QuorumMajority:
		return "majority"
	}
	return fmt.Sprintf("Quorum(%d)", int(q))
}

// ParseQuorum reads one, majority or all.
func ParseQuorum(s string) (Quorum, error) {
	for _, q := range []Quorum{QuorumOne, QuorumMajority, QuorumAll} {
		if s == q.String() {
			return q, nil
		}
	}
	return 0, fmt.Errorf("update quorum %q: want one, majority or all", s)
}

// Set and Type make a Quorum a command-line flag value.
func (q *Quorum) Set(s string) error {
	v, err := ParseQuorum(s)
	if err != nil {
		return err
	}
	*q = v
	return nil
}

// Type names the flag's value in the help.
func (q *Quorum) Type() string { return "quorum" }
