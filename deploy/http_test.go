package deploy

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
)

// TestChartRouterHTTP: router.httpPort serves Recommend over HTTP/JSON
// (serve router --http-addr) on the router's pods, its Service (https
// with TLS) and through its NetworkPolicy; 0, the default, none of it.
func TestChartRouterHTTP(t *testing.T) {
	helm := helmBinary(t)
	for _, c := range []struct {
		name     string
		set      []string
		port     int32  // 0: off
		protocol string // the Service port's appProtocol
	}{
		{"off", nil, 0, ""},
		{"tls", []string{"router.httpPort=8501"}, 8501, "https"},
		{"plaintext", []string{"router.httpPort=8501", "tls.enabled=false"}, 8501, "http"},
	} {
		t.Run(c.name, func(t *testing.T) {
			args := append(slices.Clone(helmTemplate), "--set", "networkPolicy.enabled=true")
			for _, s := range c.set {
				args = append(args, "--set", s)
			}
			objs := decode(t, run(t, helm, args...))
			ctr := podSpecs(objs)["prism-router"].Spec.Containers[0]
			i := slices.Index(ctr.Args, "--http-addr")
			hasPort := slices.ContainsFunc(ctr.Ports, func(p corev1.ContainerPort) bool { return p.Name == "http" && p.ContainerPort == c.port })
			svc := find[*corev1.Service](t, objs, "Service", "prism-router")
			j := slices.IndexFunc(svc.Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == "http" })
			np := find[*networkingv1.NetworkPolicy](t, objs, "NetworkPolicy", "prism-router")
			allowed := false
			for _, r := range np.Spec.Ingress {
				for _, p := range r.Ports {
					allowed = allowed || p.Port != nil && p.Port.IntVal == c.port
				}
			}
			if c.port == 0 {
				if i >= 0 || j >= 0 || slices.ContainsFunc(ctr.Ports, func(p corev1.ContainerPort) bool { return p.Name == "http" }) {
					t.Errorf("httpPort 0: args %v, container ports %v, Service ports %v; want no HTTP/JSON", ctr.Args, ctr.Ports, svc.Spec.Ports)
				}
				return
			}
			if i < 0 || i+1 >= len(ctr.Args) || ctr.Args[i+1] != "0.0.0.0:8501" {
				t.Errorf("router args %v: want --http-addr 0.0.0.0:8501", ctr.Args)
			}
			if !hasPort {
				t.Errorf("router container ports %v: want http %d", ctr.Ports, c.port)
			}
			if j < 0 || svc.Spec.Ports[j].Port != c.port || svc.Spec.Ports[j].TargetPort.StrVal != "http" || svc.Spec.Ports[j].AppProtocol == nil || *svc.Spec.Ports[j].AppProtocol != c.protocol {
				t.Errorf("router Service ports %+v: want http %d to the container's http, appProtocol %s", svc.Spec.Ports, c.port, c.protocol)
			}
			if !allowed {
				t.Errorf("router NetworkPolicy %+v does not admit port %d", np.Spec.Ingress, c.port)
			}
		})
	}
}
