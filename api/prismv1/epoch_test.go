package prismv1

import (
	"strings"
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

// TestEpochOrder: ordered epochs compare as integers, across Leases too
// (a Lease made anew follows the old one); legacy epochs (a uid's hash
// above the count) only within one Lease; a legacy epoch after an
// ordered one was heard is refused, an ordered one after a legacy one
// taken.
func TestEpochOrder(t *testing.T) {
	ord := func(made uint32, hold uint32) uint64 { return uint64(made)<<32 | OrderedEpoch | uint64(hold) }
	leg := func(hash uint32, hold uint32) uint64 { return uint64(hash)<<32 | uint64(hold) }
	for _, c := range []struct {
		name          string
		held, epoch   uint64
		stale, raises bool
	}{
		{"nothing held", 0, ord(100, 1), false, true},
		{"epoch unknown", ord(100, 2), 0, false, false},
		{"same hold", ord(100, 2), ord(100, 2), false, false},
		{"earlier hold, same Lease", ord(100, 3), ord(100, 2), true, false},
		{"later hold, same Lease", ord(100, 2), ord(100, 3), false, true},
		{"old Lease's hold after the new Lease's", ord(200, 1), ord(100, 9), true, false},
		{"new Lease's first hold after the old Lease's ninth", ord(100, 9), ord(200, 1), false, true},
		{"legacy: earlier hold, same Lease", leg(0xfeed, 3), leg(0xfeed, 2), true, false},
		{"legacy: later hold, same Lease", leg(0xfeed, 2), leg(0xfeed, 3), false, true},
		{"legacy: another Lease's hold is taken", leg(0xfeed, 9), leg(0x0001, 1), false, true},
		{"legacy after ordered: refused", ord(100, 1), leg(0xffffffff, 9), true, false},
		{"ordered after legacy: taken", leg(0xffffffff, 9), ord(100, 1), false, true},
	} {
		if got := EpochStale(c.held, c.epoch); got != c.stale {
			t.Errorf("%s: EpochStale(%s, %s) = %v, want %v", c.name, FormatEpoch(c.held), FormatEpoch(c.epoch), got, c.stale)
		}
		if got := EpochRaises(c.held, c.epoch); got != c.raises {
			t.Errorf("%s: EpochRaises(%s, %s) = %v, want %v", c.name, FormatEpoch(c.held), FormatEpoch(c.epoch), got, c.raises)
		}
	}
	if got, want := FormatEpoch(ord(1796126400, 3)), "7714304149629698051 (hold 3 of the lease made at 2026-12-01T12:00:00Z)"; got != want {
		t.Errorf("FormatEpoch = %q, want %q", got, want)
	}
}

// TestStaleEpochMessage: the refusal's words say why. An epoch below the
// one heard of is "below" it; a legacy epoch refused after an ordered
// one is refused whatever its number, and was read as "below" an epoch
// it is numerically above (a uid's hash over the count), during a
// rolling upgrade, where the reader must find the old router instead.
func TestStaleEpochMessage(t *testing.T) {
	ord := func(made uint32, hold uint32) uint64 { return uint64(made)<<32 | OrderedEpoch | uint64(hold) }
	leg := func(hash uint32, hold uint32) uint64 { return uint64(hash)<<32 | uint64(hold) }
	for _, c := range []struct {
		name        string
		epoch, held uint64
		says        string
	}{
		{"ordered below ordered", ord(1796126400, 3), ord(1796126460, 1), "is below the epoch"},
		{"legacy below legacy", leg(0xfe11ce00, 4), leg(0xfe11ce00, 5), "is below the epoch"},
		{"legacy after ordered", leg(0xfe11ce00, 4), ord(1796126460, 1), "a router of an earlier release's, is not ordered after the epoch"},
	} {
		if !EpochStale(c.held, c.epoch) {
			t.Fatalf("%s: %s is not stale after %s", c.name, FormatEpoch(c.epoch), FormatEpoch(c.held))
		}
		msg := status.Convert(StaleEpochError("m", 7, c.epoch, c.held)).Message()
		if !strings.Contains(msg, c.says) || !strings.Contains(msg, FormatEpoch(c.epoch)) || !strings.Contains(msg, FormatEpoch(c.held)) || !strings.Contains(msg, staleEpochMark) {
			t.Errorf("%s: %q; want it to say %q, naming both epochs", c.name, msg, c.says)
		}
	}
}

// TestIsUntoldDense: the detail, or the message of a worker of an
// earlier release, tells the untold dense worker's refusal from other
// PermissionDenied answers.
func TestIsUntoldDense(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{UntoldDenseError("10.0.0.1:1", 2), true},
		{status.Error(codes.PermissionDenied, `dense_addr "x:1" is not a dense worker registered with the router (2 are)`), true},
		{status.Error(codes.PermissionDenied, `role "dense" may not call this`), false},
		{status.Error(codes.Unavailable, "is not a dense worker registered with the router"), false},
		{nil, false},
	} {
		if got := IsUntoldDense(tc.err); got != tc.want {
			t.Errorf("IsUntoldDense(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
