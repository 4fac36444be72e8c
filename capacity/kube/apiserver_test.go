package kube

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
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
