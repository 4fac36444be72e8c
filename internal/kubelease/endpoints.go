package kubelease

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	discoveryclient "k8s.io/client-go/kubernetes/typed/discovery/v1"
	"k8s.io/client-go/tools/cache"
)

// Pod is what an EndpointSlice says of one endpoint.
type Pod struct {
	Addresses      []string
	Hostname, Name string
}

// id is the Pod's identity across slices (IPv4 and IPv6 slices name the
// same Pod): its target Pod's name, else hostname, else first address.
func (p Pod) id() string {
	switch {
	case p.Name != "":
		return "pod/" + p.Name
	case p.Hostname != "":
		return "host/" + p.Hostname
	case len(p.Addresses) > 0:
		return "addr/" + p.Addresses[0]
	}
	return ""
}

// EndpointsOptions configure WatchEndpoints.
type EndpointsOptions struct {
	// Namespace and Services: the Services whose EndpointSlices to watch
	// (the embedding and dense workers' headless Services).
	Namespace string
	Services  []string
	// Slices reaches the discovery.k8s.io/v1 API; nil: made from
	// Kubeconfig, or in-cluster.
	Slices     discoveryclient.EndpointSlicesGetter
	Kubeconfig string
	Logger     *slog.Logger
}

// Validate reports what is wrong with o.
func (o *EndpointsOptions) Validate() error {
	if o.Namespace == "" || len(o.Services) == 0 || slices.Contains(o.Services, "") {
		return fmt.Errorf("endpoints %q/%q: a namespace and Service names are needed", o.Namespace, o.Services)
	}
	return nil
}

// ParseServices splits "NAMESPACE/SERVICE[,SERVICE...]".
func ParseServices(s string) (namespace string, services []string, err error) {
	namespace, list, ok := strings.Cut(s, "/")
	if !ok || namespace == "" || list == "" {
		return "", nil, fmt.Errorf("%q: want NAMESPACE/SERVICE[,SERVICE...]", s)
	}
	for _, svc := range strings.Split(list, ",") {
		if svc == "" || strings.Contains(svc, "/") {
			return "", nil, fmt.Errorf("%q: want NAMESPACE/SERVICE[,SERVICE...]", s)
		}
		services = append(services, svc)
	}
	return namespace, services, nil
}

// podTracker turns EndpointSlice states into Pod transitions: a Pod that
// was ready in some slice and is ready in none any more is gone; one
// that is ready again after that is back. A Pod never seen ready makes
// no transition. A gone Pod that no slice lists any more, in any
// condition, is deleted (its containers have stopped): it is reported
// back too, at the next change of any slice, so the router no longer
// keeps its name out. Kept, every Pod a rollout, a scale-down or a
// returned loan deleted stayed in the router's set of gone Pods for the
// router's life (a Deployment's Pods never come back under their name),
// and a new Pod given a deleted one's IP was refused for ever when its
// workers announce by IP. It is the watch's deterministic core (no IO).
type podTracker struct {
	// slices is per slice the ready Pods it lists, by id; listed is per
	// slice every Pod it lists, ready or not.
	slices map[string]map[string]Pod
	listed map[string]map[string]bool
	// goneIDs are the Pods reported gone and not back yet.
	goneIDs map[string]Pod
	// addrs is per ready Pod, per slice, the addresses it was last ready
	// with there: a dual-stack Pod's IPv4 and IPv6 slices drop it one
	// after the other, and the Pod gone at the second names both (its
	// workers may announce either).
	addrs map[string]map[string][]string
}

func newPodTracker() *podTracker {
	return &podTracker{slices: map[string]map[string]Pod{}, listed: map[string]map[string]bool{}, goneIDs: map[string]Pod{}, addrs: map[string]map[string][]string{}}
}

// listedIDs are the ids of every Pod s lists, ready or not (nil: none).
func listedIDs(s *discoveryv1.EndpointSlice) map[string]bool {
	if s == nil {
		return nil
	}
	out := map[string]bool{}
	for _, e := range s.Endpoints {
		p := Pod{Addresses: e.Addresses}
		if e.Hostname != nil {
			p.Hostname = *e.Hostname
		}
		if e.TargetRef != nil && e.TargetRef.Kind == "Pod" {
			p.Name = e.TargetRef.Name
		}
		if id := p.id(); id != "" {
			out[id] = true
		}
	}
	return out
}

// ready is the set of ready Pods of an EndpointSlice: by their serving
// condition, the Pod's readiness, where it is set, else by ready. The
// workers' Services publish not-ready addresses, for which the
// EndpointSlice controller marks every endpoint ready whatever its Pod's
// readiness; serving is the Pod's Ready condition in every case. An
// endpoint whose condition is unset counts as ready (the API's rule); a
// terminating one is not.
func ready(s *discoveryv1.EndpointSlice) map[string]Pod {
	out := map[string]Pod{}
	for _, e := range s.Endpoints {
		r := e.Conditions.Ready
		if e.Conditions.Serving != nil {
			r = e.Conditions.Serving
		}
		if r != nil && !*r {
			continue
		}
		if e.Conditions.Terminating != nil && *e.Conditions.Terminating {
			continue
		}
		p := Pod{Addresses: slices.Clone(e.Addresses)}
		if e.Hostname != nil {
			p.Hostname = *e.Hostname
		}
		if e.TargetRef != nil && e.TargetRef.Kind == "Pod" {
			p.Name = e.TargetRef.Name
		}
		if id := p.id(); id != "" {
			if old, ok := out[id]; ok {
				p.Addresses = append(old.Addresses, p.Addresses...)
			}
			out[id] = p
		}
	}
	return out
}

// set records a slice's ready Pods and every Pod it lists, ready or not
// (both nil: the slice was deleted), and returns the transitions. A Pod
// gone in an earlier call that no slice lists now is deleted (forgotten:
// no longer kept out), unless this call deletes a slice (its Pods may be
// listed by the slice replacing it at the next); one gone in this call
// stays gone until the next,
// so a Pod dropped from its slice at once is still kept out while its
// process stops.
func (t *podTracker) set(slice string, now map[string]Pod, listed map[string]bool) (gone, back, deleted []Pod) {
	before := t.slices[slice]
	if now == nil {
		delete(t.slices, slice)
	} else {
		t.slices[slice] = now
	}
	if listed == nil {
		delete(t.listed, slice)
	} else {
		t.listed[slice] = listed
	}
	// A deleted slice forgets no Pod in the same change: the
	// controller replacing a slice deletes the old one before the watch
	// delivers the new one that lists its Pods again (a not-ready Pod
	// forgotten there would be let back in). One still listed by no
	// slice is forgotten at the next change.
	for id, p := range t.goneIDs {
		if listed != nil && !t.listedAnywhere(id) {
			delete(t.goneIDs, id)
			deleted = append(deleted, p)
		}
	}
	for id, p := range now {
		if t.addrs[id] == nil {
			t.addrs[id] = map[string][]string{}
		}
		t.addrs[id][slice] = p.Addresses
	}
	for id, p := range before {
		if _, still := now[id]; still || t.readyElsewhere(id) {
			continue
		}
		// Every address the Pod had in any slice goes: this slice's
		// first, in order (a Pod without a name is known by them).
		p.Addresses = slices.Clone(p.Addresses)
		for _, other := range slices.Sorted(maps.Keys(t.addrs[id])) {
			for _, a := range t.addrs[id][other] {
				if !slices.Contains(p.Addresses, a) {
					p.Addresses = append(p.Addresses, a)
				}
			}
		}
		delete(t.addrs, id)
		t.goneIDs[id] = p
		gone = append(gone, p)
	}
	for id, p := range now {
		if _, ok := t.goneIDs[id]; ok {
			delete(t.goneIDs, id)
			back = append(back, p)
		}
	}
	byID := func(a, b Pod) int { return strings.Compare(a.id(), b.id()) }
	slices.SortFunc(gone, byID)
	slices.SortFunc(back, byID)
	slices.SortFunc(deleted, byID)
	return gone, back, deleted
}

// listedAnywhere says whether some slice lists the Pod, ready or not.
func (t *podTracker) listedAnywhere(id string) bool {
	for _, ps := range t.listed {
		if ps[id] {
			return true
		}
	}
	return false
}

// readyElsewhere says whether some slice still lists the Pod ready.
func (t *podTracker) readyElsewhere(id string) bool {
	for _, ps := range t.slices {
		if _, ok := ps[id]; ok {
			return true
		}
	}
	return false
}

// WatchEndpoints watches the EndpointSlices of the given Services until
// ctx ends, and calls gone for each Pod that stops being a ready
// endpoint (deleted, evicted, failing its readiness probe) and back when
// it is ready again, or once a gone Pod is listed by no slice at all (it
// was deleted: its name and address are free for other Pods, and the
// caller forgets it). The calls come one at a time.
func WatchEndpoints(ctx context.Context, o EndpointsOptions, gone, back func(Pod)) error {
	if err := o.Validate(); err != nil {
		return err
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Slices == nil {
		cfg, err := config(o.Kubeconfig)
		if err != nil {
			return err
		}
		c, err := discoveryclient.NewForConfig(cfg)
		if err != nil {
			return fmt.Errorf("kubernetes client: %w", err)
		}
		o.Slices = c
	}
	selector := fmt.Sprintf("%s in (%s)", discoveryv1.LabelServiceName, strings.Join(o.Services, ","))
	lw := &cache.ListWatch{
		ListWithContextFunc: func(ctx context.Context, opts metav1.ListOptions) (runtime.Object, error) {
			opts.LabelSelector = selector
			return o.Slices.EndpointSlices(o.Namespace).List(ctx, opts)
		},
		WatchFuncWithContext: func(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error) {
			opts.LabelSelector = selector
			return o.Slices.EndpointSlices(o.Namespace).Watch(ctx, opts)
		},
	}
	var mu sync.Mutex
	t := newPodTracker()
	apply := func(name string, s *discoveryv1.EndpointSlice) {
		mu.Lock()
		defer mu.Unlock()
		var now map[string]Pod
		if s != nil {
			now = ready(s)
		}
		g, b, d := t.set(name, now, listedIDs(s))
		for _, p := range g {
			o.Logger.Info("pod no longer a ready endpoint; its workers leave the registry", "pod", p.Name, "addresses", p.Addresses)
			gone(p)
		}
		for _, p := range b {
			o.Logger.Info("pod a ready endpoint again", "pod", p.Name, "addresses", p.Addresses)
			back(p)
		}
		for _, p := range d {
			// Deleted: its name (and IP, which a new Pod may get) is
			// no longer kept out.
			o.Logger.Debug("pod gone from every EndpointSlice; forgotten", "pod", p.Name, "addresses", p.Addresses)
			back(p)
		}
	}
	inf := cache.NewSharedIndexInformer(lw, &discoveryv1.EndpointSlice{}, 0, cache.Indexers{})
	_, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if s, ok := obj.(*discoveryv1.EndpointSlice); ok {
				apply(s.Name, s)
			}
		},
		UpdateFunc: func(_, obj any) {
			if s, ok := obj.(*discoveryv1.EndpointSlice); ok {
				apply(s.Name, s)
			}
		},
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if s, ok := obj.(*discoveryv1.EndpointSlice); ok {
				apply(s.Name, nil)
			}
		},
	})
	if err != nil {
		return fmt.Errorf("endpoints watch: %w", err)
	}
	inf.RunWithContext(ctx)
	if ctx.Err() == nil {
		return errors.New("endpoints watch stopped")
	}
	return nil
}
