// Package kubelease elects, through a Kubernetes Lease, the router that
// sequences embedding updates (issue 12): every router runs an Elector
// under its advertised address, and the holder of the Lease sequences
// while the others forward to it. It is the one package that links
// client-go, so the tiers and the commands that do not elect stay free
// of it; the router sees it only as router.Election.
package kubelease

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	coordv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	coordinationv1 "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/prism-serve/prism/api/prismv1"
)

// Options configure an Elector.
type Options struct {
	// Namespace and Name name the Lease (created at the first try).
	Namespace, Name string
	// Identity is this router's name in the election: the address the
	// other routers dial it at.
	Identity string
	// Leases reaches the coordination.k8s.io/v1 API (tests give a fake
	// clientset's); nil: made from Kubeconfig, or in-cluster.
	Leases coordinationv1.LeasesGetter
	// Kubeconfig is a kubeconfig file for a router running outside the
	// cluster ("": the in-cluster configuration of the Pod).
	Kubeconfig string
	// LeaseDuration is how long a holder that stopped renewing keeps the
	// Lease (default 15s); RenewDeadline how long the holder retries a
	// renewal before it gives the Lease up (default 2/3 of it);
	// RetryPeriod the interval of tries (default 2/15 of it).
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	Logger                                    *slog.Logger
}

// EnsureDefaults fills zero fields.
func (o *Options) EnsureDefaults() {
	if o.LeaseDuration <= 0 {
		o.LeaseDuration = 15 * time.Second
	}
	if o.RenewDeadline <= 0 {
		o.RenewDeadline = o.LeaseDuration * 2 / 3
	}
	if o.RetryPeriod <= 0 {
		o.RetryPeriod = o.LeaseDuration * 2 / 15
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
}

// Validate reports what is wrong with o.
func (o *Options) Validate() error {
	switch {
	case o.Namespace == "" || o.Name == "":
		return fmt.Errorf("lease %q/%q: a namespace and a name are needed", o.Namespace, o.Name)
	case o.Identity == "":
		return errors.New("no identity: the address the other routers dial this one at is needed")
	case strings.Contains(o.Identity, processMark):
		return fmt.Errorf("identity %q: an address without %q (it marks the process in the Lease)", o.Identity, processMark)
	case !hostPort(o.Identity):
		// The other routers dial it to forward updates: unbracketed,
		// an IPv6 address and its port ($(POD_IP):8500 with an IPv6
		// pod IP) is no address they can dial.
		return fmt.Errorf("identity %q: want HOST:PORT, the address the other routers dial this one at (an IPv6 address in brackets: [fd00::5]:8500)", o.Identity)
	case o.LeaseDuration < time.Second:
		// The Lease records whole seconds.
		return fmt.Errorf("lease duration %v: at least 1s", o.LeaseDuration)
	case o.LeaseDuration%time.Second != 0:
		// The Lease records whole seconds (client-go truncates): the
		// other routers would take it over after the truncated duration
		// while this one, renewing within 2/3 of the full one, still
		// believed it held it.
		return fmt.Errorf("lease duration %v: whole seconds (the Lease records %v)", o.LeaseDuration, o.LeaseDuration.Truncate(time.Second))
	case o.RenewDeadline >= o.LeaseDuration:
		return fmt.Errorf("renew deadline %v: below the lease duration %v", o.RenewDeadline, o.LeaseDuration)
	case float64(o.RenewDeadline) <= leaderelection.JitterFactor*float64(o.RetryPeriod):
		return fmt.Errorf("renew deadline %v: above %v times the retry period %v", o.RenewDeadline, leaderelection.JitterFactor, o.RetryPeriod)
	}
	return nil
}

// ParseLease splits "NAMESPACE/NAME".
func ParseLease(s string) (namespace, name string, err error) {
	namespace, name, ok := strings.Cut(s, "/")
	if !ok || namespace == "" || name == "" || strings.Contains(name, "/") {
		return "", "", fmt.Errorf("lease %q: want NAMESPACE/NAME", s)
	}
	return namespace, name, nil
}

// Elector takes part in the election of one Lease.
type Elector struct {
	o    Options
	lock *resourcelock.LeaseLock

	mu sync.Mutex
	// leading: this elector holds the Lease (between client-go's
	// OnStartedLeading and OnStoppedLeading of one round); observed is
	// the holder last seen in the Lease.
	leading  bool
	observed string
	// epoch is the epoch of this elector's hold (Epoch: the Lease's
	// creation time and its count of holder changes), read when the hold
	// began, and read again from a renewal's answer when the hold goes on
	// in a Lease made anew (wrote); 0: not known.
	epoch   uint64
	changed chan struct{}
	// heard is the highest epoch of any Lease this elector has read or
	// written (every router reads the Lease each retry period), and
	// leaseUID and leaseCount the Lease last read or written and the
	// highest count of holder changes it had: a Lease this elector makes
	// starts its count above heard's, and an update of it never lowers
	// its count (floor).
	heard      uint64
	leaseUID   types.UID
	leaseCount int32
}

// New makes an Elector; it reaches the API server only in Run.
func New(o Options) (*Elector, error) {
	o.EnsureDefaults()
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if o.Leases == nil {
		cfg, err := config(o.Kubeconfig)
		if err != nil {
			return nil, err
		}
		c, err := coordinationv1.NewForConfig(cfg)
		if err != nil {
			return nil, fmt.Errorf("kubernetes client: %w", err)
		}
		o.Leases = c
	}
	e := &Elector{o: o, changed: make(chan struct{}, 1)}
	e.lock = &resourcelock.LeaseLock{
		LeaseMeta: metav1.ObjectMeta{Namespace: o.Namespace, Name: o.Name},
		// The lock's writes pass by the elector (watched), which learns
		// from what the API server answers when its Lease was made anew
		// during its hold.
		Client: watched{o.Leases, e},
		// The Lease names this process, not only its address: a
		// router restarted under the same address (a Pod's container
		// restart) is another holder to client-go, which then counts
		// the change (leaseTransitions, the epoch), instead of taking
		// the crashed process's hold back as its own.
		LockConfig: resourcelock.ResourceLockConfig{Identity: o.Identity + processMark + strconv.FormatUint(rand.Uint64(), 36)},
		Labels:     map[string]string{"app.kubernetes.io/part-of": "prism"},
	}
	return e, nil
}

// watched is the LeaseLock's client: the elector's, whose Lease writes
// the elector reads the answers of (wrote).
type watched struct {
	coordinationv1.LeasesGetter
	e *Elector
}

func (w watched) Leases(ns string) coordinationv1.LeaseInterface {
	return watchedLeases{w.LeasesGetter.Leases(ns), w.e}
}

type watchedLeases struct {
	coordinationv1.LeaseInterface
	e *Elector
}

func (w watchedLeases) Get(ctx context.Context, name string, o metav1.GetOptions) (*coordv1.Lease, error) {
	out, err := w.LeaseInterface.Get(ctx, name, o)
	if err == nil {
		w.e.read(out)
	}
	return out, err
}

func (w watchedLeases) Create(ctx context.Context, l *coordv1.Lease, o metav1.CreateOptions) (*coordv1.Lease, error) {
	heard := w.e.floor(l, true)
	out, err := w.LeaseInterface.Create(ctx, l, o)
	if err == nil {
		w.e.read(out)
		if ep := Epoch(out.CreationTimestamp.Time, ptrOr(out.Spec.LeaseTransitions, -1)); ep != 0 && ep < heard {
			// Its creation time is below the old Lease's: the count
			// cannot order it (the API server's clock is behind the one
			// that made the old Lease).
			w.e.o.Logger.Warn("made the update sequencing lease anew, but the API server stamped it with a creation time before the previous Lease's (its clock is behind): the workers that heard of the previous Lease's holds refuse the updates of this one's until it is made anew once more", "lease", w.e.o.Namespace+"/"+w.e.o.Name, "epoch", prismv1.FormatEpoch(ep), "previous", prismv1.FormatEpoch(heard))
		}
		w.e.wrote(out)
	}
	return out, err
}

func (w watchedLeases) Update(ctx context.Context, l *coordv1.Lease, o metav1.UpdateOptions) (*coordv1.Lease, error) {
	w.e.floor(l, false)
	out, err := w.LeaseInterface.Update(ctx, l, o)
	if err == nil {
		w.e.read(out)
		w.e.wrote(out)
	}
	return out, err
}

// read notes a Lease read or written: its epoch, if above every one
// heard, and its count of holder changes.
func (e *Elector) read(l *coordv1.Lease) {
	if l == nil || l.Spec.LeaseTransitions == nil {
		return
	}
	n := *l.Spec.LeaseTransitions
	e.mu.Lock()
	defer e.mu.Unlock()
	if ep := Epoch(l.CreationTimestamp.Time, n); ep > e.heard {
		e.heard = ep
	}
	switch {
	case l.UID == "":
	case l.UID != e.leaseUID:
		e.leaseUID, e.leaseCount = l.UID, n
	case n > e.leaseCount:
		e.leaseCount = n
	}
}

// floor raises the count of holder changes of a Lease about to be
// written: a Lease made (create) counts on from the highest epoch heard,
// so that a Lease made in the same second as the one it replaces (or
// with a creation time equal to it) still has its holds' epochs above
// every hold of the old one (the time alone, whole seconds, would not
// order them); an update of the Lease last read counts at least as many
// changes as it had (client-go writes the count it made the Lease with,
// which the raise above does not reach). It returns the highest epoch
// heard.
func (e *Elector) floor(l *coordv1.Lease, create bool) uint64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := ptrOr(l.Spec.LeaseTransitions, 0)
	switch {
	case create && e.heard != 0:
		// heard's low bits are its count plus one: one change more.
		n = max(n, int32(e.heard&(prismv1.OrderedEpoch-1)))
	case !create && l.UID != "" && l.UID == e.leaseUID:
		n = max(n, e.leaseCount)
	}
	l.Spec.LeaseTransitions = &n
	return e.heard
}

func ptrOr[T any](p *T, or T) T {
	if p == nil {
		return or
	}
	return *p
}

// wrote is the API server's answer to a write of the elector's lock. A
// renewal changes no epoch. But a Lease deleted during the hold is made
// anew by the holder's next renewal (client-go creates it when it finds
// none) in the same round, with no new start of leading: the hold goes
// on in the new Lease, whose epoch (its creation time, its count) is
// read here and reported as a new hold's, so the workers hear of it and
// refuse the updates of holds of the old Lease (the router starts a new
// term under it, router/elect.go). So is the epoch of a hold that began
// with none known (readEpoch could not read the Lease): fencing starts
// a renewal later instead of never in that hold. (The start of a hold
// is OnStartedLeading's: not leading yet, nothing changes here.)
func (e *Elector) wrote(l *coordv1.Lease) {
	if l == nil || l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity != e.lock.Identity() || l.Spec.LeaseTransitions == nil {
		return
	}
	ep := Epoch(l.CreationTimestamp.Time, *l.Spec.LeaseTransitions)
	e.mu.Lock()
	news, unknown, remade := e.leading && ep != 0 && ep != e.epoch, e.epoch == 0, !prismv1.SameLease(ep, e.epoch)
	e.mu.Unlock()
	switch {
	case !news:
		return
	case unknown:
		// The Lease could not be read as the hold began (readEpoch): the
		// hold ran unfenced until this answer named its epoch.
		e.o.Logger.Info("read the update sequencing lease's epoch from a renewal: this router's hold is fenced from now on", "lease", e.o.Namespace+"/"+e.o.Name, "epoch", prismv1.FormatEpoch(ep))
	case remade:
		e.o.Logger.Warn("the update sequencing lease was deleted and made anew during this router's hold: it holds the new Lease, a new hold under the new Lease's epoch", "lease", e.o.Namespace+"/"+e.o.Name, "epoch", prismv1.FormatEpoch(ep))
	default:
		// client-go's renewal took the Lease back after another holder
		// had it (its count moved on): a new hold, as after a stop.
		e.o.Logger.Warn("the update sequencing lease was held by another router between two of this router's renewals: a new hold under its new epoch", "lease", e.o.Namespace+"/"+e.o.Name, "epoch", prismv1.FormatEpoch(ep))
	}
	e.set(func() {
		if e.leading {
			e.epoch = ep
		}
	})
}

func config(kubeconfig string) (*rest.Config, error) {
	if kubeconfig != "" {
		cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("kubeconfig %q: %w", kubeconfig, err)
		}
		return cfg, nil
	}
	cfg, err := rest.InClusterConfig()
	if err != nil {
		return nil, fmt.Errorf("in-cluster kubernetes configuration: %w (outside a cluster, name a kubeconfig)", err)
	}
	return cfg, nil
}

// Identity is this router's name in the election.
func (e *Elector) Identity() string { return e.o.Identity }

// Run takes part in the election until ctx ends, then gives the Lease
// up if it holds it. It calls leader, one call at a time, each time the
// view changes: Identity() while this elector holds the Lease, the
// holder's identity while another does, "" while none is known (no
// holder yet, or this elector's hold just ended: the Lease may still
// name it until another takes it). While this elector holds the Lease,
// epoch is Epoch of the Lease as its hold began (its creation time, and
// leaseTransitions plus one):
// client-go adds one each time a different identity takes the Lease, so
// the hold follows the one of epoch-1 directly, or is this elector's
// own of the same epoch taken back with no other between (0: not known).
func (e *Elector) Run(ctx context.Context, leader func(addr string, epoch uint64)) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		reported, reportedEpoch := "", uint64(0)
		for {
			select {
			case <-e.changed:
			case <-ctx.Done():
				if reported != "" {
					leader("", 0)
				}
				return
			}
			if v, ep := e.view(); v != reported || ep != reportedEpoch {
				reported, reportedEpoch = v, ep
				leader(v, ep)
			}
		}
	}()
	for ctx.Err() == nil {
		// One round: acquire, lead until a renewal fails, stop. A lost
		// Lease starts a new round (client-go's elector leads once).
		le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
			Lock:            e.lock,
			LeaseDuration:   e.o.LeaseDuration,
			RenewDeadline:   e.o.RenewDeadline,
			RetryPeriod:     e.o.RetryPeriod,
			ReleaseOnCancel: true,
			Name:            e.o.Namespace + "/" + e.o.Name,
			Callbacks: leaderelection.LeaderCallbacks{
				// Called on goroutines of their own: a round's start is
				// taken only while its context lives (client-go cancels
				// it before it calls OnStoppedLeading).
				OnStartedLeading: func(rctx context.Context) {
					epoch := e.readEpoch(rctx)
					e.set(func() {
						if rctx.Err() == nil {
							e.leading, e.epoch = true, epoch
						}
					})
				},
				OnStoppedLeading: func() { e.set(func() { e.leading = false }) },
				OnNewLeader: func(id string) {
					addr, _, _ := strings.Cut(id, processMark)
					e.set(func() { e.observed = addr })
				},
			},
		})
		if err != nil {
			e.o.Logger.Error("lease election cannot start", "lease", e.o.Namespace+"/"+e.o.Name, "err", err)
			break // Validate checked what client-go does: not reached
		}
		le.Run(ctx)
		if ctx.Err() == nil {
			e.o.Logger.Warn("lost the update sequencing lease; taking part again", "lease", e.o.Namespace+"/"+e.o.Name)
		}
	}
	<-done
}

func (e *Elector) set(f func()) {
	e.mu.Lock()
	f()
	e.mu.Unlock()
	select {
	case e.changed <- struct{}{}:
	default:
	}
}

// view is the holder as Run reports it, and the epoch of this
// elector's hold.
func (e *Elector) view() (string, uint64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	switch {
	case e.leading:
		return e.o.Identity, e.epoch
	case e.observed == e.o.Identity:
		// The Lease still names this elector, which does not hold it
		// (its hold ended, or it is about to take it back).
		return "", 0
	}
	return e.observed, 0
}

// readEpoch reads the Lease this elector has just taken: its
// Epoch, or 0 when it cannot be read or names
// another holder already.
func (e *Elector) readEpoch(ctx context.Context) uint64 {
	// Read with a client call of its own: the LeaseLock is client-go's
	// elector's, and not safe beside it.
	l, err := e.o.Leases.Leases(e.o.Namespace).Get(ctx, e.o.Name, metav1.GetOptions{})
	switch {
	case err != nil:
		e.o.Logger.Warn("cannot read the update sequencing lease's transitions; this router starts sequencing without the previous holder's update log", "lease", e.o.Namespace+"/"+e.o.Name, "err", err)
		return 0
	case l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity != e.lock.Identity() || l.Spec.LeaseTransitions == nil || *l.Spec.LeaseTransitions < 0:
		return 0
	}
	return Epoch(l.CreationTimestamp.Time, *l.Spec.LeaseTransitions)
}

// processMark separates a router's address from its process's mark in
// the Lease's holder identity.
const processMark = "#"

// Epoch is the epoch of a hold of the Lease made at created, taken at
// leaseTransitions transitions (prismv1's ordered epochs): created's Unix
// seconds in the high 32 bits, so the holds of a Lease deleted and made
// again follow every hold of the old one, prismv1.OrderedEpoch, and the
// transitions plus one in the low 31 bits. 0 (not known) when created
// is not set or out of range, or transitions is.
func Epoch(created time.Time, transitions int32) uint64 {
	sec := created.Unix()
	if created.IsZero() || sec <= 0 || sec > math.MaxUint32 || transitions < 0 || transitions >= prismv1.OrderedEpoch-1 {
		return 0
	}
	return uint64(sec)<<32 | prismv1.OrderedEpoch | uint64(transitions+1)
}

// hostPort says whether addr is HOST:PORT, both given.
func hostPort(addr string) bool {
	host, port, err := net.SplitHostPort(addr)
	return err == nil && host != "" && port != ""
}
