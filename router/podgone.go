package router

import (
	"net"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// On Kubernetes the worker registry stays the discovery mechanism (it
// carries load and update state), but Kubernetes knows first when a
// worker's Pod is gone: its endpoint leaves the Service's EndpointSlices
// (or turns not ready) when the Pod is deleted, evicted or fails its
// probe, while the registry would wait three silent heartbeats. The
// command watches the EndpointSlices (internal/kubelease) and tells the
// registry through PodGone and PodBack; this file only matches addresses.
//
// A worker is named by the host of its announced address, which on
// Kubernetes is its Pod's IP or a DNS name whose first label is the Pod's
// name or hostname (the chart announces POD.SERVICE:PORT). A Pod gone
// removes every worker so named at once, and a worker so named cannot
// announce itself back (FailedPrecondition; it keeps retrying) until the
// Pod's endpoint is ready again. Workers outside Kubernetes are never
// named by an EndpointSlice and are not affected.

// PodName is what an EndpointSlice says of one endpoint: its addresses,
// hostname and target Pod's name (any may be empty).
type PodName struct {
	Addresses      []string
	Hostname, Name string
}

// matches says whether the host of addr names the Pod.
func (p PodName) matches(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	// An IP by value: the worker's flag may spell it otherwise than
	// the EndpointSlice ([fd00:0::9] and fd00::9 are one host).
	ip := net.ParseIP(host)
	for _, a := range p.Addresses {
		if a != "" && (host == a || ip != nil && ip.Equal(net.ParseIP(a))) {
			return true
		}
	}
	if ip != nil {
		return false
	}
	label, _, _ := strings.Cut(host, ".")
	return label != "" && (label == p.Hostname || label == p.Name)
}

// key is the Pod's identity for the registry's set of gone Pods: its
// name, else its hostname, else its addresses.
func (p PodName) key() string {
	switch {
	case p.Name != "":
		return "pod/" + p.Name
	case p.Hostname != "":
		return "host/" + p.Hostname
	}
	return "addr/" + strings.Join(p.Addresses, ",")
}

// PodGone removes the workers the Pod named and keeps them out until
// PodBack. It returns the ids removed.
func (r *Registry) PodGone(p PodName) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.podsGone == nil {
		r.podsGone = map[string]PodName{}
	}
	r.podsGone[p.key()] = p
	var ids []string
	for id, e := range r.workers {
		if p.matches(e.info.GetAddr()) {
			ids = append(ids, id)
		}
	}
	for _, id := range ids {
		r.drop(id)
	}
	return ids
}

// PodBack lets the Pod's workers announce again (its endpoint is ready).
func (r *Registry) PodBack(p PodName) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.podsGone, p.key())
}

// podGone refuses an announcement from a worker whose Pod is gone; r.mu
// is held.
func (r *Registry) podGone(addr string) error {
	for _, p := range r.podsGone {
		if p.matches(addr) {
			return status.Errorf(codes.FailedPrecondition, "announce: the Pod of %s is not ready in its Service's EndpointSlices; it joins again once it is", addr)
		}
	}
	return nil
}
