package prismv1

import (
	"fmt"
	"strings"

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

// staleEpochMark is in the message of every StaleEpochError: the router
// tells a fenced refusal from a worker behind on updates (both
// FAILED_PRECONDITION) by it.
const staleEpochMark = "from a router that lost the sequencing lease"

// StaleEpochError is the FAILED_PRECONDITION a worker answers an update
// of epoch with when it has heard of the later hold held (EpochStale):
// nothing was written and the update's number was not taken.
func StaleEpochError(model string, seq int64, epoch, held uint64) error {
	return status.Errorf(codes.FailedPrecondition, "update %d of model %q is %s: its epoch %s is below the epoch %s this worker has heard of; nothing applied, number not taken", seq, model, staleEpochMark, FormatEpoch(epoch), FormatEpoch(held))
}

// IsStaleEpoch says whether err is a worker's StaleEpochError.
func IsStaleEpoch(err error) bool {
	st, ok := status.FromError(err)
	return ok && st.Code() == codes.FailedPrecondition && strings.Contains(st.Message(), staleEpochMark)
}
