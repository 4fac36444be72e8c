package prismv1

import (
	"fmt"
	"strconv"
	"strings"

	"google.golang.org/genproto/googleapis/rpc/errdetails"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Election epochs (ApplyUpdateRequest.epoch, AnnounceResponse.epoch)
// number the holds of the Lease that elects the router sequencing
// embedding updates: a hash of the Lease's uid in the high 32 bits, its
// holder changes plus one in the low 32 (kubelease.Epoch). Two epochs
// are ordered only when they count the holds of one Lease.

// SameLease says whether epochs a and b count the holds of one Lease.
func SameLease(a, b uint64) bool { return a>>32 == b>>32 }

// EpochStale says whether an update of epoch comes from a hold that
// ended before the one of held began: both known (not 0), of the same
// Lease, epoch the lower. The worker keeping held refuses it.
func EpochStale(held, epoch uint64) bool {
	return held != 0 && epoch != 0 && SameLease(held, epoch) && epoch < held
}

// EpochRaises says whether a worker keeping held keeps epoch instead on
// hearing of it: a later hold of the same Lease, or any hold of another
// Lease (the Lease was made anew: its holds are the ones that count from
// now on). 0 raises nothing.
func EpochRaises(held, epoch uint64) bool {
	return epoch != 0 && epoch != held && (!SameLease(held, epoch) || epoch > held)
}

// FormatEpoch writes an epoch as "N (hold H of lease L)".
func FormatEpoch(e uint64) string {
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
	st := status.Newf(codes.FailedPrecondition, "update %d of model %q is %s: its epoch %s is below the epoch %s this worker has heard of; nothing applied, number not taken", seq, model, staleEpochMark, FormatEpoch(epoch), FormatEpoch(held))
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
