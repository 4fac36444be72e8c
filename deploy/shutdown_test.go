package deploy

import (
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// The drain bounds of the binary (internal/serve): a stopping tier lets
// its in-flight calls finish for the grace (serve.Options.ShutdownGrace,
// 10 s, the router's --shutdown-grace); a worker first leaves its
// routers (a Leave tried twice, 2 s each, after an Announce in flight
// of at most 2 s) and lingers (serve.DefaultLinger, 0.5 s). closeMargin
// is the rest: the metrics server's 1 s, the store's and batchers' close.
const (
	defaultGrace = 10 * time.Second
	workerLeave  = 6*time.Second + 500*time.Millisecond
	closeMargin  = 3 * time.Second
	// endpointsLag is the least a router pod waits (preStop) before it
	// stops taking connections: the endpoint removal that runs
	// concurrently with the termination must reach every node's proxy
	// first, or clients sent there meanwhile are refused.
	endpointsLag = 3 * time.Second
)

// checkShutdown checks that each workload's pods drain within their
// terminationGracePeriodSeconds (the kubelet kills them after it), and
// that the routers, reached through a Service, keep taking connections
// until their endpoints are gone.
func checkShutdown(t *testing.T, objs []object) {
	t.Helper()
	for name, p := range podSpecs(objs) {
		if !strings.HasPrefix(name, "prism-router") && !strings.HasPrefix(name, "prism-dense") && !strings.HasPrefix(name, "prism-embedding") {
			continue
		}
		c := p.Spec.Containers[0]
		preStop := preStopWait(t, name, c)
		grace := defaultGrace
		if i := slices.Index(c.Args, "--shutdown-grace"); i >= 0 && i+1 < len(c.Args) {
			d, err := time.ParseDuration(c.Args[i+1])
			if err != nil {
				t.Errorf("%s: --shutdown-grace %q: %v", name, c.Args[i+1], err)
			}
			grace = d
		}
		need := preStop + grace + closeMargin
		if !strings.HasPrefix(name, "prism-router") {
			need += workerLeave
		} else if preStop < endpointsLag {
			t.Errorf("%s: preStop waits %v before the router stops taking connections, want at least %v (clients the Service still sends there are refused)", name, preStop, endpointsLag)
		}
		tgp := 30 * time.Second // the API's default
		if s := p.Spec.TerminationGracePeriodSeconds; s != nil {
			tgp = time.Duration(*s) * time.Second
		}
		if tgp < need {
			t.Errorf("%s: terminationGracePeriodSeconds %v, want at least %v (preStop %v, drain grace %v, leave and close)", name, tgp, need, preStop, grace)
		}
	}
}

// preStopWait is how long c's preStop hook waits: a sleep action, or an
// exec of sleep N; 0 without one.
func preStopWait(t *testing.T, name string, c corev1.Container) time.Duration {
	t.Helper()
	if c.Lifecycle == nil || c.Lifecycle.PreStop == nil {
		return 0
	}
	h := c.Lifecycle.PreStop
	switch {
	case h.Sleep != nil:
		return time.Duration(h.Sleep.Seconds) * time.Second
	case h.Exec != nil && len(h.Exec.Command) == 2 && h.Exec.Command[0] == "sleep":
		n, err := strconv.Atoi(h.Exec.Command[1])
		if err != nil {
			t.Errorf("%s: preStop %v: %v", name, h.Exec.Command, err)
		}
		return time.Duration(n) * time.Second
	}
	t.Errorf("%s: preStop %+v: want a sleep", name, h)
	return 0
}
