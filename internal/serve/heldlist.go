package serve

import (
	"github.com/prism-serve/prism/api/prismv1"
)

// heldList is the dense workers' list one heartbeat loop holds from its
// router, with the version the router named it by
// (AnnounceResponse.dense_version): announced back
// (AnnounceRequest.dense_held), it lets the router leave out a list
// that has not changed since (AnnounceResponse.dense_unchanged), which
// the loop then fills in from here. Routers of earlier releases send
// no version and always the list: the loop holds no version and takes
// every answer as it comes. Owned by the loop's goroutine.
type heldList struct {
	version *prismv1.ListVersion
	addrs   []string
}

// held is the version to announce: nil while the loop holds no
// versioned list.
func (h *heldList) held() *prismv1.ListVersion {
	return h.version
}

// take completes resp, the router's answer to an announcement that
// said held(): an answer leaving the list out gets the one held (and
// is handed on as one carrying it), any other replaces it. ok false:
// the router left out a list this loop does not hold (a version other
// than the one announced; no router of this release does so): resp
// keeps the list held before, the version is forgotten, and the next
// answer carries the list.
func (h *heldList) take(resp *prismv1.AnnounceResponse) (ok bool) {
	if !resp.GetDenseUnchanged() {
		h.addrs, h.version = resp.GetDenseAddrs(), resp.GetDenseVersion()
		return true
	}
	resp.DenseAddrs, resp.DenseUnchanged = h.addrs, false
	if !prismv1.SameList(h.version, resp.GetDenseVersion()) {
		h.version = nil
		return false
	}
	return true
}
