package prismv1

import (
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestIsStaleEpoch: a fenced refusal is told from a worker behind on
// updates (both FAILED_PRECONDITION) by its ErrorInfo, not its words;
// the message's mark still counts for workers of releases before the
// detail.
func TestIsStaleEpoch(t *testing.T) {
	info := func(domain, reason string) error {
		st, err := status.New(codes.FailedPrecondition, "refused").WithDetails(&errdetails.ErrorInfo{Domain: domain, Reason: reason})
		if err != nil {
			t.Fatal(err)
		}
		return st.Err()
	}
	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"StaleEpochError", StaleEpochError("m", 7, 1<<32|1, 1<<32|2), true},
		{"the detail, other words", info(ErrorDomain, StaleEpochReason), true},
		{"an earlier release's message", status.Errorf(codes.FailedPrecondition, "update 7 of model %q is %s: ...", "m", staleEpochMark), true},
		{"a worker behind on updates", status.Error(codes.FailedPrecondition, "update 9 of model \"m\" is ahead of this worker's 7"), false},
		{"another domain's reason", info("example.com", StaleEpochReason), false},
		{"another code with the mark", status.Error(codes.Unavailable, staleEpochMark), false},
		{"not a status", nil, false},
	} {
		if got := IsStaleEpoch(c.err); got != c.want {
			t.Errorf("%s: IsStaleEpoch = %v, want %v", c.name, got, c.want)
		}
	}
	st := status.Convert(StaleEpochError("m", 7, 1<<32|1, 1<<32|2))
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			if md := info.GetMetadata(); md["model"] != "m" || md["seq"] != "7" || md["epoch"] != "4294967297" || md["held"] != "4294967298" {
				t.Errorf("metadata %v", md)
			}
			return
		}
	}
	t.Errorf("no ErrorInfo in %v", st.Proto())
}
