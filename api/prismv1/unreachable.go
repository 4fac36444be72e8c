package prismv1

import (
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// DenseUnreachableReason is the ErrorInfo reason of every
// DenseUnreachableError: an embedding worker could not reach the dense
// worker a Lookup named (its call failed at the transport: refused,
// reset, lost), as opposed to the dense worker's own answer, which
// the embedding worker passes through as it is. The router counts the
// dense worker, not the embedding worker, as unreachable by it.
const DenseUnreachableReason = "DENSE_UNREACHABLE"

// DenseUnreachableError is the UNAVAILABLE an embedding worker answers
// a Lookup whose dense worker, at addr, it could not reach: err's
// message, with the reason and the address as details.
func DenseUnreachableError(addr string, err error) error {
	st := status.New(codes.Unavailable, status.Convert(err).Message())
	withInfo, werr := st.WithDetails(&errdetails.ErrorInfo{Reason: DenseUnreachableReason, Domain: ErrorDomain, Metadata: map[string]string{"dense_addr": addr}})
	if werr != nil { // cannot happen: ErrorInfo marshals
		return st.Err()
	}
	return withInfo.Err()
}

// DenseUnreachable is the address of the dense worker a
// DenseUnreachableError names (ok false: err is none).
func DenseUnreachable(err error) (addr string, ok bool) {
	st, isStatus := status.FromError(err)
	if !isStatus || st.Code() != codes.Unavailable {
		return "", false
	}
	for _, d := range st.Details() {
		if info, isInfo := d.(*errdetails.ErrorInfo); isInfo && info.GetDomain() == ErrorDomain && info.GetReason() == DenseUnreachableReason {
			return info.GetMetadata()["dense_addr"], true
		}
	}
	return "", false
}
