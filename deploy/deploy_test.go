package deploy

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"
)

const (
	chartDir   = "helm/prism"
	rendered   = "manifests/prism.yaml"
	namespace  = "prism"
	regenerate = "make manifests"
)

// helmTemplate is how `make manifests` renders the chart (keep the two
// in step).
var helmTemplate = []string{"template", "prism", chartDir, "--namespace", namespace}

// wantKinds are the objects the chart renders with its default values.
var wantKinds = map[string]int{
	"StatefulSet": 3, "Service": 4, "HorizontalPodAutoscaler": 1,
	"PodDisruptionBudget": 3, "NetworkPolicy": 3,
	// The routers' identity and its right to the sequencing Lease.
	"ServiceAccount": 1, "Role": 1, "RoleBinding": 1,
}

// object is one decoded manifest document.
type object struct {
	Kind, Name string
	Obj        any
}

// decode splits a YAML stream into documents and decodes each strictly
// (unknown or misspelt fields fail) into its Kubernetes API type.
func decode(t *testing.T, stream []byte) []object {
	t.Helper()
	var objs []object
	for i, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(stream), -1) {
		if strings.TrimSpace(stripComments(doc)) == "" {
			continue
		}
		var meta struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
			Metadata   struct {
				Name string `json:"name"`
			} `json:"metadata"`
		}
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			t.Fatalf("document %d: %v", i, err)
		}
		var obj any
		switch meta.APIVersion + " " + meta.Kind {
		case "apps/v1 Deployment":
			obj = &appsv1.Deployment{}
		case "apps/v1 StatefulSet":
			obj = &appsv1.StatefulSet{}
		case "v1 Service":
			obj = &corev1.Service{}
		case "v1 Namespace":
			obj = &corev1.Namespace{}
		case "v1 ConfigMap":
			obj = &corev1.ConfigMap{}
		case "autoscaling/v2 HorizontalPodAutoscaler":
			obj = &autoscalingv2.HorizontalPodAutoscaler{}
		case "policy/v1 PodDisruptionBudget":
			obj = &policyv1.PodDisruptionBudget{}
		case "networking.k8s.io/v1 NetworkPolicy":
			obj = &networkingv1.NetworkPolicy{}
		case "v1 ServiceAccount":
			obj = &corev1.ServiceAccount{}
		case "rbac.authorization.k8s.io/v1 Role":
			obj = &rbacv1.Role{}
		case "rbac.authorization.k8s.io/v1 RoleBinding":
			obj = &rbacv1.RoleBinding{}
		case "rbac.authorization.k8s.io/v1 ClusterRole":
			obj = &rbacv1.ClusterRole{}
		case "rbac.authorization.k8s.io/v1 ClusterRoleBinding":
			obj = &rbacv1.ClusterRoleBinding{}
		case "scheduling.k8s.io/v1 PriorityClass":
			obj = &schedulingv1.PriorityClass{}
		default:
			t.Fatalf("document %d (%s): unexpected %s %s", i, meta.Metadata.Name, meta.APIVersion, meta.Kind)
		}
		if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
			t.Fatalf("%s %s: %v", meta.Kind, meta.Metadata.Name, err)
		}
		objs = append(objs, object{Kind: meta.Kind, Name: meta.Metadata.Name, Obj: obj})
	}
	return objs
}

func stripComments(doc string) string {
	var b strings.Builder
	for line := range strings.Lines(doc) {
		if !strings.HasPrefix(strings.TrimSpace(line), "#") {
			b.WriteString(line)
		}
	}
	return b.String()
}

func readRendered(t *testing.T) []object {
	t.Helper()
	b, err := os.ReadFile(rendered)
	if err != nil {
		t.Fatalf("%v (regenerate: %s)", err, regenerate)
	}
	return decode(t, b)
}

// podSpecs are the pod templates of the workloads, by workload name.
func podSpecs(objs []object) map[string]*corev1.PodTemplateSpec {
	pods := map[string]*corev1.PodTemplateSpec{}
	for _, o := range objs {
		switch w := o.Obj.(type) {
		case *appsv1.Deployment:
			pods[o.Name] = &w.Spec.Template
		case *appsv1.StatefulSet:
			pods[o.Name] = &w.Spec.Template
		}
	}
	return pods
}

func find[T any](t *testing.T, objs []object, kind, name string) T {
	t.Helper()
	for _, o := range objs {
		if o.Kind == kind && o.Name == name {
			return o.Obj.(T)
		}
	}
	t.Fatalf("no %s %s", kind, name)
	var zero T
	return zero
}

func TestManifestsDecode(t *testing.T) {
	objs := readRendered(t)
	got := map[string]int{}
	for _, o := range objs {
		got[o.Kind]++
	}
	for k, n := range wantKinds {
		if got[k] != n {
			t.Errorf("%d %s objects, want %d", got[k], k, n)
		}
	}
	if len(got) != len(wantKinds) {
		t.Errorf("kinds %v, want %v", got, wantKinds)
	}
	for _, o := range objs {
		if ns := o.Obj.(interface{ GetNamespace() string }).GetNamespace(); ns != namespace {
			t.Errorf("%s %s in namespace %q, want %q", o.Kind, o.Name, ns, namespace)
		}
	}
	checkWorkloads(t, objs)
}

// checkWorkloads checks what the issue asks of each tier in objs.
func checkWorkloads(t *testing.T, objs []object) {
	t.Helper()
	pods := podSpecs(objs)
	checkShutdown(t, objs)
	embedding := embeddingWorkloads(objs)
	if len(embedding) == 0 {
		t.Errorf("no embedding workload (prism-embedding or prism-embedding-shard-K)")
	}
	for _, name := range append([]string{"prism-router", "prism-dense"}, embedding...) {
		p, ok := pods[name]
		if !ok {
			t.Errorf("no workload %s", name)
			continue
		}
		c := p.Spec.Containers[0]
		if c.ReadinessProbe == nil || c.LivenessProbe == nil {
			t.Errorf("%s: readiness and liveness probes wanted", name)
		}
		if c.ReadinessProbe != nil && c.ReadinessProbe.GRPC == nil && (c.ReadinessProbe.Exec == nil || !strings.Contains(strings.Join(c.ReadinessProbe.Exec.Command, " "), "grpc_health_probe")) {
			t.Errorf("%s: readiness is not a gRPC health check: %+v", name, c.ReadinessProbe.ProbeHandler)
		}
		var metricsPort int32
		for _, port := range c.Ports {
			if port.Name == "metrics" {
				metricsPort = port.ContainerPort
			}
		}
		a := p.Annotations
		if a["prometheus.io/scrape"] != "true" || a["prometheus.io/port"] != fmt.Sprint(metricsPort) || metricsPort == 0 {
			t.Errorf("%s: scrape annotations %v for metrics port %d", name, a, metricsPort)
		}
		if c.Resources.Requests.Cpu().IsZero() || c.Resources.Requests.Memory().IsZero() {
			t.Errorf("%s: no CPU or memory request", name)
		}
		if sc := p.Spec.SecurityContext; sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot {
			t.Errorf("%s: not run as non-root", name)
		}
		checkEnvRefs(t, name, p.Spec)
	}
	if t.Failed() {
		return
	}
	for _, name := range embedding {
		emb := find[*appsv1.StatefulSet](t, objs, "StatefulSet", name)
		if len(emb.Spec.VolumeClaimTemplates) != 1 {
			t.Errorf("%s: %d volume claim templates, want 1 (the Pebble store)", name, len(emb.Spec.VolumeClaimTemplates))
		}
		if init := ingestSteps(emb.Spec.Template.Spec.InitContainers); len(init) == 0 || !strings.Contains(strings.Join(init[0].Command, " "), "prism ingest") {
			t.Errorf("%s: no init step running prism ingest: %+v", name, init)
		}
		// Before it, the seed step: a new replica copies a serving
		// worker's store (prism store copy --seed).
		if init := emb.Spec.Template.Spec.InitContainers; len(init) == 0 || init[0].Name != "seed" || !strings.Contains(strings.Join(init[0].Command, " "), "prism store copy --router") || !slices.Contains(init[0].Command, "--seed") {
			t.Errorf("%s: the first init step is not the seed (prism store copy --router ... --seed): %+v", name, init)
		}
		if emb.Spec.Template.Spec.Containers[0].StartupProbe == nil {
			t.Errorf("%s: no startup probe to wait out the hot tier's preload", name)
		}
	}
	dense := pods["prism-dense"].Spec.Containers[0].Resources
	var gpu []string
	for r := range dense.Limits {
		if r == "nvidia.com/gpu" || strings.HasPrefix(string(r), "nvidia.com/mig-") {
			gpu = append(gpu, string(r))
			if dense.Requests[r] != dense.Limits[r] {
				t.Errorf("dense: %s request %v, limit %v", r, dense.Requests[r], dense.Limits[r])
			}
		}
	}
	if len(gpu) != 1 {
		t.Errorf("dense: GPU resources %v, want one of nvidia.com/gpu or nvidia.com/mig-*", gpu)
	}
	hpa := find[*autoscalingv2.HorizontalPodAutoscaler](t, objs, "HorizontalPodAutoscaler", "prism-router")
	if hpa.Spec.ScaleTargetRef.Name != "prism-router" || len(hpa.Spec.Metrics) != 1 || hpa.Spec.Metrics[0].Resource.Name != corev1.ResourceCPU {
		t.Errorf("router HPA: %+v", hpa.Spec)
	}
	if hpa.Spec.MaxReplicas < 2 {
		t.Errorf("router HPA: maxReplicas %d: several routers elect their update sequencer, so more than one", hpa.Spec.MaxReplicas)
	}
	checkSequencerLease(t, objs, pods["prism-router"].Spec)
	checkRouterRollout(t, objs)
	// The internal ports admit Prism's own pods only.
	for _, name := range []string{"prism-embedding", "prism-dense"} {
		np := find[*networkingv1.NetworkPolicy](t, objs, "NetworkPolicy", name)
		workload := name
		if name == "prism-embedding" {
			workload = embedding[0]
		}
		grpc := pods[workload].Spec.Containers[0].Ports[0].ContainerPort
		for _, rule := range np.Spec.Ingress {
			if len(rule.Ports) == 1 && rule.Ports[0].Port.IntValue() == int(grpc) {
				if len(rule.From) != 1 || rule.From[0].PodSelector == nil || rule.From[0].NamespaceSelector != nil ||
					rule.From[0].PodSelector.MatchLabels["app.kubernetes.io/instance"] == "" {
					t.Errorf("%s: gRPC port %d open to %+v, want Prism's pods only", name, grpc, rule.From)
				}
				grpc = -1
			}
		}
		if grpc != -1 {
			t.Errorf("%s: no ingress rule for the gRPC port", name)
		}
	}
}

// embeddingWorkloads are the names of the embedding tier's StatefulSets:
// prism-embedding, or prism-embedding-shard-K for a sharded tier, in
// shard order.
func embeddingWorkloads(objs []object) []string {
	var names []string
	for _, o := range objs {
		if o.Kind == "StatefulSet" && (o.Name == "prism-embedding" || strings.HasPrefix(o.Name, "prism-embedding-shard-")) {
			names = append(names, o.Name)
		}
	}
	return names
}

// selects says whether the label selector sel matches the labels of pod.
func selects(t *testing.T, sel *metav1.LabelSelector, pod map[string]string) bool {
	t.Helper()
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		t.Fatalf("selector %+v: %v", sel, err)
	}
	return !s.Empty() && s.Matches(labels.Set(pod))
}

// checkShards checks a sharded embedding tier of shards shards with
// replicas pods each: one StatefulSet per shard, prism-embedding-shard-K,
// whose init step ingests shard K (prism ingest --shard K) into its
// pod's own store and whose pods carry their shard's label; all of them
// behind the tier's headless Service (their DNS names, the routers'
// --watch-endpoints) and NetworkPolicy; and one PodDisruptionBudget per
// shard, selecting that shard's pods only, that keeps one of them.
func checkShards(t *testing.T, objs []object, shards, replicas int) {
	t.Helper()
	var want []string
	for k := range shards {
		want = append(want, fmt.Sprintf("prism-embedding-shard-%d", k))
	}
	if got := embeddingWorkloads(objs); !slices.Equal(got, want) {
		t.Fatalf("embedding StatefulSets %v, want %v", got, want)
	}
	svc := find[*corev1.Service](t, objs, "Service", "prism-embedding")
	np := find[*networkingv1.NetworkPolicy](t, objs, "NetworkPolicy", "prism-embedding")
	router := podSpecs(objs)["prism-router"].Spec.Containers[0].Args
	if i := slices.Index(router, "--watch-endpoints"); i >= 0 && !slices.Contains(strings.Split(strings.TrimPrefix(router[i+1], namespace+"/"), ","), svc.Name) {
		t.Errorf("router: --watch-endpoints %s does not name the embedding Service %s", router[i+1], svc.Name)
	}
	var pods []map[string]string
	for k, name := range want {
		sts := find[*appsv1.StatefulSet](t, objs, "StatefulSet", name)
		pod := sts.Spec.Template.Labels
		pods = append(pods, pod)
		if sts.Spec.Replicas == nil || int(*sts.Spec.Replicas) != replicas {
			t.Errorf("%s: replicas %v, want %d (embedding.replicas, per shard)", name, sts.Spec.Replicas, replicas)
		}
		if sts.Spec.ServiceName != svc.Name {
			t.Errorf("%s: serviceName %q, want the tier's headless Service %s (the pods' DNS names)", name, sts.Spec.ServiceName, svc.Name)
		}
		if !selects(t, sts.Spec.Selector, pod) {
			t.Errorf("%s: selector %+v does not select its pods %v", name, sts.Spec.Selector, pod)
		}
		if !selects(t, &metav1.LabelSelector{MatchLabels: svc.Spec.Selector}, pod) {
			t.Errorf("Service %s does not select %s's pods %v", svc.Name, name, pod)
		}
		if !selects(t, &np.Spec.PodSelector, pod) {
			t.Errorf("NetworkPolicy %s does not select %s's pods %v", np.Name, name, pod)
		}
		init := sts.Spec.Template.Spec.InitContainers
		var ingests int
		for _, c := range init {
			for _, argv := range containerCommandLines(c) {
				if argv[0] != "ingest" {
					continue
				}
				ingests++
				if i := slices.Index(argv, "--shard"); i < 0 || i+1 >= len(argv) || argv[i+1] != fmt.Sprint(k) {
					t.Errorf("%s/%s: prism %s: want --shard %d", name, c.Name, strings.Join(argv, " "), k)
				}
			}
		}
		if ingests == 0 {
			t.Errorf("%s: no init step running prism ingest --shard %d", name, k)
		}
	}
	for k, name := range want {
		pdb := find[*policyv1.PodDisruptionBudget](t, objs, "PodDisruptionBudget", name)
		for j, pod := range pods {
			if got := selects(t, pdb.Spec.Selector, pod); got != (j == k) {
				t.Errorf("PodDisruptionBudget %s selects shard %d's pods: %v, want %v", name, j, got, j == k)
			}
		}
		switch s := pdb.Spec; {
		case s.MinAvailable != nil && s.MaxUnavailable == nil:
			if s.MinAvailable.IntValue() < 1 {
				t.Errorf("PodDisruptionBudget %s: minAvailable %v lets every replica of the shard go", name, s.MinAvailable)
			}
		case s.MaxUnavailable != nil && s.MinAvailable == nil:
			if n, err := intstr.GetScaledValueFromIntOrPercent(s.MaxUnavailable, replicas, true); err != nil || n >= replicas {
				t.Errorf("PodDisruptionBudget %s: maxUnavailable %v of %d replicas lets every replica of the shard go", name, s.MaxUnavailable, replicas)
			}
		default:
			t.Errorf("PodDisruptionBudget %s: want one of minAvailable and maxUnavailable: %+v", name, s)
		}
	}
	for _, o := range objs {
		if o.Name == "prism-embedding" && (o.Kind == "StatefulSet" || o.Kind == "PodDisruptionBudget") {
			t.Errorf("sharded tier: an unsharded %s %s too", o.Kind, o.Name)
		}
	}
}

// checkSequencerLease checks that the routers elect their update
// sequencer through a Lease they may get, create and update in their
// namespace, under the identity of their ServiceAccount, at an address
// the other routers dial.
func checkSequencerLease(t *testing.T, objs []object, router corev1.PodSpec) {
	t.Helper()
	args := router.Containers[0].Args
	i := slices.Index(args, "--sequencer-lease")
	if i < 0 || i+1 >= len(args) {
		t.Errorf("router: no --sequencer-lease in %v", args)
		return
	}
	ns, lease, _ := strings.Cut(args[i+1], "/")
	if ns != namespace || lease == "" {
		t.Errorf("router: --sequencer-lease %q, want %s/NAME", args[i+1], namespace)
	}
	if j := slices.Index(args, "--advertise-addr"); j < 0 || j+1 >= len(args) || !strings.HasSuffix(args[j+1], ":8500") {
		t.Errorf("router: --advertise-addr missing or not at the gRPC port: %v", args)
	}
	if slices.Contains(args, "--update-log-dir") {
		t.Errorf("router: an elected router keeps no update log dir: %v", args)
	}
	sa := find[*corev1.ServiceAccount](t, objs, "ServiceAccount", router.ServiceAccountName)
	role := find[*rbacv1.Role](t, objs, "Role", "prism-router-sequencer-lease")
	binding := find[*rbacv1.RoleBinding](t, objs, "RoleBinding", "prism-router-sequencer-lease")
	if t.Failed() {
		return
	}
	if binding.RoleRef.Kind != "Role" || binding.RoleRef.Name != role.Name || len(binding.Subjects) != 1 ||
		binding.Subjects[0].Kind != "ServiceAccount" || binding.Subjects[0].Name != sa.Name || binding.Subjects[0].Namespace != namespace {
		t.Errorf("router: the RoleBinding does not give Role %s to ServiceAccount %s: %+v %+v", role.Name, sa.Name, binding.RoleRef, binding.Subjects)
	}
	granted := map[string]bool{}
	watches := slices.Contains(args, "--watch-endpoints")
	for _, r := range role.Rules {
		if watches && slices.Equal(r.APIGroups, []string{"discovery.k8s.io"}) && slices.Equal(r.Resources, []string{"endpointslices"}) &&
			slices.Equal(r.Verbs, []string{"list", "watch"}) {
			granted["endpointslices"] = true
			continue
		}
		if !slices.Equal(r.APIGroups, []string{"coordination.k8s.io"}) || !slices.Equal(r.Resources, []string{"leases"}) {
			t.Errorf("router: the Role grants more than Leases and reading EndpointSlices: %+v", r)
			continue
		}
		for _, v := range r.Verbs {
			if len(r.ResourceNames) > 0 && !slices.Contains(r.ResourceNames, lease) {
				continue
			}
			granted[v] = true
		}
	}
	for _, v := range []string{"get", "create", "update"} {
		if !granted[v] {
			t.Errorf("router: the Role does not grant %s on Lease %s: %+v", v, lease, role.Rules)
		}
	}
	if watches && !granted["endpointslices"] {
		t.Errorf("router: --watch-endpoints without list and watch on EndpointSlices: %+v", role.Rules)
	}
}

// checkRouterRollout checks how the router StatefulSet rolls out: a new
// router counts as available only after a few heartbeats (the default
// --heartbeat, 1 s), time for the workers to register with it before
// the old one goes; and a router with its own update log (no sequencer
// Lease) is one router, never run beside another (a StatefulSet's
// rolling update stops a pod before it starts its successor), so two
// routers never number updates at once. Its pods' hostnames under the
// headless Service are the names routers dial each other by.
func checkRouterRollout(t *testing.T, objs []object) {
	t.Helper()
	d := find[*appsv1.StatefulSet](t, objs, "StatefulSet", "prism-router")
	if d == nil {
		return
	}
	if d.Spec.ServiceName != "prism-router-headless" {
		t.Errorf("router: serviceName %q, want the headless Service (pods' DNS names)", d.Spec.ServiceName)
	}
	// A router is ready (health SERVING) only once workers announced to
	// it, so the workers must find it before: by the headless Service's
	// not-ready addresses; and the liveness probe must wait for it.
	headless := find[*corev1.Service](t, objs, "Service", d.Spec.ServiceName)
	if headless != nil && !headless.Spec.PublishNotReadyAddresses {
		t.Errorf("router: Service %s publishes ready routers only, but a router gets ready only once workers found it there: a new router in a rollout or scale-up serves with an empty registry until its announce window ends", headless.Name)
	}
	if c := d.Spec.Template.Spec.Containers[0]; c.StartupProbe == nil || c.StartupProbe.PeriodSeconds*c.StartupProbe.FailureThreshold < 60 {
		t.Errorf("router: startup probe %+v: want one allowing a minute at least for workers to announce (the liveness probe would kill a router waiting for them)", c.StartupProbe)
	}
	const heartbeats = 3
	if d.Spec.MinReadySeconds < heartbeats {
		t.Errorf("router: minReadySeconds %d, want at least %d (heartbeats for the workers to register)", d.Spec.MinReadySeconds, heartbeats)
	}
	if slices.Contains(d.Spec.Template.Spec.Containers[0].Args, "--sequencer-lease") {
		return
	}
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 1 || d.Spec.UpdateStrategy.Type == appsv1.OnDeleteStatefulSetStrategyType {
		t.Errorf("router without a sequencer Lease: replicas %v, update strategy %+v; want one router, replaced by a rolling update", d.Spec.Replicas, d.Spec.UpdateStrategy)
	}
	for _, o := range objs {
		if o.Kind == "HorizontalPodAutoscaler" && o.Name == "prism-router" {
			t.Errorf("router without a sequencer Lease: an HPA would run several, each numbering updates")
		}
	}
}

// checkEnvRefs checks that every $(VAR) in a container's args names one
// of its environment variables (Kubernetes leaves unknown ones as they
// are, which prism would then take literally).
func checkEnvRefs(t *testing.T, workload string, spec corev1.PodSpec) {
	t.Helper()
	ref := regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)
	for _, c := range append(slices.Clone(spec.InitContainers), spec.Containers...) {
		env := map[string]bool{}
		for _, e := range c.Env {
			env[e.Name] = true
		}
		for _, a := range append(slices.Clone(c.Command), c.Args...) {
			for _, m := range ref.FindAllStringSubmatch(a, -1) {
				if !env[m[1]] {
					t.Errorf("%s/%s: %s names no environment variable of the container", workload, c.Name, m[0])
				}
			}
		}
	}
}

// knownCommands are the prism subcommands the chart runs.
var knownCommands = [][]string{{"serve", "router"}, {"serve", "embedding"}, {"serve", "dense"}, {"ingest"}, {"store", "versions"}, {"store", "copy"}, {"loan"}}

// commandLines returns every prism command line of the workloads: a
// container's args (the image's entrypoint is prism) and the prism
// commands of `sh -c` scripts.
func commandLines(objs []object) map[string][][]string {
	lines := map[string][][]string{}
	for name, p := range podSpecs(objs) {
		for _, c := range append(slices.Clone(p.Spec.InitContainers), p.Spec.Containers...) {
			where := name + "/" + c.Name
			lines[where] = append(lines[where], containerCommandLines(c)...)
		}
	}
	return lines
}

// containerCommandLines are the prism command lines of one container.
func containerCommandLines(c corev1.Container) [][]string {
	var lines [][]string
	switch {
	case len(c.Command) == 0:
		lines = append(lines, c.Args)
	case len(c.Command) == 3 && c.Command[0] == "sh" && c.Command[1] == "-c":
		for _, seg := range regexp.MustCompile(`\|\||&&|;|\|`).Split(c.Command[2], -1) {
			f := strings.Fields(seg)
			// A command of a { list; } or after exec.
			for len(f) > 0 && (f[0] == "{" || f[0] == "exec") {
				f = f[1:]
			}
			if len(f) == 0 || f[0] != "prism" {
				continue
			}
			f = slices.DeleteFunc(f[1:], func(s string) bool { return strings.Contains(s, ">") })
			lines = append(lines, f)
		}
	case c.Command[0] == "prism":
		lines = append(lines, append(slices.Clone(c.Command[1:]), c.Args...))
	}
	return lines
}

// prismBinary is the binary the command lines are checked against:
// $PRISM_BIN, else one built from this checkout once per run (go build,
// from the build cache when the tests built it already), so a fresh
// clone's `make test` checks them too.
func prismBinary(t *testing.T) string {
	t.Helper()
	if bin := os.Getenv("PRISM_BIN"); bin != "" {
		if _, err := os.Stat(bin); err != nil {
			t.Fatalf("PRISM_BIN=%s: %v", bin, err)
		}
		return bin
	}
	builtOnce.Do(func() {
		dir, err := os.MkdirTemp("", "prism-deploy-test")
		if err != nil {
			builtErr = err
			return
		}
		built = filepath.Join(dir, "prism")
		if out, err := exec.Command("go", "build", "-o", built, "../cmd/prism").CombinedOutput(); err != nil {
			builtErr = fmt.Errorf("go build ../cmd/prism: %v\n%s", err, out)
		}
	})
	if builtErr != nil {
		t.Fatal(builtErr)
	}
	return built
}

// TestMain removes the binary prismBinary built.
func TestMain(m *testing.M) {
	code := m.Run()
	if built != "" {
		os.RemoveAll(filepath.Dir(built))
	}
	os.Exit(code)
}

var (
	builtOnce sync.Once
	built     string
	builtErr  error
)

var helpFlag = regexp.MustCompile(`(?m)^\s+(?:-[a-zA-Z], )?--([a-z0-9][a-z0-9-]*)`)

// flagProblems checks each prism command line of objs against the help of
// the binary's subcommand: every --flag must be one it takes.
func flagProblems(t *testing.T, bin string, objs []object) []string {
	t.Helper()
	help := map[string]map[string]bool{}
	var problems []string
	lines := commandLines(objs)
	if len(lines) == 0 {
		t.Fatal("no prism command line found in the workloads")
	}
	for where, cmds := range lines {
		for _, argv := range cmds {
			var path []string
			for _, k := range knownCommands {
				if len(argv) >= len(k) && slices.Equal(argv[:len(k)], k) && len(k) > len(path) {
					path = k
				}
			}
			if path == nil {
				problems = append(problems, fmt.Sprintf("%s: prism %s: not a known subcommand (add it to knownCommands)", where, strings.Join(argv, " ")))
				continue
			}
			key := strings.Join(path, " ")
			if help[key] == nil {
				out, err := exec.Command(bin, append(slices.Clone(path), "--help")...).CombinedOutput()
				if err != nil {
					t.Fatalf("%s %s --help: %v\n%s", bin, key, err, out)
				}
				help[key] = map[string]bool{}
				for _, m := range helpFlag.FindAllStringSubmatch(string(out), -1) {
					help[key][m[1]] = true
				}
			}
			for _, a := range argv[len(path):] {
				if !strings.HasPrefix(a, "--") {
					continue
				}
				name, _, _ := strings.Cut(strings.TrimPrefix(a, "--"), "=")
				if !help[key][name] {
					problems = append(problems, fmt.Sprintf("%s: prism %s: unknown flag --%s", where, key, name))
				}
			}
		}
	}
	slices.Sort(problems)
	return problems
}

func TestCommandLinesMatchCLI(t *testing.T) {
	bin := prismBinary(t)
	for _, p := range flagProblems(t, bin, readRendered(t)) {
		t.Error(p)
	}
	// The sharded embedding tier's command lines (prism ingest --shard K)
	// are not in deploy/manifests: render them.
	t.Run("sharded", func(t *testing.T) {
		helm := helmBinary(t)
		objs := decode(t, run(t, helm, append(slices.Clone(helmTemplate), "--set", "embedding.shards=2", "--set", "embedding.ingest.dtype=int8")...))
		checkShards(t, objs, 2, 2)
		for _, p := range flagProblems(t, bin, objs) {
			t.Error(p)
		}
	})
}

// TestChartRefusesBadShards checks that the chart refuses, saying why,
// an embedding.shards that is not a whole number, and a sharded tier
// without its init step (each worker would then ingest the whole model
// into its empty store).
func TestChartRefusesBadShards(t *testing.T) {
	helm := helmBinary(t)
	for _, c := range []struct {
		set  []string
		want string
	}{
		{[]string{"embedding.shards=1.5"}, "embedding.shards 1.5: want a whole number"},
		{[]string{"embedding.shards=-2"}, "embedding.shards -2: want a whole number"},
		{[]string{"embedding.shards=two"}, "embedding.shards two: want a whole number"},
		{[]string{"embedding.shards=2", "embedding.ingest.enabled=false"}, "embedding.shards 2 needs embedding.ingest.enabled"},
	} {
		args := slices.Clone(helmTemplate)
		for _, v := range c.set {
			args = append(args, "--set", v)
		}
		out, err := exec.Command(helm, args...).CombinedOutput()
		if err == nil || !strings.Contains(string(out), c.want) {
			t.Errorf("helm template --set %v: %v, want a failure saying %q\n%s", c.set, err, c.want, out)
		}
	}
}

// helmBinary finds helm on PATH or in the checkout's .cache/bin.
func helmBinary(t *testing.T) string {
	t.Helper()
	if p, err := exec.LookPath("helm"); err == nil {
		return p
	}
	p := filepath.Join("..", ".cache", "bin", "helm")
	if _, err := os.Stat(p); err != nil {
		t.Skip("helm not found on PATH or in .cache/bin (GOBIN=$PWD/.cache/bin go install helm.sh/helm/v3/cmd/helm@v3.22.0): the chart is not linted or rendered")
	}
	return p
}

func run(t *testing.T, name string, args ...string) []byte {
	t.Helper()
	var stderr bytes.Buffer
	cmd := exec.Command(name, args...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s%s", name, strings.Join(args, " "), err, out, stderr.Bytes())
	}
	return out
}

// TestChartRendersManifests lints the chart and checks that
// deploy/manifests is what it renders with its default values.
func TestChartRendersManifests(t *testing.T) {
	helm := helmBinary(t)
	run(t, helm, "lint", "--strict", chartDir)
	got := run(t, helm, helmTemplate...)
	want, err := os.ReadFile(rendered)
	if err != nil {
		t.Fatalf("%v (regenerate: %s)", err, regenerate)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("deploy/%s is stale: it is not what the chart renders; regenerate it with `%s` and commit it", rendered, regenerate)
	}
}

// TestChartVariants renders the chart's other branches and decodes them
// strictly: plaintext with the kubelet's gRPC probes, an image volume for
// the models, MIG slices on a selected node pool, DNS names announced.
func TestChartVariants(t *testing.T) {
	helm := helmBinary(t)
	bin := os.Getenv("PRISM_BIN")
	if bin == "" {
		bin = filepath.Join("..", "bin", "prism")
	}
	for _, v := range []struct {
		name string
		set  []string
		// partial: the variant turns off parts checkWorkloads asks for.
		partial bool
		// shards, replicas: a sharded embedding tier (checkShards).
		shards, replicas int
	}{
		{"plaintext", []string{"tls.enabled=false"}, false, 0, 0},
		{"image-models", []string{"modelRepository.type=image", "modelRepository.image.reference=registry.example/prism-models:1"}, false, 0, 0},
		{"hostpath-models-token", []string{"modelRepository.type=hostPath", "tls.authTokenSecret=prism-token", "embedding.ingest.dtype=float16"}, false, 0, 0},
		{"mig", []string{"dense.gpu.resource=nvidia.com/mig-1g.10gb", "dense.replicas=7", "dense.nodeSelector.nvidia\\.com/mig\\.strategy=mixed"}, false, 0, 0},
		{"advertise-pod-ip", []string{"workers.advertiseDNS=false"}, false, 0, 0},
		{"router-http", []string{"router.httpPort=8501"}, false, 0, 0},
		{"loan", []string{"loan.enabled=true", "loan.pool.nodeSelector.pool=training", "loan.pool.taints={pool=training:NoSchedule}", "loan.options=capacity=300"}, false, 0, 0},
		{"loan-keep-on-exit", []string{"loan.enabled=true", "loan.pool.nodeSelector.pool=training", "loan.onExit=keep"}, false, 0, 0},
		{"one-router-no-lease", []string{"router.sequencerLease.enabled=false", "router.autoscaling.enabled=false", "router.replicas=1"}, true, 0, 0},
		{"cpu-only-fixed-routers-open", []string{"dense.gpu.enabled=false", "router.autoscaling.enabled=false", "router.replicas=2",
			"networkPolicy.enabled=false", "metrics.annotations=false", "embedding.ingest.enabled=false"}, true, 0, 0},
		{"sharded", []string{"embedding.shards=2"}, false, 2, 2},
		{"sharded-one-replica-float16", []string{"embedding.shards=3", "embedding.replicas=1", "embedding.ingest.dtype=float16"}, false, 3, 1},
		{"sharded-plaintext-pod-ip", []string{"embedding.shards=2", "embedding.replicas=3", "embedding.pdb.maxUnavailable=3", "tls.enabled=false", "workers.advertiseDNS=false"}, false, 2, 3},
	} {
		t.Run(v.name, func(t *testing.T) {
			args := slices.Clone(helmTemplate)
			for _, s := range v.set {
				args = append(args, "--set", s)
			}
			objs := decode(t, run(t, helm, args...))
			if !v.partial {
				checkWorkloads(t, objs)
			} else {
				checkRouterRollout(t, objs)
			}
			if v.shards > 0 {
				checkShards(t, objs, v.shards, v.replicas)
			}
			if _, err := os.Stat(bin); err != nil {
				return
			}
			problems := flagProblems(t, bin, objs)
			for _, p := range problems {
				t.Error(p)
			}
		})
	}
}

// TestKustomize builds deploy/manifests as `kubectl apply -k` would.
func TestKustomize(t *testing.T) {
	kubectl, err := exec.LookPath("kubectl")
	if err != nil {
		t.Skip("kubectl not found: kubectl kustomize deploy/manifests not checked")
	}
	objs := decode(t, run(t, kubectl, "kustomize", "manifests"))
	kinds := map[string]int{}
	for _, o := range objs {
		kinds[o.Kind]++
	}
	want := map[string]int{"Namespace": 1}
	for k, n := range wantKinds {
		want[k] = n
	}
	if fmt.Sprint(kinds) != fmt.Sprint(want) {
		t.Errorf("kubectl kustomize: kinds %v, want %v", kinds, want)
	}
	checkWorkloads(t, objs)
}

// TestFlagProblemsCatchesUnknown checks the checker: a flag no prism
// command takes is found in args and in a `sh -c` script alike.
func TestFlagProblemsCatchesUnknown(t *testing.T) {
	bin := prismBinary(t)
	d := &appsv1.Deployment{}
	d.Spec.Template.Spec.InitContainers = []corev1.Container{{Name: "init", Command: []string{"sh", "-c", "prism store versions m --db /d >/dev/null 2>&1 || exec prism ingest /p --db /d --no-such-ingest-flag x"}}}
	d.Spec.Template.Spec.Containers = []corev1.Container{{Name: "main", Args: []string{"serve", "router", "--addr", "0.0.0.0:1", "--no-such-router-flag=1"}}}
	got := flagProblems(t, bin, []object{{Kind: "Deployment", Name: "x", Obj: d}})
	want := []string{"x/init: prism ingest: unknown flag --no-such-ingest-flag", "x/main: prism serve router: unknown flag --no-such-router-flag"}
	if !slices.Equal(got, want) {
		t.Errorf("problems %q, want %q", got, want)
	}
}

// TestIngestInitStep runs the embedding pods' init step as the chart
// renders it (its sh -c script, with the model repository and the
// store's mount at test folders) with the real prism on a partitioned
// dlrm-tiny: it ingests the plan into an empty store and leaves a store
// that holds the model as it is; and a models[].name that is not the
// plan's model name (plan.json model.name, which the workers serve)
// fails the init step, naming the model the plan holds, instead of
// passing while the check never finds the model, so every start of the
// pod ingested the plan again.
// ingestSteps are the embedding pods' ingest init steps (one per model),
// without the seed step before them.
func ingestSteps(init []corev1.Container) []corev1.Container {
	var out []corev1.Container
	for _, c := range init {
		if strings.HasPrefix(c.Name, "ingest-") {
			out = append(out, c)
		}
	}
	return out
}

func TestIngestInitStep(t *testing.T) {
	bin, err := filepath.Abs(prismBinary(t))
	if err != nil {
		t.Fatal(err)
	}
	helm := helmBinary(t)
	dir := t.TempDir()
	repo := filepath.Join(dir, "models")
	run(t, bin, "models", "build", "dlrm-tiny", "-o", filepath.Join(dir, "build"), "--seed", "5")
	run(t, bin, "partition", filepath.Join(dir, "build", "model.onnx"), "-o", filepath.Join(repo, "dlrm-tiny-part"))
	initStep := func(name string, plan ...string) string {
		t.Helper()
		folder := "dlrm-tiny-part"
		if len(plan) > 0 {
			folder = plan[0]
		}
		out := run(t, helm, append(slices.Clone(helmTemplate), "--set", "models[0].name="+name, "--set", "models[0].plan="+folder)...)
		emb := find[*appsv1.StatefulSet](t, decode(t, out), "StatefulSet", "prism-embedding")
		init := ingestSteps(emb.Spec.Template.Spec.InitContainers)
		if len(init) != 1 || len(init[0].Command) != 3 {
			t.Fatalf("init containers %+v: want one sh -c script", init)
		}
		return init[0].Command[2]
	}
	step := func(script, store string) (string, error) {
		t.Helper()
		script = strings.ReplaceAll(script, "/models/", repo+"/")
		script = strings.ReplaceAll(script, "/var/lib/prism/store", store)
		cmd := exec.Command("sh", "-c", script)
		cmd.Env = append(os.Environ(), "PATH="+filepath.Dir(bin)+string(os.PathListSeparator)+os.Getenv("PATH"))
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	versions := func(store string) string {
		t.Helper()
		return string(run(t, bin, "store", "versions", "dlrm-tiny", "--db", store))
	}

	store := filepath.Join(dir, "store")
	good := initStep("dlrm-tiny")
	if out, err := step(good, store); err != nil {
		t.Fatalf("init step on an empty store: %v\n%s", err, out)
	}
	first := versions(store)
	if out, err := step(good, store); err != nil {
		t.Fatalf("init step on a store holding the model: %v\n%s", err, out)
	} else if strings.Contains(out, "ingested") {
		t.Errorf("init step on a store holding the model ingested it again:\n%s", out)
	}
	if v := versions(store); v != first {
		t.Errorf("the store's versions changed when it held the model already:\n%s\nwere\n%s", v, first)
	}
	// A retrained model (the same name, other weights) in a new plan
	// folder: the init step ingests it as a new version, switched to.
	// (Checked for the name only, the store held the old version and the
	// worker refused the plan, holding other content: a crash loop.)
	run(t, bin, "models", "build", "dlrm-tiny", "-o", filepath.Join(dir, "build-6"), "--seed", "6")
	run(t, bin, "partition", filepath.Join(dir, "build-6", "model.onnx"), "-o", filepath.Join(repo, "dlrm-tiny-retrained"))
	if out, err := step(initStep("dlrm-tiny", "dlrm-tiny-retrained"), store); err != nil {
		t.Fatalf("init step with a retrained plan: %v\n%s", err, out)
	}
	if v := versions(store); !regexp.MustCompile(`(?m)^\*.*\b2\b.*dlrm-tiny-retrained`).MatchString(v) {
		t.Errorf("after the init step with a retrained plan, the store's active version is not a new one from it:\n%s", v)
	}

	other := filepath.Join(dir, "store-misnamed")
	out, err := step(initStep("dlrm-kaggle"), other)
	if err == nil || !strings.Contains(out, `"dlrm-kaggle"`) || !strings.Contains(out, "dlrm-tiny") {
		t.Errorf("init step with models[].name dlrm-kaggle for a plan of dlrm-tiny: %v, want a failure naming both\n%s", err, out)
	}
}

// TestShardedIngestInitStep runs the init steps of a sharded embedding
// tier (embedding.shards) as the chart renders them, one StatefulSet per
// shard, with the real prism on dlrm-tiny partitioned and sharded into 2
// by prism shard: shard K's init step leaves its pod's store holding
// shard K of 2 (prism store versions), the shard's tables only, and
// leaves such a store as it is when the pod starts again. A plan sharded
// into another count than embedding.shards, or not sharded at all,
// fails the init step, saying so, instead of serving part of a sharding.
func TestShardedIngestInitStep(t *testing.T) {
	bin, err := filepath.Abs(prismBinary(t))
	if err != nil {
		t.Fatal(err)
	}
	helm := helmBinary(t)
	dir := t.TempDir()
	repo := filepath.Join(dir, "models")
	run(t, bin, "models", "build", "dlrm-tiny", "-o", filepath.Join(dir, "build"), "--seed", "5")
	run(t, bin, "partition", filepath.Join(dir, "build", "model.onnx"), "-o", filepath.Join(repo, "whole"))
	if err := os.CopyFS(filepath.Join(repo, "sharded"), os.DirFS(filepath.Join(repo, "whole"))); err != nil {
		t.Fatal(err)
	}
	run(t, bin, "shard", filepath.Join(repo, "sharded"), "--shards", "2")
	if err := os.CopyFS(filepath.Join(repo, "sharded-3"), os.DirFS(filepath.Join(repo, "whole"))); err != nil {
		t.Fatal(err)
	}
	run(t, bin, "shard", filepath.Join(repo, "sharded-3"), "--shards", "3")

	// initSteps renders the chart with shards shards of the plan in
	// folder plan and returns each shard's init script.
	initSteps := func(shards int, plan string) []string {
		t.Helper()
		out := run(t, helm, append(slices.Clone(helmTemplate), "--set", fmt.Sprintf("embedding.shards=%d", shards),
			"--set", "models[0].name=dlrm-tiny", "--set", "models[0].plan="+plan)...)
		objs := decode(t, out)
		checkShards(t, objs, shards, 2)
		var scripts []string
		for k := range shards {
			sts := find[*appsv1.StatefulSet](t, objs, "StatefulSet", fmt.Sprintf("prism-embedding-shard-%d", k))
			init := ingestSteps(sts.Spec.Template.Spec.InitContainers)
			if len(init) != 1 || len(init[0].Command) != 3 {
				t.Fatalf("shard %d: init containers %+v: want one sh -c script", k, init)
			}
			scripts = append(scripts, init[0].Command[2])
		}
		return scripts
	}
	step := func(script, store string) (string, error) {
		t.Helper()
		script = strings.ReplaceAll(script, "/models/", repo+"/")
		script = strings.ReplaceAll(script, "/var/lib/prism/store", store)
		cmd := exec.Command("sh", "-c", script)
		cmd.Env = append(os.Environ(), "PATH="+filepath.Dir(bin)+string(os.PathListSeparator)+os.Getenv("PATH"))
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	versions := func(store string) string {
		t.Helper()
		return string(run(t, bin, "store", "versions", "dlrm-tiny", "--db", store))
	}

	scripts := initSteps(2, "sharded")
	var tables []int
	held := map[int]string{}
	for k, script := range scripts {
		store := filepath.Join(dir, fmt.Sprintf("store-%d", k))
		if out, err := step(script, store); err != nil {
			t.Fatalf("shard %d: init step on an empty store: %v\n%s", k, err, out)
		}
		first := versions(store)
		want := fmt.Sprintf("(shard %d of 2)", k)
		if !strings.HasPrefix(first, "*") || !strings.Contains(first, want) || strings.Count(first, "\n") != 1 {
			t.Fatalf("shard %d: the store's versions after the init step:\n%s\nwant one, active, %s", k, first, want)
		}
		var n int
		if _, err := fmt.Sscanf(strings.Fields(first)[2], "%d", &n); err != nil {
			t.Fatalf("shard %d: versions %q: %v", k, first, err)
		}
		tables = append(tables, n)
		held[k] = first
		if out, err := step(script, store); err != nil {
			t.Fatalf("shard %d: init step on a store holding its shard: %v\n%s", k, err, out)
		} else if strings.Contains(out, "ingested") {
			t.Errorf("shard %d: init step on a store holding its shard ingested it again:\n%s", k, out)
		}
		if v := versions(store); v != first {
			t.Errorf("shard %d: the store's versions changed when it held its shard already:\n%s\nwere\n%s", k, v, first)
		}
	}
	// dlrm-tiny's 26 tables, each on one shard (table-wise: none is over
	// a shard's budget), so no shard holds them all.
	if len(tables) == 2 && (tables[0]+tables[1] != 26 || tables[0] == 26 || tables[1] == 26) {
		t.Errorf("the shards' stores hold %v tables, want dlrm-tiny's 26 split between them", tables)
	}

	// A plan of 2 shards under embedding.shards=3: shard 0 is shard 0 of
	// 2, not of 3; shard 2 is none of the plan's. Neither is ingested.
	three := initSteps(3, "sharded")
	for _, k := range []int{0, 2} {
		store := filepath.Join(dir, fmt.Sprintf("store-3-%d", k))
		if out, err := step(three[k], store); err == nil || !strings.Contains(out, "sharded into 2 shards, not 3") || !strings.Contains(out, fmt.Sprintf("not shard %d of 3", k)) {
			t.Errorf("embedding.shards=3 for a plan of 2 shards, shard %d: %v, want a failure naming the plan's 2 shards\n%s", k, err, out)
		}
		if _, err := os.Stat(store); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("embedding.shards=3 for a plan of 2 shards, shard %d: a store was made (%v)", k, err)
		}
	}
	// A plan sharded into 3 rolled out under embedding.shards=2 onto a
	// store holding shard 0 of 2: the init step fails before it ingests
	// (it switched the store to shard 0 of 3, a version of another
	// sharding, starting its update number at 0, and then failed).
	store0 := filepath.Join(dir, "store-0")
	if out, err := step(initSteps(2, "sharded-3")[0], store0); err == nil || !strings.Contains(out, "sharded into 3") {
		t.Errorf("embedding.shards=2 for a plan of 3 shards on a store holding shard 0 of 2: %v, want a failure naming the plan's 3 shards\n%s", err, out)
	}
	if v := versions(store0); v != held[0] {
		t.Errorf("embedding.shards=2 for a plan of 3 shards: the store's versions changed:\n%s\nwere\n%s", v, held[0])
	}
	// A plan prism shard never sharded.
	if out, err := step(initSteps(2, "whole")[1], filepath.Join(dir, "store-whole")); err == nil || !strings.Contains(out, "no sharding section") {
		t.Errorf("embedding.shards=2 for an unsharded plan: %v, want a failure saying the plan has no sharding\n%s", err, out)
	}
}

// TestIngestInitStepHotBytes runs the init step, unsharded and sharded,
// as the chart renders it for embedding.hotBytes values serve embedding
// takes ("auto", a negative size: the tier off) and a size: each ingests
// the model, and a size is recorded as the store's default. (The chart
// passed every value to prism ingest --hot-bytes, which takes sizes
// only: with hotBytes "auto", which README and values.yaml offer, every
// embedding pod's init step failed, a crash loop.)
func TestIngestInitStepHotBytes(t *testing.T) {
	bin, err := filepath.Abs(prismBinary(t))
	if err != nil {
		t.Fatal(err)
	}
	helm := helmBinary(t)
	dir := t.TempDir()
	repo := filepath.Join(dir, "models")
	run(t, bin, "models", "build", "dlrm-tiny", "-o", filepath.Join(dir, "build"))
	run(t, bin, "partition", filepath.Join(dir, "build", "model.onnx"), "-o", filepath.Join(repo, "dlrm-tiny-part"))
	run(t, bin, "shard", filepath.Join(repo, "dlrm-tiny-part"), "--shards", "2", "--zipf", "1.05")
	for _, c := range []struct {
		hotBytes string
		shards   int
	}{
		{"auto", 0}, {"auto", 2}, {"-1", 0}, {"-1", 2}, {"64MiB", 0}, {"64MiB", 2}, {"67108864", 0},
	} {
		t.Run(fmt.Sprintf("%s/shards=%d", c.hotBytes, c.shards), func(t *testing.T) {
			out := run(t, helm, append(slices.Clone(helmTemplate), "--set", "embedding.hotBytes="+c.hotBytes,
				"--set", fmt.Sprintf("embedding.shards=%d", c.shards),
				"--set", "models[0].name=dlrm-tiny", "--set", "models[0].plan=dlrm-tiny-part")...)
			for _, p := range nonStringArgs(t, out) {
				t.Errorf("embedding.hotBytes=%s: %s", c.hotBytes, p)
			}
			objs := decode(t, out)
			name := "prism-embedding"
			if c.shards > 0 {
				name += "-shard-1"
			}
			init := ingestSteps(find[*appsv1.StatefulSet](t, objs, "StatefulSet", name).Spec.Template.Spec.InitContainers)
			if len(init) != 1 || len(init[0].Command) != 3 {
				t.Fatalf("init containers %+v: want one sh -c script", init)
			}
			store := filepath.Join(dir, fmt.Sprintf("store-%s-%d", c.hotBytes, c.shards))
			script := strings.ReplaceAll(init[0].Command[2], "/models/", repo+"/")
			script = strings.ReplaceAll(script, "/var/lib/prism/store", store)
			cmd := exec.Command("sh", "-c", script)
			cmd.Env = append(os.Environ(), "PATH="+filepath.Dir(bin)+string(os.PathListSeparator)+os.Getenv("PATH"))
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Fatalf("init step with embedding.hotBytes=%s: %v\n%s\n%s", c.hotBytes, err, script, out)
			}
			if v := string(run(t, bin, "store", "versions", "dlrm-tiny", "--db", store)); !strings.HasPrefix(v, "*") {
				t.Errorf("after the init step the store holds no active version of dlrm-tiny:\n%s", v)
			}
			if recorded := strings.Contains(script, "--hot-bytes "+c.hotBytes); recorded != !(c.hotBytes == "auto" || c.hotBytes == "-1") {
				t.Errorf("init step with embedding.hotBytes=%s: --hot-bytes passed to prism ingest: %v\n%s", c.hotBytes, recorded, script)
			}
		})
	}
}

// nonStringArgs lists the container args and commands of a rendered
// stream that are not YAML strings (a -1 or 67108864 left unquoted). The
// API server refuses them (args are strings), while decode, which reads
// into the typed objects, takes them: read here as kubectl and helm
// send them, without the types.
func nonStringArgs(t *testing.T, stream []byte) []string {
	t.Helper()
	var problems []string
	for i, doc := range regexp.MustCompile(`(?m)^---\s*$`).Split(string(stream), -1) {
		var obj struct {
			Kind     string `json:"kind"`
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
			Spec struct {
				Template struct {
					Spec struct {
						Containers     []map[string]any `json:"containers"`
						InitContainers []map[string]any `json:"initContainers"`
					} `json:"spec"`
				} `json:"template"`
			} `json:"spec"`
		}
		if err := yaml.Unmarshal([]byte(doc), &obj); err != nil {
			t.Fatalf("document %d: %v", i, err)
		}
		for _, c := range append(obj.Spec.Template.Spec.Containers, obj.Spec.Template.Spec.InitContainers...) {
			for _, field := range []string{"command", "args"} {
				list, _ := c[field].([]any)
				for j, a := range list {
					if _, ok := a.(string); !ok {
						problems = append(problems, fmt.Sprintf("%s %s container %v: %s[%d] is %T %v, not a string", obj.Kind, obj.Metadata.Name, c["name"], field, j, a, a))
					}
				}
			}
		}
	}
	return problems
}
