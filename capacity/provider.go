package capacity

import (
	"context"
	"time"
)

// Provider is the IO side of loaning: the lender. A local provider starts
// and stops `prism serve dense` processes on spare device slots of this
// host; a Kubernetes provider places dense-worker Pods on the training
// pool's nodes. The driver calls it to carry out the controller's
// decisions and feeds what it reports into the next Observation.
type Provider interface {
	// Name identifies the lender in logs and metrics.
	Name() string
	// Idle says how many workers the lender could lend now.
	Idle(ctx context.Context) (int, error)
	// Borrow starts n workers serving model and returns their ids at
	// once; each registers with the router when it serves, and is
	// reported Starting until then. Fewer ids than n (with an error) mean
	// the rest failed: the driver reports them as a BorrowFailure.
	Borrow(ctx context.Context, model string, n int) ([]string, error)
	// Drain tells a worker to leave the router's registry and finish
	// what it holds: a `prism serve dense` worker does both on SIGTERM
	// (it leaves at once, then exits when its in-flight work is done).
	Drain(ctx context.Context, worker string) error
	// Return stops a worker the controller drained (at once, if it still
	// runs: the drain's deadline has passed) and hands its device back to
	// the lender.
	Return(ctx context.Context, worker string) error
	// Workers are the workers lent now, as the lender sees them.
	Workers() []LentWorker
	// Reclaims delivers the lender taking workers back, each with the
	// grace it allows; the driver passes them on as Reclaims.
	Reclaims() <-chan ProviderReclaim
}

// ProviderReclaim is a reclaim as the lender announces it: the worker
// and the grace before it is taken regardless.
type ProviderReclaim struct {
	Worker string
	Grace  time.Duration
	// At is when the lender reclaimed it, from which Grace runs (zero:
	// when the driver hears of it, at its next tick).
	At time.Time
}

// LentWorker is one lent worker as the lender sees it.
type LentWorker struct {
	ID    string `json:"id"`
	Model string `json:"model"`
	// Addr is the worker's serving address once it has printed it (""
	// while it starts): the driver finds it in the router's registry by
	// it.
	Addr string `json:"addr"`
	// Running: its process (or Pod) has not exited.
	Running bool `json:"running"`
	// Draining: Drain was called.
	Draining bool `json:"draining"`
	// Lent is when the lender started it; Ready when it printed its
	// address (zero until then).
	Lent  time.Time `json:"lent"`
	Ready time.Time `json:"ready"`
}
