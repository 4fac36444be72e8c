package serve

import (
	"sync"
	"time"
)

// PromptGap is the least time between the starts of two announcements
// of one announce loop when the second is out of turn (Prompt.Ask): a
// worker refusing lookups by the hundred asks its routers at most ten
// times a second.
const PromptGap = 100 * time.Millisecond

// Prompt has a worker announce out of turn, to hear its routers'
// answers at once instead of at the next heartbeat: an embedding worker
// asked to send cut tensors to a dense worker it has not been told of
// asks (the router picks only dense workers it has registered, so its
// answer to an announcement sent after the refusal names that one).
// AnnounceRouters (RouterOptions.Prompt) binds its loops to it. The zero
// Prompt is not usable: NewPrompt.
type Prompt struct {
	mu    sync.Mutex
	loops map[*nudge]struct{}
}

// NewPrompt makes a Prompt bound to no loop yet.
func NewPrompt() *Prompt { return &Prompt{loops: map[*nudge]struct{}{}} }

// Ask has every loop bound to p announce once more, starting after the
// call: at once when it is waiting for its next heartbeat (but not
// within PromptGap of its last announcement's start), or right after the
// announcement it has in flight (that one may have been answered before
// the reason to ask). Asks before that announcement starts are one: it
// never blocks, and a burst of asks costs one announcement per loop.
func (p *Prompt) Ask() {
	if p == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for n := range p.loops {
		n.ask()
	}
}

func (p *Prompt) bind(n *nudge) {
	if p == nil {
		return
	}
	p.mu.Lock()
	p.loops[n] = struct{}{}
	p.mu.Unlock()
}

func (p *Prompt) unbind(n *nudge) {
	if p == nil {
		return
	}
	p.mu.Lock()
	delete(p.loops, n)
	p.mu.Unlock()
}

// nudge is one announce loop's pending ask: wake holds a signal while
// one is pending; the loop takes it when an announcement starts.
type nudge struct{ wake chan struct{} }

func newNudge() *nudge { return &nudge{wake: make(chan struct{}, 1)} }

func (n *nudge) ask() {
	select {
	case n.wake <- struct{}{}:
	default: // one is pending already
	}
}

// started says an announcement starts: it answers every ask made before.
func (n *nudge) started() {
	if n == nil {
		return
	}
	select {
	case <-n.wake:
	default:
	}
}

// asked is the channel a pending ask signals on (nil, never ready, for
// a loop without a nudge).
func (n *nudge) asked() <-chan struct{} {
	if n == nil {
		return nil
	}
	return n.wake
}
