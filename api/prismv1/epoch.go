package prismv1

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Election epochs (ApplyUpdateRequest.epoch, AnnounceResponse.epoch)
// number the holds of the Lease that elects the router sequencing
// embedding updates (kubelease.Epoch). An epoch is ordered: the Lease's
// creation time (Unix seconds, as the API server stamps it) in the high
// 32 bits, OrderedEpoch's mark in bit 31, and the Lease's holder changes
// plus one in the low 31 bits. Ordered epochs compare as integers, also
// across a Lease deleted and made again: the new Lease is made after
// the old one was deleted, so its holds follow every hold of the old
// one. Two Leases made within one second of each other are ordered by
// the count, which the maker of the second starts above the first's
// (kubelease's Elector.floor); Leases made by API servers whose clocks
// disagree by more than the time between the deletion and the new
// Lease are not ordered right (docs/architecture.md).
//
// An epoch without the mark is a legacy epoch, as routers of releases
// before it write: a hash of the Lease's uid in the high 32 bits, so
// legacy epochs are ordered only within one Lease. A worker that has
// heard of an ordered epoch refuses legacy ones (a router of an earlier
// release cannot be placed among the ordered holds); one holding a
// legacy epoch takes any ordered one as later.

// OrderedEpoch marks an ordered epoch (bit 31; a legacy epoch's low 32
// bits are leaseTransitions+1 of an int32, below it).
const OrderedEpoch = 1 << 31

// Ordered says whether epoch e is ordered (OrderedEpoch set).
func Ordered(e uint64) bool { return e&OrderedEpoch != 0 }

// SameLease says whether epochs a and b count the holds of one Lease:
// of one kind, and of one Lease (its uid's hash, or its creation time).
func SameLease(a, b uint64) bool { return a>>32 == b>>32 && Ordered(a) == Ordered(b) }

// EpochStale says whether an update of epoch comes from a hold that
// ended before the one of held began: both known (not 0), and epoch the
// lower of two ordered epochs, the lower of two legacy epochs of the
// same Lease, or a legacy epoch after an ordered one was heard. The
// worker keeping held refuses it.
func EpochStale(held, epoch uint64) bool {
	if held == 0 || epoch == 0 {
		return false
	}
	switch {
	case Ordered(held) && Ordered(epoch):
		return epoch < held
	case Ordered(held):
		return true
	case Ordered(epoch):
		return false
	}
	return SameLease(held, epoch) && epoch < held
}

// EpochRaises says whether a worker keeping held keeps epoch instead on
// hearing of it: a later ordered epoch, an ordered epoch after a legacy
// one, a later legacy epoch of the same Lease, or any legacy epoch of
// another Lease while held is legacy (legacy holds of different Leases
// are not ordered: the one heard last counts). 0 raises nothing.
func EpochRaises(held, epoch uint64) bool {
	if epoch == 0 || epoch == held {
		return false
	}
	switch {
	case Ordered(held) && Ordered(epoch):
		return epoch > held
	case Ordered(held):
		return false
	case Ordered(epoch):
		return true
	}
	return !SameLease(held, epoch) || epoch > held
}

// FormatEpoch writes an epoch as "N (hold H of the lease made at T)",
// or for a legacy epoch "N (hold H of lease L)".
func FormatEpoch(e uint64) string {
	if Ordered(e) {
		return fmt.Sprintf("%d (hold %d of the lease made at %s)", e, uint32(e)&^OrderedEpoch, time.Unix(int64(e>>32), 0).UTC().Format(time.RFC3339))
	}
	return fmt.Sprintf("%d (hold %d of lease %08x)", e, uint32(e), uint32(e>>32))
}

// StaleEpochReason is the ErrorInfo reason of every StaleEpochError:
// the router tells a fenced refusal from a worker behind on updates
// (both FAILED_PRECONDITION) by it, not by the message's words. The
// message also says it (staleEpochMark), for people and for workers of
// releases before the detail.
const (
	StaleEpochReason = "STALE_EPOCH"
	ErrorDomain      = "prism.serve"
	staleEpochMark   = "from a router that lost the sequencing lease"
)

// StaleEpochError is the FAILED_PRECONDITION a worker answers an update
// of epoch with when it has heard of the later hold held (EpochStale):
// nothing was written and the update's number was not taken.
func StaleEpochError(model string, seq int64, epoch, held uint64) error {
	msg := "update %d of model %q is %s: its epoch %s is below the epoch %s this worker has heard of; nothing applied, number not taken"
	if Ordered(held) && !Ordered(epoch) {
		// Refused whatever its number (a uid's hash above the count, often
		// the higher one): "below" would send its reader looking for a
		// count or a clock gone wrong.
		msg = "update %d of model %q is %s: its epoch %s, a router of an earlier release's, is not ordered after the epoch %s this worker has heard of (upgrade that router); nothing applied, number not taken"
	}
	st := status.Newf(codes.FailedPrecondition, msg, seq, model, staleEpochMark, FormatEpoch(epoch), FormatEpoch(held))
	withInfo, err := st.WithDetails(&errdetails.ErrorInfo{Reason: StaleEpochReason, Domain: ErrorDomain, Metadata: map[string]string{
		"model": model, "seq": strconv.FormatInt(seq, 10), "epoch": strconv.FormatUint(epoch, 10), "held": strconv.FormatUint(held, 10),
	}})
	if err != nil { // cannot happen: ErrorInfo marshals
		return st.Err()
	}
	return withInfo.Err()
}

// IsStaleEpoch says whether err is a worker's StaleEpochError: a
// FAILED_PRECONDITION with the StaleEpochReason detail, or, from a
// worker of a release before the detail, the message's mark.
func IsStaleEpoch(err error) bool {
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.FailedPrecondition {
		return false
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == ErrorDomain && info.GetReason() == StaleEpochReason {
			return true
		}
	}
	return strings.Contains(st.Message(), staleEpochMark)
}
