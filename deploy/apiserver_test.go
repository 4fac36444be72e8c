package deploy

import (
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/prism-serve/prism/internal/kubetest"
)

// TestManifestsOnAPIServer applies deploy/manifests to a real API server
// (internal/kubetest: etcd and kube-apiserver; skipped without them):
// first with --dry-run=server (validation and admission by the server,
// against the API's own schema), then for real, and reads the workloads
// back. The chart's MIG, plaintext and sharded embedding variants go
// through a server-side dry run too.
func TestManifestsOnAPIServer(t *testing.T) {
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		t.Skip("kubectl not found: the manifests are not applied to an API server")
	}
	s := kubetest.Start(t)
	k := func(args ...string) string {
		t.Helper()
		return string(run(t, kubectl, append([]string{"--kubeconfig", s.Kubeconfig}, args...)...))
	}
	// A server dry run creates nothing, so the namespace goes first.
	k("apply", "-f", "manifests/namespace.yaml")
	out := k("apply", "-k", "manifests", "--dry-run=server")
	if !strings.Contains(out, "(server dry run)") {
		t.Fatalf("server dry run: %s", out)
	}
	k("apply", "-k", "manifests")
	got := strings.Fields(k("get", "-n", "prism", "deployments,statefulsets,services,horizontalpodautoscalers,poddisruptionbudgets,networkpolicies", "-o", "name"))
	slices.Sort(got)
	for _, want := range []string{
		"statefulset.apps/prism-router", "statefulset.apps/prism-dense", "statefulset.apps/prism-embedding",
		"service/prism-router", "horizontalpodautoscaler.autoscaling/prism-router",
	} {
		if !slices.Contains(got, want) {
			t.Errorf("after apply, %s is missing; the server has %v", want, got)
		}
	}
	// What the server keeps is what the manifests say: kubectl diff
	// (a server-side dry run of the apply, compared with the live
	// objects) finds no difference (exit 0; 1 means differences).
	if diff, err := exec.Command(kubectl, "--kubeconfig", s.Kubeconfig, "diff", "-k", "manifests").CombinedOutput(); err != nil {
		t.Errorf("kubectl diff after apply: %v\n%s", err, diff)
	}
	helm := helmBinary(t)
	for _, set := range [][]string{
		{"dense.gpu.resource=nvidia.com/mig-1g.10gb", "dense.replicas=7"},
		{"tls.enabled=false"},
		// A sharded embedding tier: a StatefulSet and a
		// PodDisruptionBudget per shard (minAvailable with one replica).
		{"embedding.shards=2"},
		{"embedding.shards=3", "embedding.replicas=1"},
	} {
		args := slices.Clone(helmTemplate)
		for _, v := range set {
			args = append(args, "--set", v)
		}
		rendered := run(t, helm, args...)
		cmd := exec.Command(kubectl, "--kubeconfig", s.Kubeconfig, "apply", "-n", "prism", "--dry-run=server", "-f", "-")
		cmd.Stdin = strings.NewReader(string(rendered))
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("variant %v, server dry run: %v\n%s", set, err, out)
		}
	}
	// The sharded tier for real, in a namespace of its own: each shard's
	// StatefulSet and PodDisruptionBudget beside the tier's one Service.
	const sharded = "prism-sharded"
	k("create", "namespace", sharded)
	cmd := exec.Command(kubectl, "--kubeconfig", s.Kubeconfig, "apply", "-n", sharded, "-f", "-")
	cmd.Stdin = strings.NewReader(string(run(t, helm, "template", "prism", chartDir, "--namespace", sharded, "--set", "embedding.shards=2")))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("sharded variant, apply: %v\n%s", err, out)
	}
	got = strings.Fields(k("get", "-n", sharded, "statefulsets,services,poddisruptionbudgets", "-o", "name", "-l", "app.kubernetes.io/component=embedding"))
	slices.Sort(got)
	want := []string{
		"poddisruptionbudget.policy/prism-embedding-shard-0", "poddisruptionbudget.policy/prism-embedding-shard-1",
		"service/prism-embedding",
		"statefulset.apps/prism-embedding-shard-0", "statefulset.apps/prism-embedding-shard-1",
	}
	if !slices.Equal(got, want) {
		t.Errorf("sharded variant: the embedding tier's objects on the server are %v, want %v", got, want)
	}
}
