package kube

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/prism-serve/prism/capacity"
	"github.com/prism-serve/prism/internal/serve"
)

const ns = "prism"

// denseDeployment is the chart's dense Deployment, as far as the lender
// reads it: labels, the pods' subdomain, the worker's arguments and
// environment, the certificates Secret, one GPU, the serving pool.
func denseDeployment() *appsv1.Deployment {
	sel := map[string]string{"app.kubernetes.io/name": "prism", "app.kubernetes.io/instance": "prism", "app.kubernetes.io/component": "dense"}
	lbl := map[string]string{"app.kubernetes.io/part-of": "prism"}
	for k, v := range sel {
		lbl[k] = v
	}
	gpu := resource.MustParse("1")
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "prism-dense", Namespace: ns, Labels: lbl},
		Spec: appsv1.DeploymentSpec{
			Selector: &metav1.LabelSelector{MatchLabels: sel},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: lbl, Annotations: map[string]string{"prometheus.io/scrape": "true"}},
				Spec: corev1.PodSpec{
					Subdomain:                     "prism-dense",
					TerminationGracePeriodSeconds: new(int64(30)),
					Containers: []corev1.Container{{
						Name:  "dense",
						Image: "registry.example/prism:1.0",
						Args:  []string{"serve", "dense", "--addr", "0.0.0.0:8600", "--advertise-addr", "$(POD_NAME).prism-dense:8600", "--router", "prism-router-headless:8500", "--certs", "/certs"},
						Env:   []corev1.EnvVar{{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}}},
						Ports: []corev1.ContainerPort{{Name: "grpc", ContainerPort: 8600}},
						Resources: corev1.ResourceRequirements{
							Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2"), "nvidia.com/gpu": gpu},
							Limits:   corev1.ResourceList{"nvidia.com/gpu": gpu},
						},
						VolumeMounts: []corev1.VolumeMount{{Name: "certs", MountPath: "/certs", ReadOnly: true}},
					}},
					Volumes:      []corev1.Volume{{Name: "certs", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "prism-certs-dense"}}}},
					NodeSelector: map[string]string{"pool": "serving"},
					Tolerations:  []corev1.Toleration{{Key: "nvidia.com/gpu", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}},
				},
			},
		},
	}
}

func poolTaint(t *testing.T) corev1.Toleration {
	tol, err := ParseTaint("pool=training:NoSchedule")
	if err != nil {
		t.Fatal(err)
	}
	return tol
}

func newLender(t *testing.T, c kubernetes.Interface, o Options) (*Provider, *[]string) {
	t.Helper()
	var logs []string
	o.Client, o.Namespace, o.Template = c, ns, "prism-dense"
	if o.Max == 0 {
		o.Max = 4
	}
	o.Pool = map[string]string{"pool": "training"}
	o.Tolerations = []corev1.Toleration{poolTaint(t)}
	o.PriorityClass = "prism-loan"
	o.Logf = func(f string, a ...any) { logs = append(logs, f) }
	p, err := New(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p, &logs
}

func eventually(t *testing.T, what string, ok func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !ok(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func reclaim(t *testing.T, p *Provider) capacity.ProviderReclaim {
	t.Helper()
	select {
	case r := <-p.Reclaims():
		// The grace runs from the reclaim: the driver times the
		// deadline from At, not from its next tick.
		if r.At.IsZero() {
			t.Errorf("reclaim %+v without its time", r)
		}
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("no reclaim reported")
	}
	return capacity.ProviderReclaim{}
}

func noReclaim(t *testing.T, p *Provider) {
	t.Helper()
	select {
	case r := <-p.Reclaims():
		t.Fatalf("reclaim %+v reported", r)
	case <-time.After(100 * time.Millisecond):
	}
}

func lentWorker(p *Provider, id string) (capacity.LentWorker, bool) {
	for _, w := range p.Workers() {
		if w.ID == id {
			return w, true
		}
	}
	return capacity.LentWorker{}, false
}

// TestBorrowPodSpec: a lent worker is the dense Deployment's Pod moved to
// the training pool: its node selector, the pool's taint tolerated, the
// priority class, the pool's resource; the same image, arguments and
// certificates; owned by the Deployment, so its ReplicaSets leave it.
func TestBorrowPodSpec(t *testing.T) {
	dep := denseDeployment()
	c := fake.NewClientset(dep)
	p, _ := newLender(t, c, Options{Resource: "nvidia.com/mig-3g.40gb"})
	ids, err := p.Borrow(context.Background(), "dlrm", 2)
	if err != nil || len(ids) != 2 || ids[0] == ids[1] {
		t.Fatalf("Borrow = %v, %v", ids, err)
	}
	for _, id := range ids {
		if !strings.HasPrefix(id, "prism-dense-loan-") {
			t.Errorf("name %q", id)
		}
		pod, err := c.CoreV1().Pods(ns).Get(context.Background(), id, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		s := pod.Spec
		if len(s.NodeSelector) != 1 || s.NodeSelector["pool"] != "training" {
			t.Errorf("node selector %v, want the pool's", s.NodeSelector)
		}
		if !slices.ContainsFunc(s.Tolerations, func(x corev1.Toleration) bool {
			return x.Key == "pool" && x.Value == "training" && x.Effect == corev1.TaintEffectNoSchedule
		}) || !slices.ContainsFunc(s.Tolerations, func(x corev1.Toleration) bool { return x.Key == "nvidia.com/gpu" }) {
			t.Errorf("tolerations %+v: want the pool's taint and the template's", s.Tolerations)
		}
		if s.PriorityClassName != "prism-loan" || s.Priority != nil {
			t.Errorf("priority class %q (priority %v)", s.PriorityClassName, s.Priority)
		}
		ct := s.Containers[0]
		want := dep.Spec.Template.Spec.Containers[0]
		if ct.Image != want.Image || !slices.Equal(ct.Args, want.Args) || s.Subdomain != "prism-dense" || s.Volumes[0].Secret.SecretName != "prism-certs-dense" {
			t.Errorf("container %+v, want the template's", ct)
		}
		mig := ct.Resources.Requests["nvidia.com/mig-3g.40gb"]
		migLimit := ct.Resources.Limits["nvidia.com/mig-3g.40gb"]
		if _, still := ct.Resources.Requests["nvidia.com/gpu"]; still || mig.Value() != 1 || migLimit.Value() != 1 {
			t.Errorf("resources %+v: want one nvidia.com/mig-3g.40gb instead of the GPU", ct.Resources)
		}
		if pod.Labels[LabelLentBy] != "prism-dense-loan" || pod.Labels["app.kubernetes.io/component"] != "dense" || pod.Annotations[AnnotationModel] != "dlrm" {
			t.Errorf("labels %v, annotations %v", pod.Labels, pod.Annotations)
		}
		if len(pod.OwnerReferences) != 1 || pod.OwnerReferences[0].Name != "prism-dense" || pod.OwnerReferences[0].Kind != "Deployment" || !*pod.OwnerReferences[0].Controller {
			t.Errorf("owners %+v, want the Deployment as controller", pod.OwnerReferences)
		}
	}
	if ws := p.Workers(); len(ws) != 2 || !ws[0].Running || ws[0].Addr != "" {
		t.Errorf("workers %+v: want 2 starting", ws)
	}
	if _, err := p.Borrow(context.Background(), "dlrm", 3); err == nil {
		t.Error("borrowing past max: no error")
	}
}

// TestDeviceBesideOtherExtendedResources: a dense worker that asks for
// a NIC (an SR-IOV virtual function, for RDMA) beside its GPU has the GPU
// taken for its device, whatever the names' order: Idle counts the
// pool's GPUs, and resource= replaces the GPU and leaves the NIC. Taken
// by name order, intel.com/sriov_netdevice was the device: Idle counted
// NICs, and resource= dropped the NIC's request and kept the whole GPU
// beside the MIG slice it asked for, a Pod no MIG node could take.
func TestDeviceBesideOtherExtendedResources(t *testing.T) {
	for _, mig := range []corev1.ResourceName{"", "nvidia.com/mig-3g.40gb"} {
		dep := denseDeployment()
		res := &dep.Spec.Template.Spec.Containers[0].Resources
		nic := resource.MustParse("1")
		res.Requests["intel.com/sriov_netdevice"], res.Limits["intel.com/sriov_netdevice"] = nic, nic
		c := fake.NewClientset(dep)
		p, _ := newLender(t, c, Options{Resource: mig})
		want := corev1.ResourceName("nvidia.com/gpu")
		if mig != "" {
			want = mig
		}
		if p.resource != want || p.per != 1 {
			t.Errorf("resource=%q: the device is %d %q, want 1 %q", mig, p.per, p.resource, want)
		}
		ids, err := p.Borrow(context.Background(), "dlrm", 1)
		if err != nil {
			t.Fatal(err)
		}
		pod, err := c.CoreV1().Pods(ns).Get(context.Background(), ids[0], metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		got := pod.Spec.Containers[0].Resources
		q := got.Limits[want]
		if _, ok := got.Limits["intel.com/sriov_netdevice"]; !ok || q.Value() != 1 {
			t.Errorf("resource=%q: limits %v, want the NIC kept and one %s", mig, got.Limits, want)
		}
		if _, ok := got.Limits["nvidia.com/gpu"]; mig != "" && ok {
			t.Errorf("resource=%q: limits %v keep the whole GPU beside the slice", mig, got.Limits)
		}
	}
}

// runPod makes a lent Pod run and be ready on node, as the kubelet would.
func runPod(t *testing.T, c kubernetes.Interface, name, node string) {
	t.Helper()
	ctx := context.Background()
	pod, err := c.CoreV1().Pods(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod.Spec.NodeName = node
	pod.Status.Phase, pod.Status.PodIP = corev1.PodRunning, "10.1.2.3"
	pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	if _, err := c.CoreV1().Pods(ns).Update(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestReclaim: a Pod deleted by someone else (its grace recorded by the
// API server, as preemption and the Eviction API do), one removed at
// once, and one the kubelet evicted, are each reported once as a
// reclaim with its grace.
func TestReclaim(t *testing.T) {
	ctx := context.Background()
	c := fake.NewClientset(denseDeployment())
	p, _ := newLender(t, c, Options{})
	ids, err := p.Borrow(ctx, "dlrm", 3)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		runPod(t, c, id, "train-1")
	}
	eventually(t, "the workers' addresses", func() bool {
		w, _ := lentWorker(p, ids[0])
		return w.Addr == ids[0]+".prism-dense:8600" && !w.Ready.IsZero()
	})

	// Preemption: the scheduler marks the Pod a disruption target and
	// deletes it with its grace; the API server sets the deletion
	// timestamp and grace (the fake removes at once, so set them as the
	// real one does).
	pod, _ := c.CoreV1().Pods(ns).Get(ctx, ids[0], metav1.GetOptions{})
	now := metav1.Now()
	pod.DeletionTimestamp, pod.DeletionGracePeriodSeconds = &now, new(int64(30))
	pod.Status.Conditions = append(pod.Status.Conditions, corev1.PodCondition{Type: corev1.DisruptionTarget, Status: corev1.ConditionTrue, Reason: "PreemptionByScheduler", Message: "preempted by training/job-0"})
	if _, err := c.CoreV1().Pods(ns).Update(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if r := reclaim(t, p); r.Worker != ids[0] || r.Grace != 30*time.Second {
		t.Errorf("reclaim %+v, want %s with 30s", r, ids[0])
	}
	// Then gone: reported once.
	if err := c.CoreV1().Pods(ns).Delete(ctx, ids[0], metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the preempted Pod stopped", func() bool { w, _ := lentWorker(p, ids[0]); return !w.Running })
	noReclaim(t, p)

	// Deleted at once (kubectl delete --grace-period=0 --force).
	if err := c.CoreV1().Pods(ns).Delete(ctx, ids[1], metav1.DeleteOptions{GracePeriodSeconds: new(int64(0))}); err != nil {
		t.Fatal(err)
	}
	if r := reclaim(t, p); r.Worker != ids[1] || r.Grace != 0 {
		t.Errorf("reclaim %+v, want %s with no grace", r, ids[1])
	}

	// Evicted by the kubelet (node pressure): the Pod failed.
	pod, _ = c.CoreV1().Pods(ns).Get(ctx, ids[2], metav1.GetOptions{})
	pod.Status.Phase, pod.Status.Reason = corev1.PodFailed, "Evicted"
	if _, err := c.CoreV1().Pods(ns).UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if r := reclaim(t, p); r.Worker != ids[2] || r.Grace != 0 {
		t.Errorf("reclaim %+v, want %s", r, ids[2])
	}
	if w, _ := lentWorker(p, ids[2]); w.Running {
		t.Error("an evicted worker still runs")
	}
	// The controller returns them: nothing is left.
	for _, id := range ids {
		if err := p.Return(ctx, id); err != nil {
			t.Error(err)
		}
	}
	if pods, _ := c.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{}); len(pods.Items) != 0 {
		t.Errorf("%d Pods left", len(pods.Items))
	}
}

// TestDrainReturn: a drain deletes the Pod with the drain's grace (no
// reclaim reported), a return deletes what is left; a return of a Pod
// that never ran deletes it too.
func TestDrainReturn(t *testing.T) {
	ctx := context.Background()
	c := fake.NewClientset(denseDeployment())
	var deletes []metav1.DeleteOptions
	p, _ := newLender(t, c, Options{Grace: 20 * time.Second})
	ids, err := p.Borrow(ctx, "dlrm", 2)
	if err != nil {
		t.Fatal(err)
	}
	runPod(t, c, ids[0], "train-1")
	eventually(t, "the address", func() bool { w, _ := lentWorker(p, ids[0]); return w.Addr != "" })
	c.PrependReactor("delete", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		deletes = append(deletes, a.(k8stesting.DeleteAction).GetDeleteOptions())
		return false, nil, nil
	})
	if err := p.Drain(ctx, ids[0]); err != nil {
		t.Fatal(err)
	}
	if len(deletes) != 1 || deletes[0].GracePeriodSeconds == nil || *deletes[0].GracePeriodSeconds != 20 {
		t.Errorf("drain's deletes %+v, want one with 20s grace", deletes)
	}
	eventually(t, "the drained Pod gone", func() bool { w, _ := lentWorker(p, ids[0]); return !w.Running && w.Draining })
	noReclaim(t, p)
	if err := p.Return(ctx, ids[0]); err != nil {
		t.Fatal(err)
	}
	// Never placed (the pool is full): returned at the borrow's timeout.
	if err := p.Return(ctx, ids[1]); err != nil {
		t.Fatal(err)
	}
	if _, err := c.CoreV1().Pods(ns).Get(ctx, ids[1], metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("returned Pod: %v, want it deleted", err)
	}
	if len(p.Workers()) != 0 {
		t.Errorf("workers %+v after the returns", p.Workers())
	}
	noReclaim(t, p)
	if err := p.Return(ctx, ids[1]); err == nil {
		t.Error("a second return: no error")
	}
}

// TestLeftovers: Pods an earlier run lent that name no model, or have
// ended, are deleted at start; the running ones are adopted, the oldest
// first, up to max (the rest deleted): a run killed mid-peak (its node
// lost, out of memory) left them serving the peak, and deleting them
// took that capacity away until borrowed again, minutes later.
func TestLeftovers(t *testing.T) {
	lentBy := map[string]string{LabelLentBy: "prism-dense-loan"}
	leftover := func(name string, age time.Duration, model string, phase corev1.PodPhase, ready bool) *corev1.Pod {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: lentBy,
			CreationTimestamp: metav1.NewTime(time.Now().Add(-age).Truncate(time.Second))}}
		if model != "" {
			pod.Annotations = map[string]string{AnnotationModel: model}
		}
		pod.Spec.Containers = []corev1.Container{{Name: "dense", Args: []string{"serve", "dense", "--addr", ":8600"}}}
		pod.Status.Phase = phase
		if phase == corev1.PodRunning {
			pod.Spec.NodeName, pod.Status.PodIP = "gpu-7", "10.0.0.7"
		}
		if ready {
			pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
		}
		return pod
	}
	c := fake.NewClientset(denseDeployment(),
		leftover("prism-dense-loan-nomodel", time.Hour, "", corev1.PodRunning, true),
		leftover("prism-dense-loan-ended", time.Hour, "m", corev1.PodFailed, false),
		leftover("prism-dense-loan-young", time.Minute, "m", corev1.PodRunning, true),
		leftover("prism-dense-loan-serving", 20*time.Minute, "m", corev1.PodRunning, true),
		leftover("prism-dense-loan-pending", 10*time.Minute, "m", corev1.PodPending, false),
		&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "prism-dense-abc", Namespace: ns}})
	p, _ := newLender(t, c, Options{Max: 2})
	pods, _ := c.CoreV1().Pods(ns).List(context.Background(), metav1.ListOptions{})
	var left []string
	for _, pod := range pods.Items {
		left = append(left, pod.Name)
	}
	slices.Sort(left)
	if want := []string{"prism-dense-abc", "prism-dense-loan-pending", "prism-dense-loan-serving"}; !slices.Equal(left, want) {
		t.Errorf("pods %v, want %v: the owned worker and the two oldest running leftovers, adopted (max 2)", left, want)
	}
	ws := p.Workers()
	if len(ws) != 2 || ws[0].ID != "prism-dense-loan-serving" || ws[1].ID != "prism-dense-loan-pending" {
		t.Fatalf("workers %+v, want the serving and the pending leftovers, oldest first", ws)
	}
	if w := ws[0]; w.Model != "m" || !w.Running || w.Addr == "" || w.Ready.IsZero() || w.Draining {
		t.Errorf("the adopted serving leftover: %+v; want model m, running, its address, ready", w)
	}
	if w := ws[1]; !w.Running || w.Addr != "" || !w.Ready.IsZero() {
		t.Errorf("the adopted pending leftover: %+v; want running, no address yet, not ready", w)
	}
}

func node(name string, pool string, gpus int64, ready, unschedulable bool) *corev1.Node {
	st := corev1.ConditionTrue
	if !ready {
		st = corev1.ConditionFalse
	}
	return &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"pool": pool}},
		Spec:       corev1.NodeSpec{Unschedulable: unschedulable},
		Status: corev1.NodeStatus{
			Allocatable: corev1.ResourceList{"nvidia.com/gpu": *resource.NewQuantity(gpus, resource.DecimalSI)},
			Conditions:  []corev1.NodeCondition{{Type: corev1.NodeReady, Status: st}},
		},
	}
}

func gpuPod(name, ns, node string, gpus int64, phase corev1.PodPhase) *corev1.Pod {
	q := *resource.NewQuantity(gpus, resource.DecimalSI)
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
		Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{
			Requests: corev1.ResourceList{"nvidia.com/gpu": q}, Limits: corev1.ResourceList{"nvidia.com/gpu": q}}}}},
		Status: corev1.PodStatus{Phase: phase},
	}
}

// TestIdle: the pool's allocatable GPUs on ready, schedulable nodes,
// minus what the running and pending Pods on them request and what the
// lent Pods not yet placed will, capped by max less the lent workers.
func TestIdle(t *testing.T) {
	ctx := context.Background()
	c := fake.NewClientset(denseDeployment(),
		node("train-1", "training", 8, true, false),
		node("train-2", "training", 8, true, false),
		node("train-3", "training", 8, true, true),   // cordoned
		node("train-4", "training", 8, false, false), // not ready
		node("serve-1", "serving", 8, true, false),
		gpuPod("job-0", "training", "train-1", 6, corev1.PodRunning),
		gpuPod("job-1", "training", "train-2", 8, corev1.PodSucceeded), // done: frees its GPUs
		gpuPod("job-2", "training", "train-2", 1, corev1.PodPending),   // bound, starting
		gpuPod("dense-0", ns, "serve-1", 8, corev1.PodRunning),
	)
	p, _ := newLender(t, c, Options{Max: 20})
	idle := func() int {
		t.Helper()
		n, err := p.Idle(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := idle(); n != 9 { // (8-6) + (8-1)
		t.Fatalf("idle %d, want 9", n)
	}
	ids, err := p.Borrow(ctx, "dlrm", 3)
	if err != nil {
		t.Fatal(err)
	}
	if n := idle(); n != 6 { // lent, not yet placed
		t.Errorf("idle %d after lending 3, want 6", n)
	}
	// Placed on train-2: counted once, as a Pod on the node.
	for _, id := range ids {
		runPod(t, c, id, "train-2")
	}
	eventually(t, "the lent Pods placed", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, w := range p.workers {
			if w.nodeName == "" {
				return false
			}
		}
		return true
	})
	if n := idle(); n != 6 {
		t.Errorf("idle %d with 3 lent placed, want 6", n)
	}
	// Capped by max.
	p.o.Max = 5
	if n := idle(); n != 2 {
		t.Errorf("idle %d with max 5 and 3 lent, want 2", n)
	}
	// Reused within idle-refresh, less what is lent since.
	p.o.Max, p.o.IdleRefresh = 20, time.Hour
	idle()
	if err := c.CoreV1().Pods("training").Delete(ctx, "job-0", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Borrow(ctx, "dlrm", 1); err != nil {
		t.Fatal(err)
	}
	if n := idle(); n != 5 {
		t.Errorf("idle %d from the reused count, want 5", n)
	}
}

func TestParseTaint(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want corev1.Toleration
	}{
		{"pool=training:NoSchedule", corev1.Toleration{Key: "pool", Operator: corev1.TolerationOpEqual, Value: "training", Effect: corev1.TaintEffectNoSchedule}},
		{"nvidia.com/gpu", corev1.Toleration{Key: "nvidia.com/gpu", Operator: corev1.TolerationOpExists}},
		{"dedicated:NoExecute", corev1.Toleration{Key: "dedicated", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute}},
	} {
		got, err := ParseTaint(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("ParseTaint(%q) = %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
	}
	for _, bad := range []string{"", ":NoSchedule", "a=b:Sometimes"} {
		if _, err := ParseTaint(bad); err == nil {
			t.Errorf("ParseTaint(%q): no error", bad)
		}
	}
}

// TestDeleteFailureKeepsWorker: a Return or Drain whose Pod delete fails
// (an API server timeout) keeps the worker lent: listed as draining, so
// the controller returns it again, and deleted at Close. Forgotten, its
// Pod held a training GPU until someone deleted it by hand.
func TestDeleteFailureKeepsWorker(t *testing.T) {
	for _, tc := range []struct {
		name string
		// steps: "drain" or "return" with the delete failing ("!") or
		// going through; "close".
		steps []string
	}{
		{"return fails, returned again", []string{"return!", "return"}},
		{"return fails, closed", []string{"return!", "close"}},
		{"drain and return fail, closed", []string{"drain!", "return!", "close"}},
		{"drain fails, returned", []string{"drain!", "return"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := fake.NewClientset(denseDeployment())
			fail := false
			c.PrependReactor("delete", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
				if fail {
					return true, nil, errors.New("etcdserver: request timed out")
				}
				return false, nil, nil
			})
			p, _ := newLender(t, c, Options{})
			ctx := context.Background()
			ids, err := p.Borrow(ctx, "dlrm", 1)
			if err != nil {
				t.Fatal(err)
			}
			id := ids[0]
			for _, step := range tc.steps {
				fail = strings.HasSuffix(step, "!")
				switch strings.TrimSuffix(step, "!") {
				case "drain":
					err = p.Drain(ctx, id)
				case "return":
					err = p.Return(ctx, id)
				case "close":
					p.Close()
					err = nil
				}
				if (err != nil) != fail {
					t.Fatalf("%s: error %v", step, err)
				}
				ws := p.Workers()
				switch {
				case fail && (len(ws) != 1 || ws[0].ID != id || !ws[0].Draining):
					t.Fatalf("after %s: %+v, want %s lent and draining", step, ws, id)
				case step == "return" && len(ws) != 0:
					t.Fatalf("after a return that went through: %+v lent", ws)
				}
			}
			if _, err := c.CoreV1().Pods(ns).Get(ctx, id, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
				t.Fatalf("Pod %s after %v: %v, want it deleted", id, tc.steps, err)
			}
		})
	}
}

// TestAdvertisedMatchesWorker: the address the lender lists a lent Pod
// at is the one its worker announces, for --advertise-addr HOST and
// HOST:0 too (the worker adds the port it listens on). Without the port,
// the driver never found the worker in the registry, and the controller
// drained it, serving, as "did not start".
func TestAdvertisedMatchesWorker(t *testing.T) {
	for _, args := range [][]string{
		{"serve", "dense", "--addr", "0.0.0.0:8502", "--advertise-addr", "$(POD_IP)"},
		{"serve", "dense", "--addr", "0.0.0.0:8502", "--advertise-addr", "$(POD_IP):0"},
	} {
		pod := &corev1.Pod{
			Spec: corev1.PodSpec{Containers: []corev1.Container{{
				Args: args,
				Env:  []corev1.EnvVar{{Name: "POD_IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIP"}}}},
			}}},
			Status: corev1.PodStatus{PodIP: "10.1.2.3"},
		}
		got := advertised(pod)
		want, err := serve.Advertise{Flag: "10.1.2.3" + args[5][len("$(POD_IP)"):], Listen: "0.0.0.0:8502", Bound: "[::]:8502"}.Addr()
		if err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("args %v: the lender lists the worker at %q, the worker registers at %q: never found serving", args, got, want)
		}
	}
}

// TestBorrowFromStatefulSet: the chart's dense workers are a StatefulSet
// (its pods' hostnames make the DNS names they announce). A lent Pod
// copies its template, is owned but not controlled by it (the
// StatefulSet would release a pod that is not one of its ordinals), and
// gets a hostname and the StatefulSet's Service as subdomain: without a
// hostname, POD.prism-dense, the name its worker announces, had no DNS
// record, and nothing could dial it.
func TestBorrowFromStatefulSet(t *testing.T) {
	dep := denseDeployment()
	sts := &appsv1.StatefulSet{ObjectMeta: dep.ObjectMeta, Spec: appsv1.StatefulSetSpec{ServiceName: "prism-dense", Selector: dep.Spec.Selector, Template: dep.Spec.Template}}
	sts.Spec.Template.Spec.Subdomain = ""
	c := fake.NewClientset(sts)
	p, _ := newLender(t, c, Options{})
	ids, err := p.Borrow(context.Background(), "dlrm", 1)
	if err != nil {
		t.Fatal(err)
	}
	pod, err := c.CoreV1().Pods(ns).Get(context.Background(), ids[0], metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pod.Spec.Hostname != ids[0] || pod.Spec.Subdomain != "prism-dense" {
		t.Errorf("hostname %q, subdomain %q: want %q under prism-dense", pod.Spec.Hostname, pod.Spec.Subdomain, ids[0])
	}
	if o := pod.OwnerReferences; len(o) != 1 || o[0].Kind != "StatefulSet" || o[0].Name != "prism-dense" || o[0].Controller != nil && *o[0].Controller {
		t.Errorf("owners %+v, want the StatefulSet, not as controller", o)
	}
}

// TestCreateErrorLeavesNoPod: a Create whose answer is lost (the API
// server's timeout, a connection cut, prism loan's SIGTERM cancelling the
// request) may have made the Pod all the same. The borrow fails, so the
// controller never returns that worker: the lender deletes the Pod
// itself, at once and, should it appear later, when it does, and again
// at Close. Forgotten, it held a training GPU until the next run of the
// lender deleted it as a leftover, or for good without one.
func TestCreateErrorLeavesNoPod(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		// late: the Pod appears only after the lender's first delete.
		late, close bool
	}{
		{"timeout", apierrors.NewTimeoutError("request did not complete within requested timeout", 0), false, false},
		{"interrupted", context.Canceled, false, true},
		{"created after the delete", errors.New("http2: client connection lost"), true, false},
		{"created after the delete, closed", errors.New("http2: client connection lost"), true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := fake.NewClientset(denseDeployment())
			var late []runtime.Object
			c.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
				obj := a.(k8stesting.CreateAction).GetObject()
				if tc.late {
					late = append(late, obj)
				} else if err := c.Tracker().Create(corev1.SchemeGroupVersion.WithResource("pods"), obj, ns); err != nil {
					t.Error(err)
				}
				return true, nil, tc.err
			})
			p, _ := newLender(t, c, Options{})
			ctx := context.Background()
			if ids, err := p.Borrow(ctx, "dlrm", 1); err == nil || len(ids) != 0 {
				t.Fatalf("borrow: %v %v, want an error", ids, err)
			}
			for _, obj := range late {
				if err := c.Tracker().Create(corev1.SchemeGroupVersion.WithResource("pods"), obj, ns); err != nil {
					t.Fatal(err)
				}
			}
			if tc.close {
				p.Close()
			}
			eventually(t, "the Pod of the failed create deleted", func() bool {
				l, err := c.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
				return err == nil && len(l.Items) == 0
			})
			if ws := p.Workers(); len(ws) != 0 {
				t.Errorf("workers %+v after a failed borrow", ws)
			}
		})
	}
	// A create the server refused made nothing: nothing is deleted (an
	// AlreadyExists names a Pod that is not this borrow's).
	c := fake.NewClientset(denseDeployment())
	c.PrependReactor("create", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		return true, nil, apierrors.NewAlreadyExists(corev1.Resource("pods"), a.(k8stesting.CreateAction).GetObject().(*corev1.Pod).Name)
	})
	p, _ := newLender(t, c, Options{})
	if _, err := p.Borrow(context.Background(), "dlrm", 1); err == nil {
		t.Fatal("borrow: no error")
	}
	p.Close()
	for _, a := range c.Actions() {
		if a.GetVerb() == "delete" {
			t.Errorf("a refused create was followed by %s %s", a.GetVerb(), a.(k8stesting.DeleteAction).GetName())
		}
	}
}

// TestIdleWholeWorkersPerNode: a worker of several devices needs them on
// one node. Free devices scattered one per node hold no such worker, and
// a node whose Pods request more than it has left (a device gone
// unhealthy under a running job) takes nothing from the others.
func TestIdleWholeWorkersPerNode(t *testing.T) {
	ctx := context.Background()
	dep := denseDeployment()
	two := resource.MustParse("2")
	res := &dep.Spec.Template.Spec.Containers[0].Resources
	res.Requests["nvidia.com/gpu"], res.Limits["nvidia.com/gpu"] = two, two
	c := fake.NewClientset(dep,
		node("train-1", "training", 8, true, false),
		node("train-2", "training", 8, true, false),
		node("train-3", "training", 8, true, false),
		node("train-4", "training", 7, true, false),
		gpuPod("job-1", "training", "train-1", 7, corev1.PodRunning), // 1 free
		gpuPod("job-2", "training", "train-2", 7, corev1.PodRunning), // 1 free
		gpuPod("job-3", "training", "train-3", 5, corev1.PodRunning), // 3 free: one worker
		gpuPod("job-4", "training", "train-4", 8, corev1.PodRunning), // over by 1
	)
	p, _ := newLender(t, c, Options{Max: 20})
	n, err := p.Idle(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Fatalf("idle %d workers of 2 GPUs, want 1 (only train-3 has 2 free)", n)
	}
	if _, err := p.Borrow(ctx, "dlrm", 1); err != nil {
		t.Fatal(err)
	}
	if n, err := p.Idle(ctx); err != nil || n != 0 {
		t.Fatalf("idle %d (%v) with the one worker lent and not yet placed, want 0", n, err)
	}
}

// TestLeftoverDeleteFails: a Pod an earlier run lent whose delete at
// start fails (the API server's hiccup) is deleted at Close. Forgotten,
// it held a training GPU and served as if owned until someone deleted it
// by hand.
func TestLeftoverDeleteFails(t *testing.T) {
	old := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "prism-dense-loan-old", Namespace: ns, Labels: map[string]string{LabelLentBy: "prism-dense-loan"}}}
	c := fake.NewClientset(denseDeployment(), old)
	failed := false
	c.PrependReactor("delete", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		if !failed {
			failed = true
			return true, nil, errors.New("connection reset")
		}
		return false, nil, nil
	})
	p, _ := newLender(t, c, Options{})
	if _, err := c.CoreV1().Pods(ns).Get(context.Background(), old.Name, metav1.GetOptions{}); err != nil || !failed {
		t.Fatalf("the leftover's first delete should have failed: %v, failed %v", err, failed)
	}
	p.Close()
	if _, err := c.CoreV1().Pods(ns).Get(context.Background(), old.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the leftover whose delete failed at start is still there after Close: %v", err)
	}
}

// TestLeftoverGoneBeforeAdopted: a leftover Pod deleted after the
// lender listed the leftovers and before it adopted that one (its adopt
// waits on the deletes and adoptions of the older ones, each an API
// call) is not adopted as running: the watch's delete came while the
// lender followed only the Pods it had lent, and the listing's copy,
// adopted, showed a worker running that no Pod held, counted as
// capacity until the borrow timeout gave it up.
func TestLeftoverGoneBeforeAdopted(t *testing.T) {
	lentBy := map[string]string{LabelLentBy: "prism-dense-loan"}
	leftover := func(name string, age time.Duration) *corev1.Pod {
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: lentBy, Annotations: map[string]string{AnnotationModel: "m"},
			CreationTimestamp: metav1.NewTime(time.Now().Add(-age).Truncate(time.Second))}}
		pod.Spec.Containers = []corev1.Container{{Name: "dense", Args: []string{"serve", "dense", "--addr", ":8600"}}}
		pod.Spec.NodeName, pod.Status.PodIP, pod.Status.Phase = "gpu-7", "10.0.0.7", corev1.PodRunning
		pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
		return pod
	}
	c := fake.NewClientset(denseDeployment(), leftover("prism-dense-loan-old", time.Hour), leftover("prism-dense-loan-young", time.Minute))
	// Watched apart, to know when the delete has reached a watch.
	w, err := c.CoreV1().Pods(ns).Watch(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	o := Options{Client: c, Namespace: ns, Template: "prism-dense", Max: 4, Pool: map[string]string{"pool": "training"},
		Tolerations: []corev1.Toleration{poolTaint(t)}, PriorityClass: "prism-loan"}
	o.Logf = func(f string, a ...any) {
		if !strings.HasPrefix(f, "adopting") || a[0] != "prism-dense-loan-old" {
			return
		}
		// Between the listing and the young one's adoption: the
		// cluster deletes it (preempted, its node drained).
		if err := c.CoreV1().Pods(ns).Delete(context.Background(), "prism-dense-loan-young", metav1.DeleteOptions{}); err != nil {
			t.Error(err)
		}
		for ev := range w.ResultChan() {
			if ev.Type == "DELETED" {
				break
			}
		}
		time.Sleep(100 * time.Millisecond) // the lender's watch hears it too
	}
	p, err := New(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	eventually(t, "the deleted leftover not lent as running", func() bool {
		for _, lw := range p.Workers() {
			if lw.ID == "prism-dense-loan-young" && lw.Running {
				return false
			}
		}
		return true
	})
	if ws := p.Workers(); len(ws) == 0 || ws[0].ID != "prism-dense-loan-old" || !ws[0].Running {
		t.Errorf("workers %+v, want the old leftover adopted, running", ws)
	}
}

// TestDetachKeepsLentPods: a lender detached (prism loan --on-exit
// keep) deletes none of its Pods, and its next run adopts them.
func TestDetachKeepsLentPods(t *testing.T) {
	c := fake.NewClientset(denseDeployment())
	p, _ := newLender(t, c, Options{})
	ids, err := p.Borrow(context.Background(), "dlrm", 2)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		pod, err := c.CoreV1().Pods(ns).Get(context.Background(), id, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		pod.Status.Phase = corev1.PodRunning
		if _, err := c.CoreV1().Pods(ns).UpdateStatus(context.Background(), pod, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	p.Detach()
	p.Close() // after Detach: nothing more
	for _, a := range c.Actions() {
		if a.GetVerb() == "delete" {
			t.Errorf("a detached lender deleted %s", a.(k8stesting.DeleteAction).GetName())
		}
	}
	next, _ := newLender(t, c, Options{})
	var got []string
	for _, w := range next.Workers() {
		got = append(got, w.ID)
	}
	slices.Sort(got)
	slices.Sort(ids)
	if !slices.Equal(got, ids) {
		t.Fatalf("the next run's workers %v, want the detached run's %v, adopted", got, ids)
	}
}

// TestLeftoverFromAClockAhead: a leftover's creation time is the API
// server's; with that clock ahead of this host's, the adopted worker is
// still lent before the workers borrowed after it, and ready after it
// was lent, not before.
func TestLeftoverFromAClockAhead(t *testing.T) {
	var mu sync.Mutex
	clock := time.Now()
	now := func() time.Time { mu.Lock(); defer mu.Unlock(); return clock }
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "prism-dense-loan-left", Namespace: ns, Labels: map[string]string{LabelLentBy: "prism-dense-loan"},
		Annotations:       map[string]string{AnnotationModel: "m"},
		CreationTimestamp: metav1.NewTime(clock.Add(2 * time.Minute).Truncate(time.Second))}} // the API server's clock, 2 minutes ahead
	pod.Spec.Containers = []corev1.Container{{Name: "dense", Args: []string{"serve", "dense", "--addr", ":8600"}}}
	pod.Status.Phase = corev1.PodRunning
	pod.Spec.NodeName, pod.Status.PodIP = "gpu-7", "10.0.0.7"
	pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	c := fake.NewClientset(denseDeployment(), pod)
	p, _ := newLender(t, c, Options{Max: 2, Now: now})
	mu.Lock()
	clock = clock.Add(time.Second)
	mu.Unlock()
	ids, err := p.Borrow(context.Background(), "m", 1)
	if err != nil {
		t.Fatal(err)
	}
	ws := p.Workers()
	if len(ws) != 2 || ws[0].ID != pod.Name || ws[1].ID != ids[0] {
		t.Fatalf("workers %+v, want the adopted leftover, then %s lent after it", ws, ids[0])
	}
	if w := ws[0]; w.Ready.IsZero() || w.Ready.Before(w.Lent) {
		t.Errorf("the adopted leftover lent at %s, ready at %s: want ready, and not before it was lent", w.Lent, w.Ready)
	}
}
