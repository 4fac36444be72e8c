package capacity

import "time"

// WorkerState is where a dense worker is, as the registry sees it.
type WorkerState int

const (
	// Starting: launched, not serving yet (loading the model, warming up,
	// registering).
	Starting WorkerState = iota
	// Serving: registered, the router sends to it.
	Serving
	// Draining: left the registry, finishing what it holds.
	Draining
)

func (s WorkerState) String() string {
	switch s {
	case Starting:
		return "starting"
	case Serving:
		return "serving"
	case Draining:
		return "draining"
	}
	return "unknown"
}

// Worker is one dense worker of a model.
type Worker struct {
	ID string
	// Borrowed: lent by the lender, to be returned; otherwise owned.
	Borrowed bool
	State    WorkerState
	// InFlight is the work it still holds (requests or samples); a
	// drained worker is returned once it is zero.
	InFlight int
}

// ModelObs is what the caller observed of one model since the last tick.
type ModelObs struct {
	Model string
	// Offered is the demand, samples/s (served plus shed).
	Offered float64
	// P99 is the router's p99 latency.
	P99 time.Duration
	// QueueDepth is the samples waiting at the router and the dense workers.
	QueueDepth int
	// Shed is the rate the router turned away, samples/s.
	Shed float64
	// CapacityPerWorker is the measured samples/s one dense worker serves
	// within the SLO. Zero keeps the last measurement.
	CapacityPerWorker float64
	// Workers are the model's dense workers, owned and borrowed.
	Workers []Worker
	// Forecast, when set and the policy is Predictive, says the demand
	// expected ahead.
	Forecast Forecaster
}

// Reclaim is the lender taking a borrowed worker back: it must be
// released by Deadline (the tick time plus the lender's grace).
type Reclaim struct {
	Worker   string
	Deadline time.Duration
}

// BorrowFailure reports that the provider could not deliver N workers of
// an earlier Borrow for Model.
type BorrowFailure struct {
	Model string
	N     int
}

// Observation is one tick's input.
type Observation struct {
	Models []ModelObs
	// LenderIdle is how many workers the lender could lend now.
	LenderIdle int
	// Reclaims are the lender's reclaims since the last tick.
	Reclaims []Reclaim
	// BorrowFailures are borrows the provider could not carry out.
	BorrowFailures []BorrowFailure
}
