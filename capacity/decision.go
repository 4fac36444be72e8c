package capacity

import "fmt"

// Kind is what a decision asks the caller to do.
type Kind int

const (
	// Borrow N workers for Model from the lender.
	Borrow Kind = iota
	// Drain Worker: take it out of the router's registry so it gets no
	// new work; it finishes what it holds.
	Drain
	// Return Worker to the lender (stop it, hand the device back).
	Return
	// Shed advises the router to turn away Fraction of Model's offered
	// load early with ResourceExhausted, since the capacity counted does
	// not cover it and nothing more can be borrowed; Fraction 0 ends it.
	Shed
)

func (k Kind) String() string {
	switch k {
	case Borrow:
		return "borrow"
	case Drain:
		return "drain"
	case Return:
		return "return"
	case Shed:
		return "shed"
	}
	return "unknown"
}

// Reasons of decisions and events.
const (
	ReasonHighWater = "above high water"
	ReasonLatency   = "p99 over limit"
	ReasonQueue     = "queue over limit"
	ReasonShedding  = "shedding"
	ReasonForecast  = "forecast"
	ReasonReplace   = "replace reclaimed"
	ReasonLowDemand = "demand low"
	ReasonReclaim   = "reclaim"
	ReasonDrained   = "drained"
	ReasonTimeout   = "drain timeout"
	ReasonGraceEnd  = "grace end"
	ReasonLost      = "lost"
	ReasonNoStart   = "did not start"
	ReasonStopped   = "stopped serving"
	ReasonRetry     = "return retried"
	ReasonUncovered = "demand uncovered"
	ReasonCovered   = "demand covered"
)

// Decision is one thing the caller is to do.
type Decision struct {
	Kind   Kind
	Model  string
	N      int     // Borrow
	Worker string  // Drain, Return
	Frac   float64 // Shed
	Reason string
}

func (d Decision) String() string {
	switch d.Kind {
	case Borrow:
		return fmt.Sprintf("borrow %s %d: %s", d.Model, d.N, d.Reason)
	case Shed:
		return fmt.Sprintf("shed %s %.2f: %s", d.Model, d.Frac, d.Reason)
	}
	return fmt.Sprintf("%s %s %s: %s", d.Kind, d.Model, d.Worker, d.Reason)
}
