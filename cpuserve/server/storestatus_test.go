package server

import (
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/cpuserve/store"
)

// TestStoreStatusDiskFull: an update the store refused for a full disk
// (nothing written, no number taken) is ResourceExhausted, the worker's
// state and not the request's fault, and not Internal: the router
// catches the worker up once space is freed. A damaged store file is
// DataLoss, which the router retries on another replica.
func TestStoreStatusDiskFull(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want codes.Code
	}{
		{fmt.Errorf("upsert model %q: %w", "m", store.ErrDiskFull), codes.ResourceExhausted},
		{fmt.Errorf("update: %w", store.ErrClosed), codes.Unavailable},
		{fmt.Errorf("upsert: %w", store.ErrUnknownTable), codes.InvalidArgument},
		{fmt.Errorf("model %q: %w", "m", store.ErrCorrupt), codes.DataLoss},
	} {
		if got := status.Code(storeStatus(tc.err)); got != tc.want {
			t.Errorf("%v: %v, want %v", tc.err, got, tc.want)
		}
	}
}
