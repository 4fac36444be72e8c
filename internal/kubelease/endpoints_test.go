package kubelease

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	discoveryclient "k8s.io/client-go/kubernetes/typed/discovery/v1"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/prism-serve/prism/internal/kubetest"
)

func endpoint(pod, addr string, readyState *bool, terminating bool) discoveryv1.Endpoint {
	e := discoveryv1.Endpoint{Addresses: []string{addr}, TargetRef: &corev1.ObjectReference{Kind: "Pod", Name: pod}}
	e.Conditions.Ready = readyState
	if terminating {
		e.Conditions.Terminating = &terminating
	}
	return e
}

func slice(name string, es ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: name, Labels: map[string]string{discoveryv1.LabelServiceName: "prism-dense"}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Endpoints:   es,
	}
}

func names(ps []Pod) []string {
	var out []string
	for _, p := range ps {
		out = append(out, p.Name)
	}
	slices.Sort(out)
	return out
}

// The tracker, step by step: only a ready Pod that stops being ready
// anywhere is gone; it is back when ready again; a Pod ready in two
// slices (IPv4 and IPv6) is gone only when both drop it.
func TestPodTracker(t *testing.T) {
	yes, no := true, false
	tr := newPodTracker()
	type step struct {
		slice      string
		s          *discoveryv1.EndpointSlice // nil: deleted
		gone, back []string
	}
	for i, st := range []step{
		{"v4", slice("v4", endpoint("a", "10.0.0.1", &yes, false), endpoint("b", "10.0.0.2", nil, false), endpoint("c", "10.0.0.3", &no, false)), nil, nil},
		{"v6", slice("v6", endpoint("a", "fd00::1", &yes, false)), nil, nil},
		// b turns not ready; c (never ready) becomes ready: no transition for c.
		{"v4", slice("v4", endpoint("a", "10.0.0.1", &yes, false), endpoint("b", "10.0.0.2", &no, false), endpoint("c", "10.0.0.3", &yes, false)), []string{"b"}, nil},
		// a leaves the v4 slice but is still ready in v6.
		{"v4", slice("v4", endpoint("b", "10.0.0.2", &yes, false), endpoint("c", "10.0.0.3", &yes, true)), []string{"c"}, []string{"b"}},
		// the v6 slice goes: a is gone now.
		{"v6", nil, []string{"a"}, nil},
		{"v4", nil, []string{"b"}, nil},
	} {
		var ps map[string]Pod
		if st.s != nil {
			ps = ready(st.s)
		}
		gone, back, _ := tr.set(st.slice, ps, listedIDs(st.s))
		if !slices.Equal(names(gone), st.gone) || !slices.Equal(names(back), st.back) {
			t.Fatalf("step %d: gone %v back %v, want %v %v", i, names(gone), names(back), st.gone, st.back)
		}
	}
}

// TestPodTrackerPublishNotReady: the workers' Services (the chart's
// prism-embedding and prism-dense) publish not-ready addresses, so that a
// worker's DNS name resolves before it is ready. For such a Service the
// EndpointSlice controller writes ready: true whatever the Pod's
// readiness, and the Pod's readiness in serving (k8s.io/endpointslice
// podToEndpoint: ready = publishNotReadyAddresses || (serving &&
// !terminating)). A Pod failing its readiness probe is gone, then, by
// serving, and back when serving again; reading ready alone, it never left.
func TestPodTrackerPublishNotReady(t *testing.T) {
	yes, no := true, false
	ep := func(pod, addr string, serving bool) discoveryv1.Endpoint {
		e := endpoint(pod, addr, &yes, false)
		e.Conditions.Serving = &serving
		e.Conditions.Terminating = &no
		return e
	}
	tr := newPodTracker()
	for i, st := range []struct {
		s          *discoveryv1.EndpointSlice
		gone, back []string
	}{
		{slice("v4", ep("a", "10.0.0.1", true), ep("b", "10.0.0.2", true)), nil, nil},
		// b fails its readiness probe: still ready: true in the slice.
		{slice("v4", ep("a", "10.0.0.1", true), ep("b", "10.0.0.2", false)), []string{"b"}, nil},
		{slice("v4", ep("a", "10.0.0.1", true), ep("b", "10.0.0.2", true)), nil, []string{"b"}},
	} {
		gone, back, _ := tr.set("v4", ready(st.s), listedIDs(st.s))
		if !slices.Equal(names(gone), st.gone) || !slices.Equal(names(back), st.back) {
			t.Fatalf("step %d: gone %v back %v, want %v %v", i, names(gone), names(back), st.gone, st.back)
		}
	}
}

func TestParseServices(t *testing.T) {
	ns, svcs, err := ParseServices("prism/prism-embedding,prism-dense")
	if err != nil || ns != "prism" || !slices.Equal(svcs, []string{"prism-embedding", "prism-dense"}) {
		t.Fatalf("%q %v %v", ns, svcs, err)
	}
	for _, bad := range []string{"", "prism", "prism/", "/x", "prism/a,,b", "prism/a/b"} {
		if _, _, err := ParseServices(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// On a real API server (skipped without one): a Pod whose endpoint turns
// not ready is reported gone within moments, and back when ready again.
func TestWatchEndpointsOnAPIServer(t *testing.T) {
	s := kubetest.Start(t)
	cfg, err := clientcmd.BuildConfigFromFlags("", s.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	c, err := discoveryclient.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	yes, no := true, false
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	sl, err := c.EndpointSlices("default").Create(ctx, slice("prism-dense-x1", endpoint("dense-0", "10.1.0.1", &yes, false), endpoint("dense-1", "10.1.0.2", &yes, false)), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var events []string
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- WatchEndpoints(wctx, EndpointsOptions{Namespace: "default", Services: []string{"prism-dense"}, Slices: c},
			func(p Pod) { mu.Lock(); events = append(events, "gone "+p.Name); mu.Unlock() },
			func(p Pod) { mu.Lock(); events = append(events, "back "+p.Name); mu.Unlock() })
	}()
	waitFor := func(want []string) time.Duration {
		t.Helper()
		start := time.Now()
		for deadline := start.Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			mu.Lock()
			got := slices.Clone(events)
			mu.Unlock()
			if slices.Equal(got, want) {
				return time.Since(start)
			}
		}
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("events %v, want %v", events, want)
		return 0
	}
	time.Sleep(300 * time.Millisecond) // the initial list is no event
	sl.Endpoints[1].Conditions.Ready = &no
	if sl, err = c.EndpointSlices("default").Update(ctx, sl, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	took := waitFor([]string{"gone dense-1"})
	t.Logf("a Pod's endpoint turned not ready: reported gone after %v", took.Round(time.Millisecond))
	sl.Endpoints[1].Conditions.Ready = &yes
	if _, err = c.EndpointSlices("default").Update(ctx, sl, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor([]string{"gone dense-1", "back dense-1"})
	if err := c.EndpointSlices("default").Delete(ctx, sl.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor([]string{"gone dense-1", "back dense-1", "gone dense-0", "gone dense-1"})
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// TestPodTrackerForgetsDeleted: a gone Pod that no slice lists any more
// (deleted) is forgotten, at the first change after the one that made it
// gone, and the tracker holds nothing of it; a not-ready Pod still
// listed stays gone.
func TestPodTrackerForgetsDeleted(t *testing.T) {
	yes, no := true, false
	tr := newPodTracker()
	for i, st := range []struct {
		s                   *discoveryv1.EndpointSlice
		gone, back, deleted []string
	}{
		{slice("v4", endpoint("a", "10.0.0.1", &yes, false), endpoint("b", "10.0.0.2", &yes, false), endpoint("c", "10.0.0.3", &yes, false)), nil, nil, nil},
		// a terminates, b fails its probe, c is dropped at once.
		{slice("v4", endpoint("a", "10.0.0.1", &yes, true), endpoint("b", "10.0.0.2", &no, false)), []string{"a", "b", "c"}, nil, nil},
		// a is deleted; c, gone before, is listed nowhere: both forgotten.
		{slice("v4", endpoint("b", "10.0.0.2", &no, false)), nil, nil, []string{"a", "c"}},
		// b, not ready but listed, stays gone; d gets a's IP.
		{slice("v4", endpoint("b", "10.0.0.2", &no, false), endpoint("d", "10.0.0.1", &yes, false)), nil, nil, nil},
	} {
		gone, back, deleted := tr.set("v4", ready(st.s), listedIDs(st.s))
		if !slices.Equal(names(gone), st.gone) || !slices.Equal(names(back), st.back) || !slices.Equal(names(deleted), st.deleted) {
			t.Fatalf("step %d: gone %v back %v deleted %v, want %v %v %v", i, names(gone), names(back), names(deleted), st.gone, st.back, st.deleted)
		}
	}
	if len(tr.goneIDs) != 1 {
		t.Errorf("the tracker keeps %d gone Pods, want 1 (b)", len(tr.goneIDs))
	}
}

// TestPodTrackerSliceReplaced: the EndpointSlice controller moving a
// not-ready Pod to another slice (a slice deleted, then one created, as
// the watch delivers them) does not forget it: it is listed again at
// once, and stays gone. A Pod the deleted slice alone listed is
// forgotten at the next change.
func TestPodTrackerSliceReplaced(t *testing.T) {
	yes, no := true, false
	tr := newPodTracker()
	for i, st := range []struct {
		name                string
		s                   *discoveryv1.EndpointSlice
		gone, back, deleted []string
	}{
		{"old", slice("old", endpoint("a", "10.0.0.1", &yes, false), endpoint("b", "10.0.0.2", &yes, false)), nil, nil, nil},
		{"old", slice("old", endpoint("a", "10.0.0.1", &no, false), endpoint("b", "10.0.0.2", &no, false)), []string{"a", "b"}, nil, nil},
		// The controller replaces the slice: a moves, still not ready;
		// b's Pod was deleted meanwhile.
		{"old", nil, nil, nil, nil},
		{"new", slice("new", endpoint("a", "10.0.0.1", &no, false)), nil, nil, []string{"b"}},
		{"new", slice("new", endpoint("a", "10.0.0.1", &no, false), endpoint("c", "10.0.0.3", &yes, false)), nil, nil, nil},
	} {
		var ps map[string]Pod
		if st.s != nil {
			ps = ready(st.s)
		}
		gone, back, deleted := tr.set(st.name, ps, listedIDs(st.s))
		if !slices.Equal(names(gone), st.gone) || !slices.Equal(names(back), st.back) || !slices.Equal(names(deleted), st.deleted) {
			t.Fatalf("step %d: gone %v back %v deleted %v, want %v %v %v", i, names(gone), names(back), names(deleted), st.gone, st.back, st.deleted)
		}
	}
}

// TestPodTrackerDualStackAddresses: on a dual-stack cluster a Pod is an
// endpoint of two slices, one per family; the slices drop it one after
// the other. The gone Pod carries the addresses of both, in either
// order: the router removes the workers whose announced host is one of
// them (router.PodName), and a worker announcing its IPv4 address stayed
// registered when the IPv4 slice happened to drop the Pod first (the
// gone Pod named only its IPv6 address), and the other way round.
func TestPodTrackerDualStackAddresses(t *testing.T) {
	yes := true
	v4 := func(es ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice { return slice("v4", es...) }
	v6 := func(es ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
		s := slice("v6", es...)
		s.AddressType = discoveryv1.AddressTypeIPv6
		return s
	}
	for _, first := range []string{"v4", "v6"} {
		t.Run(first+" first", func(t *testing.T) {
			tr := newPodTracker()
			set := func(name string, s *discoveryv1.EndpointSlice) []Pod {
				var ps map[string]Pod
				if s != nil {
					ps = ready(s)
				}
				gone, _, _ := tr.set(name, ps, listedIDs(s))
				return gone
			}
			set("v4", v4(endpoint("a", "10.0.0.1", &yes, false), endpoint("b", "10.0.0.2", &yes, false)))
			set("v6", v6(endpoint("a", "fd00::1", &yes, false), endpoint("b", "fd00::2", &yes, false)))
			second := map[string]string{"v4": "v6", "v6": "v4"}[first]
			mk := map[string]func(...discoveryv1.Endpoint) *discoveryv1.EndpointSlice{"v4": v4, "v6": v6}
			addrs := map[string]map[string]string{"v4": {"b": "10.0.0.2"}, "v6": {"b": "fd00::2"}}
			if g := set(first, mk[first](endpoint("b", addrs[first]["b"], &yes, false))); len(g) != 0 {
				t.Fatalf("a left the %s slice only: gone %v", first, names(g))
			}
			g := set(second, mk[second](endpoint("b", addrs[second]["b"], &yes, false)))
			if len(g) != 1 || g[0].Name != "a" {
				t.Fatalf("gone %v, want [a]", names(g))
			}
			got := slices.Sorted(slices.Values(g[0].Addresses))
			if want := []string{"10.0.0.1", "fd00::1"}; !slices.Equal(got, want) {
				t.Fatalf("gone Pod a's addresses %v, want %v", got, want)
			}
			// b leaves both at once (both slices deleted): its addresses
			// too, and nothing is kept of a Pod no longer ready.
			set("v4", nil)
			g = set("v6", nil)
			if len(g) != 1 || !slices.Equal(slices.Sorted(slices.Values(g[0].Addresses)), []string{"10.0.0.2", "fd00::2"}) {
				t.Fatalf("b gone as %+v, want both its addresses", g)
			}
			if len(tr.addrs) != 0 {
				t.Fatalf("addresses kept of Pods no longer ready: %v", tr.addrs)
			}
		})
	}
}
