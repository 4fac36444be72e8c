package kubelease

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	clientfeatures "k8s.io/client-go/features"
	clientfeaturestesting "k8s.io/client-go/features/testing"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// TestWatchEndpointsForgetsDeletedPods churns Pods through one
// EndpointSlice as a Deployment's rollouts and scale-downs do: each Pod
// is listed ready, turns terminating (gone: its workers leave the
// registry) and is then deleted (its endpoint leaves the slice), and
// the next Pod gets an IP an earlier one had. The Pods gone and never
// back are what the router keeps out (Registry.podsGone): a deleted Pod
// must leave that set, or it grows by every Pod ever deleted, and a new
// Pod at a reused IP is refused for ever when workers announce by IP.
func TestWatchEndpointsForgetsDeletedPods(t *testing.T) {
	// The fake clientset does not serve a watch-list (its initial events
	// end with no bookmark): the informer lists, then watches. Set on
	// client-go's gates, not as KUBE_FEATURE_WatchListClient: client-go
	// reads those variables once, at its first gate, and a test before
	// this one (TestElectionOnAPIServer, where kube-apiserver is built)
	// had read them, so the informer waited for a bookmark for ever.
	clientfeaturestesting.SetFeatureDuringTest(t, clientfeatures.WatchListClient, false)
	const cycles = 200
	yes := true
	cs := fake.NewSimpleClientset()
	watching := make(chan struct{})
	var once sync.Once
	cs.PrependWatchReactor("endpointslices", func(k8stesting.Action) (bool, watch.Interface, error) {
		once.Do(func() { close(watching) })
		return false, nil, nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	slices := cs.DiscoveryV1().EndpointSlices("default")
	keep := endpoint("dense-keep", "10.1.1.1", &yes, false)
	sl, err := slices.Create(ctx, slice("prism-dense-x1", keep), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	out := map[string]bool{} // gone and not back, by Pod name (the router's podsGone)
	gones := 0
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- WatchEndpoints(wctx, EndpointsOptions{Namespace: "default", Services: []string{"prism-dense"}, Slices: cs.DiscoveryV1(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil))},
			func(p Pod) { mu.Lock(); out[p.Name] = true; gones++; mu.Unlock() },
			func(p Pod) { mu.Lock(); delete(out, p.Name); mu.Unlock() })
	}()
	select {
	case <-watching:
	case <-ctx.Done():
		t.Fatal("the watch never started")
	}
	update := func(es ...discoveryv1.Endpoint) {
		t.Helper()
		sl.Endpoints = es
		var err error
		if sl, err = slices.Update(ctx, sl, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// The reactor runs as the informer asks for its watch, before the
	// fake tracker opens it: an update landing between the two is never
	// seen. A probe Pod turned terminating until one is reported gone
	// says the watch is open (a sleep of 100 ms assumed it); it is then
	// deleted and not counted.
	for probe := 0; ; probe++ {
		name := fmt.Sprintf("probe-%d", probe)
		update(keep, endpoint(name, "10.1.1.2", &yes, false))
		update(keep, endpoint(name, "10.1.1.2", &yes, true))
		reported := false
		for deadline := time.Now().Add(200 * time.Millisecond); !reported && time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			mu.Lock()
			reported = gones > 0
			mu.Unlock()
		}
		if reported {
			break
		}
		if ctx.Err() != nil {
			t.Fatal("the watch never reported the probe Pod gone")
		}
	}
	update(keep) // the probe deleted
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		mu.Lock()
		n := len(out)
		if n == 0 {
			gones = 0
		}
		mu.Unlock()
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the probe Pod, deleted, is still kept out")
		}
	}
	for i := range cycles {
		pod, ip := fmt.Sprintf("dense-%d", i), fmt.Sprintf("10.1.0.%d", 2+i%50) // IPs reused
		update(keep, endpoint(pod, ip, &yes, false))
		update(keep, endpoint(pod, ip, &yes, true)) // terminating: gone
		// The fake watch's channel is bounded: let the watch keep up.
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
			mu.Lock()
			n := gones
			mu.Unlock()
			if n == i+1 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("cycle %d: %s not reported gone", i, pod)
			}
		}
		update(keep) // deleted
	}
	update(keep) // one more event after the last deletion
	var left, seen int
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		mu.Lock()
		left, seen = len(out), gones
		mu.Unlock()
		if seen == cycles && left == 0 {
			break
		}
	}
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if seen != cycles {
		t.Fatalf("%d Pods reported gone, want %d", seen, cycles)
	}
	if left != 0 {
		t.Fatalf("after %d Pods deleted, %d are still kept out (gone, never forgotten), want 0", cycles, left)
	}
}
