package server

import (
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// DefaultMaxInflightSamples is Options.MaxInflightSamples' default.
const DefaultMaxInflightSamples = 65536

// denseSet is the dense workers' addresses the router last told this
// worker of (AnnounceResponse.dense_addrs).
type denseSet map[string]struct{}

// SetDenseAddrs replaces the dense workers a Lookup may send cut tensors
// to: the router's latest list (internal/serve hands every announce
// answer here). Lookups read it with one atomic load.
func (s *Server) SetDenseAddrs(addrs []string) {
	set := make(denseSet, len(addrs))
	for _, a := range addrs {
		set[a] = struct{}{}
	}
	s.denseAddrs.Store(&set)
}

// checkDense refuses a dense_addr the router has not registered: the
// cut tensors (pooled embeddings) go only to dense workers of this
// deployment.
func (s *Server) checkDense(addr string) error {
	if s.opts.AnyDenseAddr {
		return nil
	}
	set := s.denseAddrs.Load()
	if set == nil {
		return status.Error(codes.Unavailable, "this embedding worker has not heard from a router yet, so it knows no dense worker to send to; retry")
	}
	if _, ok := (*set)[addr]; !ok {
		return status.Errorf(codes.PermissionDenied, "dense_addr %.128q is not a dense worker registered with the router (%d are)", addr, len(*set))
	}
	return nil
}

// admit charges a Lookup of n samples, whose cut tensors take bytes,
// against Options.MaxInflightSamples and MaxInflightBytes; release gives
// them back once it is answered. A Lookup alone in flight is admitted
// whatever its samples and bytes (it passed MaxSamples), so a small
// budget slows the worker instead of refusing every large request (a
// refusal on an idle worker would be "retry later" forever).
func (s *Server) admit(n, bytes int64) (release func(), err error) {
	if cur := s.outstanding.Add(n); cur > s.opts.MaxInflightSamples && cur != n {
		s.outstanding.Add(-n)
		return nil, status.Errorf(codes.ResourceExhausted, "embedding worker overloaded: %d samples in flight, limit %d; retry later", cur-n, s.opts.MaxInflightSamples)
	}
	if max := s.opts.MaxInflightBytes; max > 0 {
		if cur := s.inflightBytes.Add(bytes); cur > max && cur != bytes {
			s.inflightBytes.Add(-bytes)
			s.outstanding.Add(-n)
			return nil, status.Errorf(codes.ResourceExhausted, "embedding worker overloaded: %d bytes of cut tensors in flight, limit %d (its memory budget); retry later", cur-bytes, max)
		}
	} else {
		bytes = 0
	}
	return func() {
		s.outstanding.Add(-n)
		if bytes != 0 {
			s.inflightBytes.Add(-bytes)
		}
	}, nil
}
