package serve

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
)

// DefaultResolveEvery is how often a worker resolves its routers'
// names again, to find new router replicas.
const DefaultResolveEvery = 30 * time.Second

// DefaultResolveRetry is how soon a worker resolves its routers' names
// again when it has reason to (a name failed to resolve, or the
// heartbeat to a router has been failing): the delay doubles at each
// such resolution in a row, up to ResolveEvery.
const DefaultResolveRetry = time.Second

// ParseRouters splits a --router value: router addresses HOST:PORT,
// separated by commas. A HOST that is a name may resolve to several
// routers.
func ParseRouters(s string) ([]string, error) {
	var out []string
	for _, r := range strings.Split(s, ",") {
		r = strings.TrimSpace(r)
		if r == "" {
			continue
		}
		host, port, err := net.SplitHostPort(r)
		if err != nil || host == "" || port == "" {
			return nil, fmt.Errorf("--router %q: address %q: want HOST:PORT", s, r)
		}
		// An IP address in its one form ([0:0:0:0:0:0:0:1]:8500 is
		// [::1]:8500), so that one router written twice two ways is
		// announced to once. A name is left as written.
		if ip, err := netip.ParseAddr(host); err == nil {
			r = net.JoinHostPort(ip.String(), port)
		}
		if !slices.Contains(out, r) {
			out = append(out, r)
		}
	}
	return out, nil
}

// RouterOptions say whom a worker announces to and how (AnnounceRouters).
type RouterOptions struct {
	// Routers are the router addresses (ParseRouters): an IP address is
	// one router, a name every address it resolves to.
	Routers []string
	// Info is the worker's registry entry at each heartbeat.
	Info func() *prismv1.WorkerInfo
	// Answered, when set, hears the routers' answers merged into one
	// (dense_addrs: the union of theirs), in order.
	Answered func(*prismv1.AnnounceResponse)
	// ResolveEvery is how often names are resolved again (default
	// DefaultResolveEvery).
	ResolveEvery time.Duration
	// ResolveRetry is the first delay before names are resolved again
	// out of turn (default DefaultResolveRetry, at most ResolveEvery).
	ResolveRetry time.Duration
	// LookupHost resolves a name (default net.DefaultResolver's; tests
	// replace it).
	LookupHost func(ctx context.Context, host string) ([]string, error)
	// DialOptions are added to every connection to a router.
	DialOptions []grpc.DialOption
	// Prompt, when set, has every router's loop announce out of turn on
	// Prompt.Ask.
	Prompt *Prompt
	// Taken, when set, hears a router refusing id, the worker id it was
	// announced, as bound to another certificate (IDTaken): the worker
	// announces under another id from then on (ServeWorker renames it).
	Taken func(id string, err error)
	Log   *slog.Logger
}

// IDTaken says whether err is a router refusing an announcement because
// the worker id is bound to another certificate identity: a router
// that restarted (its bindings are in memory) and took the id from
// another worker of the role, which may have read it from List, first.
// The worker can only take another id (router/registry.go's refusal
// says "worker id ... belongs to").
func IDTaken(err error) bool {
	st, ok := status.FromError(err)
	return ok && st.Code() == codes.PermissionDenied && strings.Contains(st.Message(), "worker id ") && strings.Contains(st.Message(), " belongs to ")
}

// EnsureDefaults fills zero fields.
func (o *RouterOptions) EnsureDefaults() {
	if o.ResolveEvery <= 0 {
		o.ResolveEvery = DefaultResolveEvery
	}
	if o.ResolveRetry <= 0 {
		o.ResolveRetry = DefaultResolveRetry
	}
	o.ResolveRetry = min(o.ResolveRetry, o.ResolveEvery)
	if o.LookupHost == nil {
		o.LookupHost = net.DefaultResolver.LookupHost
	}
	if o.Log == nil {
		o.Log = slog.Default()
	}
}

// AnnounceRouters keeps a worker registered with every router it
// resolves until ctx ends: one heartbeat (Announce) per router address,
// names resolved again every ResolveEvery, a loop started for each
// router that appears and ended (the worker leaves it) for each that is
// gone. A name that fails to resolve keeps the routers it had. Names are
// resolved again sooner, after ResolveRetry doubling up to
// ResolveEvery, while a name fails to resolve (a headless Service with
// no ready endpoint yet) or a heartbeat keeps failing (the loop says so:
// a router pod replaced in a rollout leaves its old address dead, and
// the new one is found by resolving). done closes once every loop has
// left.
func AnnounceRouters(ctx context.Context, o RouterOptions) (done <-chan struct{}) {
	o.EnsureDefaults()
	merged := newAnswers(o.Answered, nil)
	ch := make(chan struct{})
	go func() {
		defer close(ch)
		type loop struct {
			stop context.CancelFunc
			done <-chan struct{}
		}
		loops := map[string]loop{}
		prev := map[string][]routerTarget{}
		var wg sync.WaitGroup
		// stale hears the loops whose heartbeat keeps failing; one
		// pending signal is enough.
		stale := make(chan struct{}, 1)
		signal := func() {
			select {
			case stale <- struct{}{}:
			default:
			}
		}
		// retry is the delay before the next resolution out of turn.
		retry := o.ResolveRetry
		for {
			resolved := time.Now()
			soon, changed := false, false
			want := map[string]routerTarget{}
			for _, spec := range o.Routers {
				ts, err := resolveRouter(ctx, spec, o.LookupHost)
				if err != nil {
					if ctx.Err() != nil {
						break
					}
					soon = true
					o.Log.Warn("registry: cannot resolve router; keeping its last addresses", "router", spec, "err", err)
					ts = prev[spec]
				}
				prev[spec] = ts
				for _, t := range ts {
					if _, ok := want[t.addr]; !ok {
						want[t.addr] = t
					}
				}
			}
			for addr, l := range loops {
				if _, ok := want[addr]; !ok {
					o.Log.Info("registry: router gone from the resolved addresses; leaving it", "router", addr)
					l.stop()
					delete(loops, addr)
					changed = true
					wg.Add(1)
					go func() {
						defer wg.Done()
						<-l.done
						merged.forget(addr)
					}()
				}
			}
			for addr, t := range want {
				if _, ok := loops[addr]; ok {
					continue
				}
				lctx, stop := context.WithCancel(ctx)
				opts := slices.Clone(o.DialOptions)
				if t.authority != "" {
					// TLS checks the router's certificate against the name
					// it was given, not the address the name resolved to.
					opts = append(opts, grpc.WithAuthority(t.authority))
				}
				changed = true
				heard := func(id string, resp *prismv1.AnnounceResponse, err error) {
					if o.Taken != nil && IDTaken(err) {
						o.Taken(id, err)
					}
					merged.heard(addr, resp, err)
				}
				loops[addr] = loop{stop, announceLoop(lctx, addr, o.Info, heard, signal, o.Prompt, o.Log, opts...)}
			}
			// Next: at ResolveEvery, or after retry when a name failed
			// or a heartbeat signals it keeps failing; retry doubles
			// while that goes on, and is reset by a quiet period or a
			// resolution that changed the routers.
			if changed {
				retry = o.ResolveRetry
			}
			wait := o.ResolveEvery
			if soon {
				wait = retry
			}
			timer := time.NewTimer(wait)
			quiet := false
		waiting:
			for {
				select {
				case <-ctx.Done():
					timer.Stop()
					for _, l := range loops {
						<-l.done
					}
					wg.Wait()
					return
				case <-stale:
					if !soon {
						soon = true
						timer.Reset(time.Until(resolved.Add(retry)))
					}
				case <-timer.C:
					quiet = !soon
					break waiting
				}
			}
			if quiet {
				retry = o.ResolveRetry
			} else {
				retry = min(2*retry, o.ResolveEvery)
			}
		}
	}()
	return ch
}

// routerTarget is one router to dial: its address and, when it was
// found through a name, that name to authenticate it by.
type routerTarget struct{ addr, authority string }

// resolveRouter turns one router address into the routers to dial: an IP
// address is itself; a name is each address it resolves to, but a name
// that resolves only to loopback addresses (localhost: 127.0.0.1 and
// ::1) is one router on this host, dialled by its name.
func resolveRouter(ctx context.Context, spec string, lookup func(context.Context, string) ([]string, error)) ([]routerTarget, error) {
	host, port, err := net.SplitHostPort(spec)
	if err != nil {
		return nil, fmt.Errorf("router address %q: %w", spec, err)
	}
	if net.ParseIP(host) != nil {
		return []routerTarget{{addr: spec}}, nil
	}
	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	ips, err := lookup(lctx, host)
	if err != nil {
		return nil, fmt.Errorf("resolve router %q: %w", host, err)
	}
	if len(ips) == 0 {
		return nil, fmt.Errorf("resolve router %q: no addresses", host)
	}
	loopback := true
	for _, ip := range ips {
		if p := net.ParseIP(ip); p == nil || !p.IsLoopback() {
			loopback = false
		}
	}
	if loopback {
		return []routerTarget{{addr: spec}}, nil
	}
	slices.Sort(ips)
	out := make([]routerTarget, 0, len(ips))
	for _, ip := range slices.Compact(ips) {
		out = append(out, routerTarget{addr: net.JoinHostPort(ip, port), authority: spec})
	}
	return out, nil
}
