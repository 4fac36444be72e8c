package deploy

import (
	"net"
	"regexp"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

// TestChartPodIPAddresses: with workers.advertiseDNS=false the tiers
// bind and announce their pod's IP (status.podIP), which on an
// IPv6-only cluster, or a dual-stack one whose first family is IPv6, is
// an IPv6 address. Every address the chart builds from it (the workers'
// and the router's --addr and --advertise-addr, the exec probes'
// grpc_health_probe -addr) must be a HOST:PORT whose host is that IP
// once Kubernetes (args) or the shell (probes) expands it: written
// $(POD_IP):PORT, an IPv6 pod IP made fd00::7:8502, which no listener,
// dialler or router takes (too many colons), and the pods never served.
func TestChartPodIPAddresses(t *testing.T) {
	helm := helmBinary(t)
	probeAddr := regexp.MustCompile(`-addr="?([^"\s]+)"?`)
	for _, tls := range []string{"true", "false"} {
		args := append(slices.Clone(helmTemplate), "--set", "workers.advertiseDNS=false", "--set", "tls.enabled="+tls, "--set", "loan.enabled=true", "--set", "loan.pool.nodeSelector.pool=training")
		objs := decode(t, run(t, helm, args...))
		for _, ip := range []string{"10.1.2.3", "fd00::7"} {
			expand := strings.NewReplacer("$(POD_IP)", ip, "${POD_IP}", ip, "$POD_IP", ip)
			check := func(where, addr string) {
				if !strings.Contains(addr, "POD_IP") {
					return
				}
				got := expand.Replace(addr)
				host, _, err := net.SplitHostPort(got)
				if err != nil || host != ip {
					t.Errorf("tls=%s, pod IP %s: %s: %q expands to %q (host %q, %v), want the pod IP and a port", tls, ip, where, addr, got, host, err)
				}
			}
			n := 0
			for name, p := range podSpecs(objs) {
				for _, c := range append(slices.Clone(p.Spec.InitContainers), p.Spec.Containers...) {
					where := name + "/" + c.Name
					for i, a := range c.Args {
						if (a == "--addr" || a == "--advertise-addr") && i+1 < len(c.Args) {
							check(where+" "+a, c.Args[i+1])
							n++
						}
					}
					for _, pr := range []*corev1.Probe{c.ReadinessProbe, c.LivenessProbe, c.StartupProbe} {
						if pr == nil || pr.Exec == nil {
							continue
						}
						for _, m := range probeAddr.FindAllStringSubmatch(strings.Join(pr.Exec.Command, " "), -1) {
							check(where+" probe -addr", m[1])
						}
					}
				}
			}
			if n == 0 {
				t.Fatalf("tls=%s: no --addr rendered", tls)
			}
		}
	}
}
