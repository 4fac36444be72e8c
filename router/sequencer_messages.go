package router

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"

	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
)

// msgType says what a message asks the caller to do.
type msgType int

const (
	// msgApply: send Apply to Worker at Addr and report the outcome with
	// applied. Client is the update's caller, 0 for a catch-up replay
	// (sent under the router's context, bounded by its default timeout).
	msgApply msgType = iota
	// msgAnswer: answer Client with Resp or Err.
	msgAnswer
	// msgBehind: set Model's embedding_workers_behind gauge to Behind.
	msgBehind
	// msgLog: log Text at Level with Attrs (rate-limited by Flood when
	// set).
	msgLog
	// msgPersist: write Persist, Model's change of its update log,
	// durably (updatelog.go). The driver writes the persists of a step
	// before it carries out any other message of that step, so no
	// worker is sent an update, and no client answered, before the log
	// holds it (see updateDriver.step).
	msgPersist
)

// message is one thing the sequencer asks its caller to do.
type message struct {
	Type   msgType
	Client uint64
	// Merged, on a msgApply of a merged update (group commit), are its
	// clients in order (Client the first); nil for one update.
	Merged []uint64
	Model  string
	Worker string
	Addr   string
	Apply  *prismv1.ApplyUpdateRequest
	Resp   *prismv1.UpdateResponse
	Err    error
	Behind int
	// Parts, on a msgAnswer, is how many parts the client's update was
	// split into (0 or 1: not split): their acknowledgements came in
	// earlier steps than this answer, so a write that failed since the
	// proposal may have held one (updateDriver.step).
	Parts int
	// Persist is the change a msgPersist writes.
	Persist *logChange
	Level   slog.Level
	Text    string
	Attrs   []any
	// Flood, on a msgLog, keys a record a persistent condition repeats
	// per update or per heartbeat (a worker the router cannot reach):
	// the caller writes the first of a window and sums up the rest
	// (lograte). Empty: written as it comes.
	Flood string
}

// errRouterStopping is the outcome the caller reports for a replay it
// did not send because the router is stopping: the replay just ends.
var errRouterStopping = errors.New("router stopping")

// errNotLogged is the outcome the caller reports for an apply it did not
// send because the update log does not hold the update (the write of its
// step failed, or an earlier one did): writeFailed and the driver's
// check of what is written report it.
var errNotLogged = errors.New("not sent: the router could not write it to its update log")

// errWorkerTimeout is the outcome the caller reports for an apply of a
// client's update that the worker did not answer within the per-worker
// timeout while the client still waited.
var errWorkerTimeout = errors.New("no answer within the per-worker update timeout")

func (s *sequencer) send(m message) { s.out = append(s.out, m) }

func (s *sequencer) logf(level slog.Level, text string, attrs ...any) {
	s.send(message{Type: msgLog, Level: level, Text: text, Attrs: attrs})
}

// floodf is logf for a record that repeats while its condition lasts,
// alike records keyed by key (Flood).
func (s *sequencer) floodf(key string, level slog.Level, text string, attrs ...any) {
	s.send(message{Type: msgLog, Level: level, Text: text, Attrs: attrs, Flood: key})
}

// String is the message in one line, for tests and debugging.
func (m message) String() string {
	switch m.Type {
	case msgApply:
		to := "replay"
		if m.Client != 0 {
			to = fmt.Sprintf("c%d", m.Client)
		}
		for _, c := range m.Merged[min(1, len(m.Merged)):] {
			to += fmt.Sprintf("+c%d", c)
		}
		if u := m.Apply.GetUpdate(); len(u.GetIds()) > 0 && len(u.GetIds()) <= 8 && m.Model != u.GetModel() {
			to += fmt.Sprintf(", ids %v", u.GetIds()) // a shard's part
		}
		if e := m.Apply.GetEpoch(); e != 0 {
			to += fmt.Sprintf(", epoch %d", e)
		}
		return fmt.Sprintf("apply %s#%d -> %s (%s)", m.Model, m.Apply.GetSeq(), m.Worker, to)
	case msgAnswer:
		if m.Err != nil {
			st := status.Convert(m.Err)
			return fmt.Sprintf("answer c%d: %s: %s", m.Client, st.Code(), st.Message())
		}
		on := ""
		if sh := m.Resp.GetShards(); len(sh) > 0 {
			on = fmt.Sprintf(", rows on shards %v", sh)
		}
		if r := m.Resp.GetRefused(); len(r) > 0 {
			return fmt.Sprintf("answer c%d: ok, %d workers%s, refused by %s", m.Client, m.Resp.GetWorkers(), on, strings.Join(r, "; "))
		}
		return fmt.Sprintf("answer c%d: ok, %d workers%s", m.Client, m.Resp.GetWorkers(), on)
	case msgBehind:
		if m.Behind < 0 {
			return fmt.Sprintf("behind %s gone", m.Model)
		}
		return fmt.Sprintf("behind %s = %d", m.Model, m.Behind)
	case msgPersist:
		c := m.Persist
		entry := ""
		if c.Entry != nil {
			entry = fmt.Sprintf(" +#%d", c.Entry.GetSeq())
		}
		if n := len(c.Entries); n > 0 {
			entry = fmt.Sprintf(" +#%d..%d", c.Entries[0].GetSeq(), c.Entries[n-1].GetSeq())
		}
		if c.Rewrite != 0 {
			entry += fmt.Sprintf(" (rewrite %d)", c.Rewrite)
		}
		drop := ""
		if c.Floor > c.DropFrom {
			drop = fmt.Sprintf(" -#%d..%d", c.DropFrom+1, c.Floor)
		}
		if len(c.Diverged) > 0 {
			drop += " diverged=" + strings.Join(slices.Sorted(maps.Keys(c.Diverged)), ",")
		}
		if len(c.Outcomes) > 0 {
			drop += " outcomes=" + outcomesString(c.Outcomes)
		}
		return fmt.Sprintf("persist %s next=%d committed=%d floor=%d%s%s", m.Model, c.Next, c.Committed, c.Floor, entry, drop)
	case msgLog:
		var b strings.Builder
		fmt.Fprintf(&b, "log %s %q", m.Level, m.Text)
		for i := 0; i+1 < len(m.Attrs); i += 2 {
			fmt.Fprintf(&b, " %v=%v", m.Attrs[i], m.Attrs[i+1])
		}
		return b.String()
	}
	return fmt.Sprintf("message type %d", m.Type)
}

// outcomesString is outcomes as the scripts print them: seq and + for
// applied, - for refused, in order ("1+,2-").
func outcomesString(outcomes map[int64]int8) string {
	var o []string
	for _, seq := range slices.Sorted(maps.Keys(outcomes)) {
		sign := "+"
		if outcomes[seq] < 0 {
			sign = "-"
		}
		o = append(o, fmt.Sprintf("%d%s", seq, sign))
	}
	return strings.Join(o, ",")
}
