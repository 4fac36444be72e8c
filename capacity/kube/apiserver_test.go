package kube

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/prism-serve/prism/internal/kubetest"
)

// TestLenderOnAPIServer runs the lender against a real API server
// (internal/kubetest; skipped without it). The server validates and
// admits the lent Pod: its spec, the PriorityClass resolved to its value
// (the Priority admission plugin), the owner reference. There is no
// kubelet and no scheduler, so the Pods are never placed nor run: the
// test binds one to the pool's node by hand (as the scheduler would),
// simulates a preemption by deleting it with a grace period, as the
// scheduler does, and checks the reclaim report; a drain and a return
// leave no Pod. The worker's SIGTERM and its leaving the registry are
// the kubelet's and the dense worker's part, not run here.
func TestLenderOnAPIServer(t *testing.T) {
	c, _ := startCluster(t)
	ctx := context.Background()
	// Training holds 5 of the node's 8 GPUs.
	job := gpuPod("job-0", ns, "train-1", 5, "")
	job.Spec.Tolerations = []corev1.Toleration{poolTaint(t)}
	job.Spec.Containers[0].Image = "trainer"
	if _, err := c.CoreV1().Pods(ns).Create(ctx, job, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	p, _ := newLender(t, c, Options{Max: 4})
	idle := func() int {
		t.Helper()
		k, err := p.Idle(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	if k := idle(); k != 3 {
		t.Fatalf("idle %d, want 3 (8 GPUs, 5 requested)", k)
	}
	ids, err := p.Borrow(ctx, "dlrm", 2)
	if err != nil {
		t.Fatalf("borrow on a real API server: %v", err)
	}
	pod, err := c.CoreV1().Pods(ns).Get(ctx, ids[0], metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if pod.Spec.Priority == nil || *pod.Spec.Priority != -10 || pod.Spec.PriorityClassName != "prism-loan" {
		t.Errorf("priority %v (class %q): want the class's -10, resolved by the server", pod.Spec.Priority, pod.Spec.PriorityClassName)
	}
	if k := idle(); k != 1 {
		t.Errorf("idle %d with 2 lent not yet placed, want 1", k)
	}

	// Bind the first to the node, as the scheduler would.
	if err := c.CoreV1().Pods(ns).Bind(ctx, &corev1.Binding{ObjectMeta: metav1.ObjectMeta{Name: ids[0], Namespace: ns}, Target: corev1.ObjectReference{Kind: "Node", Name: "train-1"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the bound Pod seen", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.workers[ids[0]].nodeName == "train-1"
	})
	if k := idle(); k != 1 {
		t.Errorf("idle %d with 1 lent placed and 1 not, want 1", k)
	}

	// Preemption: the scheduler deletes the victim with its grace; with
	// no kubelet the Pod stays, terminating, with the deletion recorded.
	start := time.Now()
	if err := c.CoreV1().Pods(ns).Delete(ctx, ids[0], metav1.DeleteOptions{GracePeriodSeconds: new(int64(15))}); err != nil {
		t.Fatal(err)
	}
	r := reclaim(t, p)
	if r.Worker != ids[0] || r.Grace != 15*time.Second {
		t.Errorf("reclaim %+v, want %s with 15s grace", r, ids[0])
	}
	t.Logf("preemption reported as a reclaim %v after the delete", time.Since(start).Round(time.Millisecond))
	// The controller drains it (already terminating: left to its grace)
	// and returns it at the grace's end: the Pod is deleted.
	if err := p.Drain(ctx, ids[0]); err != nil {
		t.Fatal(err)
	}
	if err := p.Return(ctx, ids[0]); err != nil {
		t.Fatal(err)
	}
	// The second is drained and returned by the controller: no reclaim.
	if err := p.Drain(ctx, ids[1]); err != nil {
		t.Fatal(err)
	}
	noReclaim(t, p)
	if err := p.Return(ctx, ids[1]); err != nil {
		t.Fatal(err)
	}
	// With no kubelet to confirm, a bound Pod stays terminating; the
	// unbound one is removed at once.
	if _, err := c.CoreV1().Pods(ns).Get(ctx, ids[1], metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the returned unplaced Pod: %v, want it gone", err)
	}
	pod, err = c.CoreV1().Pods(ns).Get(ctx, ids[0], metav1.GetOptions{})
	if err == nil && (pod.DeletionTimestamp == nil || *pod.DeletionGracePeriodSeconds > 1) {
		t.Errorf("the returned placed Pod: deletion %v grace %v, want it deleting with the return's 1s", pod.DeletionTimestamp, pod.DeletionGracePeriodSeconds)
	}
	if len(p.Workers()) != 0 {
		t.Errorf("workers %+v", p.Workers())
	}
}

// startCluster starts an API server (or skips) holding what a lender
// needs: the namespace ns with the dense Deployment, the PriorityClass
// prism-loan (-10) and the training pool's node train-1 (8 GPUs, the
// pool's taint). It returns an admin's client and its configuration.
func startCluster(t *testing.T) (kubernetes.Interface, *rest.Config) {
	t.Helper()
	s := kubetest.Start(t)
	cfg, err := clientcmd.BuildConfigFromFlags("", s.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.SchedulingV1().PriorityClasses().Create(ctx, &schedulingv1.PriorityClass{
		ObjectMeta: metav1.ObjectMeta{Name: "prism-loan"}, Value: -10, Description: "lent dense workers: below training, so training preempts them",
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	n := node("train-1", "training", 8, true, false)
	n.Spec.Taints = []corev1.Taint{{Key: "pool", Value: "training", Effect: corev1.TaintEffectNoSchedule}}
	status := n.Status
	if n, err = c.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	n.Status = status
	n.Status.Capacity = status.Allocatable
	if _, err := c.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.AppsV1().Deployments(ns).Create(ctx, denseDeployment(), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return c, cfg
}

// TestDryRunOnAPIServer: the Pod a lender would lend, sent with a
// server-side dry run, is admitted (its priority resolved from the
// class) or refused with the server's reason (a PriorityClass that does
// not exist, a quota it would exceed, a client without the right to
// create Pods), and none is stored; Access names what else the client
// may not do, and a template that does not exist fails Inspect.
func TestDryRunOnAPIServer(t *testing.T) {
	c, cfg := startCluster(t)
	ctx := context.Background()
	// A namespace whose quota allows no GPU, with its own dense
	// Deployment. With no controller manager the quota's status (what
	// admission reads) is set by hand, as the quota controller would.
	quotaNS := ns + "-quota"
	if _, err := c.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: quotaNS}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	dep := denseDeployment()
	dep.Namespace = quotaNS
	if _, err := c.AppsV1().Deployments(quotaNS).Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	none := corev1.ResourceList{"requests.nvidia.com/gpu": resource.MustParse("0")}
	q, err := c.CoreV1().ResourceQuotas(quotaNS).Create(ctx, &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: "no-gpus"}, Spec: corev1.ResourceQuotaSpec{Hard: none}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	q.Status = corev1.ResourceQuotaStatus{Hard: none, Used: none}
	if _, err := c.CoreV1().ResourceQuotas(quotaNS).UpdateStatus(ctx, q, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	// A user who may read the template and list Pods, and no more.
	if _, err := c.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "reader"}, Rules: []rbacv1.PolicyRule{
		{APIGroups: []string{"apps"}, Resources: []string{"deployments", "statefulsets"}, Verbs: []string{"get"}},
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list"}},
	}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "reader"},
		Subjects: []rbacv1.Subject{{Kind: rbacv1.UserKind, Name: "reader"}}, RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "reader"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	readerCfg := rest.CopyConfig(cfg)
	readerCfg.Impersonate = rest.ImpersonationConfig{UserName: "reader"}
	reader, err := kubernetes.NewForConfig(readerCfg)
	if err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name       string
		client     kubernetes.Interface
		namespace  string
		template   string
		class      string
		inspectErr string
		dryRunErr  string
		accessErr  []string
	}{
		{name: "admitted"},
		{name: "no such PriorityClass", class: "prism-lone", dryRunErr: "no PriorityClass with name prism-lone was found"},
		{name: "quota exceeded", namespace: quotaNS, dryRunErr: "exceeded quota: no-gpus"},
		{name: "no such template", template: "prism-nope", inspectErr: "StatefulSet or Deployment prism/prism-nope"},
		{name: "no right to create", client: reader, dryRunErr: `User "reader" cannot create resource "pods"`,
			accessErr: []string{"may not delete pods in prism", "may not watch pods in prism", "may not list nodes cluster-wide", "may not list pods cluster-wide"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := Options{Client: c, Namespace: ns, Template: "prism-dense", Max: 4, Pool: map[string]string{"pool": "training"},
				Tolerations: []corev1.Toleration{poolTaint(t)}, PriorityClass: "prism-loan"}
			if tc.client != nil {
				o.Client = tc.client
			}
			if tc.namespace != "" {
				o.Namespace = tc.namespace
			}
			if tc.template != "" {
				o.Template = tc.template
			}
			if tc.class != "" {
				o.PriorityClass = tc.class
			}
			p, err := Inspect(ctx, o)
			if tc.inspectErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.inspectErr) {
					t.Fatalf("inspect: %v, want an error with %q", err, tc.inspectErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			pod, err := p.DryRun(ctx, "dlrm")
			switch {
			case tc.dryRunErr != "":
				if err == nil || !strings.Contains(err.Error(), tc.dryRunErr) {
					t.Errorf("dry run: %v, want an error with %q", err, tc.dryRunErr)
				}
			case err != nil:
				t.Errorf("dry run: %v", err)
			default:
				if pod.Spec.Priority == nil || *pod.Spec.Priority != -10 || pod.Spec.NodeSelector["pool"] != "training" || pod.Labels[LabelLentBy] != "prism-dense-loan" {
					t.Errorf("the dry run's Pod: priority %v, node selector %v, labels %v: want the class's -10 and the pool's", pod.Spec.Priority, pod.Spec.NodeSelector, pod.Labels)
				}
			}
			err = p.Access(ctx)
			for _, want := range tc.accessErr {
				if err == nil || !strings.Contains(err.Error(), want) {
					t.Errorf("access: %v, want an error with %q", err, want)
				}
			}
			if len(tc.accessErr) == 0 && err != nil {
				t.Errorf("access: %v", err)
			}
			if ids, err := p.Borrow(ctx, "dlrm", 1); err == nil || len(ids) > 0 {
				t.Errorf("an inspected lender lent %v (%v)", ids, err)
			}
		})
	}
	// Nothing was stored: no Pod in either namespace.
	for _, n := range []string{ns, quotaNS} {
		pods, err := c.CoreV1().Pods(n).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(pods.Items) != 0 {
			t.Errorf("%d Pods stored in %s after dry runs: %s", len(pods.Items), n, pods.Items[0].Name)
		}
	}
	p, err := Inspect(ctx, Options{Client: c, Namespace: ns, Template: "prism-dense", Max: 4, Pool: map[string]string{"pool": "training"}, PriorityClass: "prism-loan"})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if lent, err := p.Lent(ctx); err != nil || len(lent) != 0 {
		t.Errorf("lent %v (%v), want none", lent, err)
	}
}
