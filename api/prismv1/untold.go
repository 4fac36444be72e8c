package prismv1

import (
	"strings"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// UntoldDenseReason is the ErrorInfo reason of every UntoldDenseError:
// the router tells an embedding worker's refusal of a dense worker it
// has not been told of (which passes at the worker's next heartbeat)
// from other PERMISSION_DENIED answers (a certificate of the wrong
// role: a configuration to fix, not to retry) by it. The message also
// says it (untoldDenseMark), for workers of releases before the detail.
const (
	UntoldDenseReason = "UNTOLD_DENSE"
	untoldDenseMark   = "is not a dense worker registered with the router"
)

// UntoldDenseError is the PERMISSION_DENIED an embedding worker answers
// a Lookup naming dense_addr addr, which is not among the n dense
// workers its routers told it of.
func UntoldDenseError(addr string, n int) error {
	st := status.Newf(codes.PermissionDenied, "dense_addr %.128q %s (%d are)", addr, untoldDenseMark, n)
	withInfo, err := st.WithDetails(&errdetails.ErrorInfo{Reason: UntoldDenseReason, Domain: ErrorDomain, Metadata: map[string]string{"dense_addr": addr}})
	if err != nil { // cannot happen: ErrorInfo marshals
		return st.Err()
	}
	return withInfo.Err()
}

// IsUntoldDense says whether err is an UntoldDenseError: a
// PERMISSION_DENIED with the UntoldDenseReason detail, or, from a worker
// of a release before the detail, the message's mark.
func IsUntoldDense(err error) bool {
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.PermissionDenied {
		return false
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == ErrorDomain && info.GetReason() == UntoldDenseReason {
			return true
		}
	}
	return strings.Contains(st.Message(), untoldDenseMark)
}
