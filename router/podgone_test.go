package router

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
)

func TestPodNameMatches(t *testing.T) {
	pod := PodName{Addresses: []string{"10.1.2.3"}, Hostname: "prism-embedding-0", Name: "prism-embedding-0"}
	dep := PodName{Addresses: []string{"10.1.2.9", "fd00::9"}, Name: "prism-dense-7c9f-abcde"}
	for _, c := range []struct {
		p    PodName
		addr string
		want bool
	}{
		{pod, "10.1.2.3:8501", true},
		{pod, "10.1.2.30:8501", false},
		{pod, "prism-embedding-0.prism-embedding:8501", true},
		{pod, "prism-embedding-0.prism-embedding.prism.svc.cluster.local:8501", true},
		{pod, "prism-embedding-1.prism-embedding:8501", false},
		{pod, "prism-embedding-0:8501", true},
		{dep, "[fd00::9]:8502", true},
		{dep, "[fd00:0:0::9]:8502", true},
		{dep, "[FD00::9]:8502", true},
		{dep, "[fd00::90]:8502", false},
		{PodName{Addresses: []string{"fd00:0::9"}}, "[fd00::9]:8502", true},
		{dep, "prism-dense-7c9f-abcde.prism-dense:8502", true},
		{dep, "10.1.2.3:8502", false},
		{PodName{}, "127.0.0.1:1", false},
		{PodName{Name: "a"}, "", false},
	} {
		if got := c.p.matches(c.addr); got != c.want {
			t.Errorf("%+v matches %q = %v, want %v", c.p, c.addr, got, c.want)
		}
	}
}

// A Pod gone removes its workers at once and keeps them out until its
// endpoint is ready again; other workers are not touched.
func TestPodGoneAndBack(t *testing.T) {
	reg := NewRegistry(time.Second, nil)
	announce := func(id, addr string) error {
		_, err := reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{
			Id: id, Role: prismv1.Role_ROLE_DENSE, Addr: addr, Models: []string{"m"}, Healthy: true}})
		return err
	}
	for id, addr := range map[string]string{"a": "prism-dense-a.prism-dense:8502", "b": "10.0.0.2:8502", "c": "192.168.1.1:8502"} {
		if err := announce(id, addr); err != nil {
			t.Fatal(err)
		}
	}
	pa := PodName{Addresses: []string{"10.0.0.1"}, Name: "prism-dense-a"}
	pb := PodName{Addresses: []string{"10.0.0.2"}, Name: "prism-dense-b"}
	if ids := reg.PodGone(pa); len(ids) != 1 || ids[0] != "a" {
		t.Fatalf("pod a gone removed %v", ids)
	}
	if ids := reg.PodGone(pb); len(ids) != 1 || ids[0] != "b" {
		t.Fatalf("pod b gone removed %v", ids)
	}
	if err := announce("a", "prism-dense-a.prism-dense:8502"); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("announce of a gone Pod's worker: %v, want FailedPrecondition", err)
	}
	if err := announce("c", "192.168.1.1:8502"); err != nil {
		t.Fatalf("a worker outside Kubernetes: %v", err)
	}
	reg.PodBack(pa)
	if err := announce("a", "prism-dense-a.prism-dense:8502"); err != nil {
		t.Fatalf("after the Pod is ready again: %v", err)
	}
	ws, _ := reg.List(context.Background(), nil)
	if n := len(ws.GetWorkers()); n != 2 {
		t.Fatalf("%d workers registered, want a and c", n)
	}
}
