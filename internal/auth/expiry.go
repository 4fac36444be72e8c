package auth

import (
	"sync"
	"time"
	"weak"

	"github.com/prometheus/client_golang/prometheus"
)

// The daily log line of warnExpiry is the only sign of a certificate
// running out, logged on a handshake, so a process taking none (an idle
// worker) said nothing, and an alert cannot be set on a log line. Every
// reloader the process holds is listed here (weakly: a configuration
// dropped takes its reloader with it), and ExpiryCollector reports the
// earliest expiry of their certificates.

var live struct {
	mu sync.Mutex
	rs []weak.Pointer[reloader]
}

// track lists r for ExpiryCollector.
func track(r *reloader) {
	live.mu.Lock()
	defer live.mu.Unlock()
	// Drop the collected ones as new ones come, so that a process
	// making configurations again and again keeps no list of them.
	kept := live.rs[:0]
	for _, w := range live.rs {
		if w.Value() != nil {
			kept = append(kept, w)
		}
	}
	live.rs = append(kept, weak.Make(r))
}

// earliestExpiry is the earliest NotAfter of the certificates (the
// processes' own) and of the CAs of every live reloader's current
// identity; zero when none holds one.
func earliestExpiry() (cert, ca time.Time) {
	live.mu.Lock()
	rs := make([]*reloader, 0, len(live.rs))
	for _, w := range live.rs {
		if r := w.Value(); r != nil {
			rs = append(rs, r)
		}
	}
	live.mu.Unlock()
	earliest := func(t *time.Time, at time.Time) {
		if t.IsZero() || at.Before(*t) {
			*t = at
		}
	}
	for _, r := range rs {
		r.mu.Lock()
		id := r.cur
		r.mu.Unlock()
		for i, n := range id.expiring {
			// The certificate, when there is one, is listed first.
			if i == 0 && id.cert != nil {
				earliest(&cert, n.cert.NotAfter)
				continue
			}
			earliest(&ca, n.cert.NotAfter)
		}
	}
	return cert, ca
}

var expiryDesc = prometheus.NewDesc("prism_tls_certificate_expiry_timestamp_seconds",
	"When the earliest of this process's TLS certificates expires (Unix time), by kind: certificate (its own, as last loaded: a renewal rewritten on disk is loaded again without a restart) or ca (the CAs it verifies peers against). Absent without TLS (--insecure).",
	[]string{"kind"}, nil)

type expiryCollector struct{}

// ExpiryCollector reports when the process's certificates expire
// (prism_tls_certificate_expiry_timestamp_seconds): alert on it less
// time(), as a renewal that never came.
func ExpiryCollector() prometheus.Collector { return expiryCollector{} }

func (expiryCollector) Describe(ch chan<- *prometheus.Desc) { ch <- expiryDesc }

func (expiryCollector) Collect(ch chan<- prometheus.Metric) {
	cert, ca := earliestExpiry()
	if !cert.IsZero() {
		ch <- prometheus.MustNewConstMetric(expiryDesc, prometheus.GaugeValue, float64(cert.Unix()), "certificate")
	}
	if !ca.IsZero() {
		ch <- prometheus.MustNewConstMetric(expiryDesc, prometheus.GaugeValue, float64(ca.Unix()), "ca")
	}
}
