package auth

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// ReloadInterval bounds how often a process checks its certificate
// files for a change (cert-manager, or an operator, rewrites them in
// place before they expire): at most once per interval, on a handshake.
var ReloadInterval = 10 * time.Second

// now is the clock certificates are judged by (tests move it).
var now = time.Now

// expiryWarning is how long before its certificate or CA expires a
// process warns (once a day, on handshakes): a quarter of the
// certificate's lifetime, at most 30 days, so that a certificate renewed
// on cert-manager's schedule (at two thirds of its life) never warns.
func expiryWarning(c *x509.Certificate) time.Duration {
	return min(30*24*time.Hour, c.NotAfter.Sub(c.NotBefore)/4)
}

var logger atomic.Pointer[slog.Logger]

// SetLogger sets where certificate reloads, failed reloads and
// approaching expiry are logged (slog.Default until set).
func SetLogger(l *slog.Logger) { logger.Store(l) }

func logf() *slog.Logger {
	if l := logger.Load(); l != nil {
		return l
	}
	return slog.Default()
}

// fileStamp is what says a file changed: its modification time and size
// (a Kubernetes Secret volume swaps a link to new files, which Stat
// follows).
type fileStamp struct {
	mod  time.Time
	size int64
	err  string
}

type stamps [3]fileStamp

func stampsOf(f Files) stamps {
	var s stamps
	for i, p := range []string{f.Cert, f.Key, f.CA} {
		if p == "" {
			continue
		}
		st, err := os.Stat(p)
		if err != nil {
			s[i].err = err.Error()
			continue
		}
		s[i].mod, s[i].size = st.ModTime(), st.Size()
	}
	return s
}

// identity is what a reloader hands out: a process's certificate (none
// without one) and the CA pool it verifies peers against.
type identity struct {
	cert *tls.Certificate
	pool *x509.CertPool
	// expiring are the certificate and the CA's, checked for expiry.
	expiring []named
}

type named struct {
	what string
	cert *x509.Certificate
}

// reloader holds the files of one identity as last loaded, and loads
// them again when they change.
type reloader struct {
	f        Files
	withCert bool

	mu      sync.Mutex
	cur     identity
	stamp   stamps // of the files cur was loaded from
	bad     stamps // of the files that last failed to load
	checked time.Time
	warned  time.Time
}

// newReloader loads f (load's errors, which name the files).
func newReloader(f Files, withCert bool) (*reloader, error) {
	r := &reloader{f: f, withCert: withCert, stamp: stampsOf(f)}
	id, err := loadIdentity(f, withCert, false)
	if err != nil {
		return nil, err
	}
	t := now()
	r.cur, r.checked = id, t
	r.warnExpiry(t)
	track(r)
	return r, nil
}

// loadIdentity is load with the certificates to watch for expiry; with
// chain, the certificate must chain to the CA (a rewrite that left a
// certificate of another CA would have every peer refuse it).
func loadIdentity(f Files, withCert, chain bool) (identity, error) {
	cert, pool, err := load(f, withCert)
	if err != nil {
		return identity{}, err
	}
	id := identity{pool: pool}
	if withCert {
		id.cert = &cert
		leaf := cert.Leaf
		if leaf == nil {
			if leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
				return identity{}, fmt.Errorf("certificate %s: %w", f.Cert, err)
			}
		}
		id.expiring = append(id.expiring, named{"certificate " + f.Cert, leaf})
		if chain {
			if err := verifyOwn(cert, leaf, pool, f); err != nil {
				return identity{}, err
			}
		}
	}
	if caPEM, err := os.ReadFile(f.CA); err == nil {
		for rest := caPEM; ; {
			var b *pem.Block
			if b, rest = pem.Decode(rest); b == nil {
				break
			}
			if c, err := x509.ParseCertificate(b.Bytes); err == nil && b.Type == "CERTIFICATE" {
				id.expiring = append(id.expiring, named{"CA " + f.CA + " (" + c.Subject.String() + ")", c})
			}
		}
	}
	return id, nil
}

// verifyOwn checks that a process's own certificate chains to the CA it
// verifies its peers against, which is the CA its peers verify it
// against.
func verifyOwn(cert tls.Certificate, leaf *x509.Certificate, pool *x509.CertPool, f Files) error {
	inter := x509.NewCertPool()
	for _, der := range cert.Certificate[1:] {
		if c, err := x509.ParseCertificate(der); err == nil {
			inter.AddCert(c)
		}
	}
	_, err := leaf.Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}, CurrentTime: now()})
	if err != nil {
		return fmt.Errorf("certificate %s (%s, issued by %s) does not chain to CA %s, which peers verify it against: %w", f.Cert, leaf.Subject, leaf.Issuer, f.CA, err)
	}
	return nil
}

// CheckFiles loads f as a serving or dialling process does and also
// checks that its certificate chains to its CA: the errors a process
// should stop at when it starts, naming the files.
func CheckFiles(f Files) error {
	if f.Cert == "" && f.Key == "" {
		_, _, err := load(f, false)
		return err
	}
	_, err := loadIdentity(f, true, true)
	return err
}

// get is the identity to handshake with: the files are checked for a
// change at most once per ReloadInterval and loaded again when they
// changed; files that fail to load (half written, a key of another
// certificate, a certificate of another CA, expired, not valid yet) are
// logged, once, and the previous identity kept. Files that failed are
// loaded again at each check until they load or change: a renewal
// refused because it is not valid yet by this host's clock (its issuer's
// clock ahead, or this one's behind: cert-manager's certificates start
// when they are made) loads once this clock passes its start, instead of
// never, the process serving on with the old certificate until it
// expired.
func (r *reloader) get() identity {
	r.mu.Lock()
	defer r.mu.Unlock()
	t := now()
	if t.Sub(r.checked) < ReloadInterval {
		return r.cur
	}
	r.checked = t
	if s := stampsOf(r.f); s != r.stamp {
		id, err := loadIdentity(r.f, r.withCert, true)
		switch {
		case err != nil:
			if s != r.bad {
				logf().Warn("certificate files changed but do not load: still using the previous ones", "err", err)
			}
			r.bad = s
		default:
			r.cur, r.stamp, r.bad, r.warned = id, s, stamps{}, time.Time{}
			attrs := []any{"ca", r.f.CA}
			if id.cert != nil {
				leaf := id.expiring[0].cert
				attrs = append(attrs, "cert", r.f.Cert, "subject", leaf.Subject.String(), "not_after", leaf.NotAfter.UTC().Format(time.RFC3339))
			}
			logf().Info("reloaded certificate files", attrs...)
		}
	}
	r.warnExpiry(t)
	return r.cur
}

// warnExpiry logs, at most once a day, each certificate of the current
// identity that expires soon.
func (r *reloader) warnExpiry(now time.Time) {
	if !r.warned.IsZero() && now.Sub(r.warned) < 24*time.Hour {
		return
	}
	for _, n := range r.cur.expiring {
		if left := n.cert.NotAfter.Sub(now); left < expiryWarning(n.cert) {
			r.warned = now
			if !expiryWarned.first(n.what, n.cert.NotAfter, now) {
				continue // another configuration of this process said so today
			}
			logf().Warn("certificate expires soon: renew it (rewrite the files; they are reloaded without a restart)",
				"what", n.what, "not_after", n.cert.NotAfter.UTC().Format(time.RFC3339), "left", left.Round(time.Minute).String())
		}
	}
}

// expiryWarned is when each expiring certificate (its file and its
// NotAfter) was last warned about in this process: a process loads the
// same files into several configurations (a router's server, its
// clients of each tier, its metrics endpoint), and each warned of the
// same certificate, four lines at a router's start.
var expiryWarned = warnedSet{at: map[warnedKey]time.Time{}}

type warnedKey struct {
	what     string
	notAfter time.Time
}

type warnedSet struct {
	mu sync.Mutex
	at map[warnedKey]time.Time
}

// first says whether what, expiring at notAfter, was not warned about
// within the last day, and records now as its warning if so.
func (w *warnedSet) first(what string, notAfter, now time.Time) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	k := warnedKey{what, notAfter.UTC()}
	if at, ok := w.at[k]; ok && now.Sub(at) < 24*time.Hour && now.Sub(at) >= 0 {
		return false
	}
	w.at[k] = now
	return true
}
