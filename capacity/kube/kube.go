// Package kube is the Kubernetes lender of capacity loaning: a borrowed
// dense worker is a Pod placed on the training pool's nodes. Its spec is
// the chart's dense worker's (the pod template of the dense StatefulSet:
// same image, arguments, certificates Secret, GPU or MIG request), with
// the pool's node selector, a toleration of the pool's taint and a
// PriorityClass below training's, so that training preempts it. The
// lender watches its Pods: one deleted, evicted or preempted by someone
// else is a reclaim, with the Pod's grace period (the kubelet sends the
// worker SIGTERM, on which it leaves the router's registry and finishes
// what it holds). Drain and return delete the Pod with a grace period,
// to the same effect. Idle counts the pool's allocatable GPUs (or MIG
// slices) minus what the Pods on those nodes request.
//
// It links client-go: only commands import it (internal/archtest).
package kube

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	coreinformers "k8s.io/client-go/informers/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"

	"github.com/prism-serve/prism/capacity"
)

// Labels and annotations of a lent Pod.
const (
	// LabelLentBy names the lender that made the Pod (Options.Name): it
	// finds its Pods, and its leftovers at start, by it.
	LabelLentBy = "prism.dev/lent-by"
	// AnnotationModel is the model the controller borrowed the worker for.
	AnnotationModel = "prism.dev/loan-model"
)

// Options configure the Kubernetes lender.
type Options struct {
	// Client reaches the API server (a fake clientset in tests).
	Client kubernetes.Interface
	// Namespace holds the dense StatefulSet and the lent Pods.
	Namespace string
	// Template is the StatefulSet (the chart's dense workers,
	// RELEASE-dense), or a Deployment, whose pod template a lent worker
	// runs. It also owns the lent Pods, so uninstalling the release
	// deletes them (a Deployment as their controller, so its ReplicaSets
	// do not adopt them; a StatefulSet not, as it would release pods
	// that are not its ordinals).
	Template string
	// Name is the lender's name, the value of the Pods' LabelLentBy
	// (default: Template + "-loan").
	Name string
	// Max is how many workers it lends at once.
	Max int
	// Pool are the labels of the training pool's nodes (a node selector:
	// every one must match).
	Pool map[string]string
	// Tolerations of the pool's taints (ParseTaint).
	Tolerations []corev1.Toleration
	// PriorityClass is the lent Pods' PriorityClass: below training's,
	// so that the scheduler preempts them for training Pods. It must
	// exist.
	PriorityClass string
	// Resource is the GPU or MIG resource a lent worker asks for on the
	// pool (nvidia.com/gpu, nvidia.com/mig-1g.10gb); "": the template's.
	// Idle counts it.
	Resource corev1.ResourceName
	// Grace is the grace period of drains and of the deletes at Close
	// (0: the template's terminationGracePeriodSeconds).
	Grace time.Duration
	// IdleRefresh is how long a count of the pool's idle devices is
	// reused (0: counted at each call; the driver calls every tick).
	IdleRefresh time.Duration
	// Logf reports what the lender does (default: discarded).
	Logf func(format string, args ...any)
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// EnsureDefaults fills zero fields.
func (o *Options) EnsureDefaults() {
	if o.Name == "" && o.Template != "" {
		o.Name = o.Template + "-loan"
	}
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
	if o.Now == nil {
		o.Now = time.Now
	}
}

// Validate checks o after EnsureDefaults.
func (o *Options) Validate() error {
	var errs []error
	if o.Client == nil {
		errs = append(errs, errors.New("kubernetes lender: no API client"))
	}
	if o.Namespace == "" || o.Template == "" {
		errs = append(errs, errors.New("kubernetes lender: the namespace and the dense StatefulSet or Deployment (template=) are needed"))
	}
	if o.Max < 1 {
		errs = append(errs, fmt.Errorf("kubernetes lender: max %d, want at least 1", o.Max))
	}
	if len(o.Pool) == 0 {
		errs = append(errs, errors.New("kubernetes lender: no pool: the training pool's node labels (pool=KEY=VALUE) are needed"))
	}
	if o.PriorityClass == "" {
		errs = append(errs, errors.New("kubernetes lender: no priority class: one below training's is needed, so that training preempts lent workers"))
	}
	if o.Grace < 0 || o.IdleRefresh < 0 {
		errs = append(errs, errors.New("kubernetes lender: grace and idle-refresh must not be negative"))
	}
	if errs := validateLabels(o.Pool); errs != nil {
		return errors.Join(append([]error{errors.New("kubernetes lender: pool")}, errs...)...)
	}
	return errors.Join(errs...)
}

func validateLabels(m map[string]string) []error {
	if len(m) == 0 {
		return nil
	}
	if _, err := labels.ValidatedSelectorFromSet(m); err != nil {
		return []error{err}
	}
	return nil
}

// ParseTaint reads a taint of the pool as KEY[=VALUE][:EFFECT] and
// returns the toleration of it (no effect: every effect of the key).
func ParseTaint(s string) (corev1.Toleration, error) {
	t := corev1.Toleration{Operator: corev1.TolerationOpExists}
	kv, effect, hasEffect := strings.Cut(s, ":")
	if hasEffect {
		switch e := corev1.TaintEffect(effect); e {
		case corev1.TaintEffectNoSchedule, corev1.TaintEffectPreferNoSchedule, corev1.TaintEffectNoExecute:
			t.Effect = e
		default:
			return t, fmt.Errorf("taint %q: effect %q, want NoSchedule, PreferNoSchedule or NoExecute", s, effect)
		}
	}
	k, v, hasValue := strings.Cut(kv, "=")
	if k == "" {
		return t, fmt.Errorf("taint %q: no key (want KEY[=VALUE][:EFFECT])", s)
	}
	t.Key = k
	if hasValue {
		t.Operator, t.Value = corev1.TolerationOpEqual, v
	}
	return t, nil
}

// ParsePool reads KEY=VALUE node labels.
func ParsePool(kvs []string) (map[string]string, error) {
	m := map[string]string{}
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("pool %q: want a node label KEY=VALUE", kv)
		}
		m[k] = v
	}
	return m, nil
}

// Provider lends dense-worker Pods on the training pool.
type Provider struct {
	o        Options
	template corev1.PodTemplateSpec
	owner    metav1.OwnerReference
	resource corev1.ResourceName // what Idle counts ("" : none)
	per      int64               // of it per worker
	grace    *int64              // of drains (nil: the Pod's)
	informer cache.SharedIndexInformer
	stop     chan struct{}
	dry      bool // Inspect's: lends nothing

	mu       sync.Mutex
	workers  map[string]*worker
	reclaims chan capacity.ProviderReclaim
	closed   bool
	idleAt   time.Time
	idleFree int64 // workers free at idleAt, lent Pods not yet bound counted as taken
	idleLent int   // workers lent at idleAt

	// abandoned are Pods whose Create failed without saying the server
	// refused them (a timeout, a lost connection, a cancelled request):
	// they may exist, or appear later, lent to nobody. They are deleted
	// when seen, and at Close.
	abandoned map[string]bool
}

// worker is one lent Pod.
type worker struct {
	id, model string
	lent      time.Time
	ready     time.Time
	addr      string
	nodeName  string
	running   bool // the Pod exists and has not ended
	draining  bool // Drain was called
	deleting  bool // this lender deleted the Pod
	// deleteFailed: a delete of this lender's failed (it may not have
	// happened): Return and Close delete it again.
	deleteFailed bool
	reclaimed    bool // reported as a reclaim
	gone         bool // the Pod is deleted
}

var _ capacity.Provider = (*Provider)(nil)

// New reads the dense StatefulSet's (or Deployment's) pod template, starts watching the
// lender's Pods, adopts the running Pods a previous run of this lender
// left (up to Max: adopt), and deletes (with their grace) the others.
// o is defaulted and validated.
func New(ctx context.Context, o Options) (*Provider, error) {
	p, err := load(ctx, o)
	if err != nil {
		return nil, err
	}
	if err := p.watch(ctx); err != nil {
		return nil, err
	}
	left := make([]*corev1.Pod, 0, len(p.informer.GetStore().List()))
	for _, obj := range p.informer.GetStore().List() {
		left = append(left, obj.(*corev1.Pod))
	}
	// Oldest first: adopted up to Max, the longest serving kept.
	slices.SortFunc(left, func(a, b *corev1.Pod) int {
		if c := a.CreationTimestamp.Time.Compare(b.CreationTimestamp.Time); c != 0 {
			return c
		}
		return strings.Compare(a.Name, b.Name)
	})
	for _, pod := range left {
		if pod.DeletionTimestamp != nil {
			continue
		}
		if p.adopt(pod) {
			continue
		}
		p.o.Logf("deleting %s, left lent by an earlier run", pod.Name)
		if err := p.delete(ctx, pod.Name, p.grace); err != nil {
			// Lent to nobody, it would hold the pool's device (and
			// serve, counted as an owned worker) until deleted by
			// hand: deleted again when the watch sees it, and at Close.
			p.o.Logf("delete %s: %v", pod.Name, err)
			p.mu.Lock()
			p.abandoned[pod.Name] = true
			p.mu.Unlock()
		}
	}
	return p, nil
}

// Inspect returns the lender New would, reading its template only: no
// watch, and the Pods an earlier run lent neither adopted nor deleted.
// It lends nothing (Borrow refuses): for prism loan --dry-run, whose
// driver observes (Idle, Workers) and carries out no decision, and for
// DryRun. o is defaulted and validated.
func Inspect(ctx context.Context, o Options) (*Provider, error) {
	p, err := load(ctx, o)
	if err != nil {
		return nil, err
	}
	p.dry = true
	return p, nil
}

// DryRun sends the Pod Borrow would create for model to the API server
// with a server-side dry run: authorization (this lender's right to
// create Pods), admission (the PriorityClass resolved, or refused when
// it does not exist; quotas; LimitRanges; webhooks) and validation run
// as for a real create, and nothing is stored. It returns the Pod as
// the server answered it; an error carries the server's reason.
func (p *Provider) DryRun(ctx context.Context, model string) (*corev1.Pod, error) {
	pod := p.PodFor(podName(p.o.Template), model)
	got, err := p.o.Client.CoreV1().Pods(p.o.Namespace).Create(ctx, pod, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	if err != nil {
		return nil, fmt.Errorf("kubernetes lender: the API server refused the lent Pod %s/%s (dry run): %w", p.o.Namespace, pod.Name, err)
	}
	return got, nil
}

// Lent lists the Pods this lender's name labels in its namespace, lent
// by a run now or before (New adopts them up to Max and deletes the
// rest), without touching them.
func (p *Provider) Lent(ctx context.Context) ([]string, error) {
	sel := labels.SelectorFromSet(labels.Set{LabelLentBy: p.o.Name}).String()
	pods, err := p.o.Client.CoreV1().Pods(p.o.Namespace).List(ctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		return nil, fmt.Errorf("kubernetes lender: list the Pods %s in %s: %w", sel, p.o.Namespace, err)
	}
	var names []string
	for _, pod := range pods.Items {
		names = append(names, pod.Name)
	}
	slices.Sort(names)
	return names, nil
}

// Access asks the API server whether this client may do what a lender
// does besides creating its Pods (DryRun checks that): delete them (a
// lender that may not lends and never returns), list and watch them in
// its namespace, and, when Idle counts a device, list the Nodes and the
// Pods of every namespace. One error for each thing denied.
func (p *Provider) Access(ctx context.Context) error {
	checks := []authorizationv1.ResourceAttributes{
		{Namespace: p.o.Namespace, Verb: "delete", Resource: "pods"},
		{Namespace: p.o.Namespace, Verb: "list", Resource: "pods"},
		{Namespace: p.o.Namespace, Verb: "watch", Resource: "pods"},
	}
	if p.resource != "" {
		checks = append(checks, authorizationv1.ResourceAttributes{Verb: "list", Resource: "nodes"}, authorizationv1.ResourceAttributes{Verb: "list", Resource: "pods"})
	}
	var errs []error
	for _, c := range checks {
		where := "in " + c.Namespace
		if c.Namespace == "" {
			where = "cluster-wide"
		}
		r, err := p.o.Client.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{
			Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &c},
		}, metav1.CreateOptions{})
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("kubernetes lender: may it %s %s %s? %w", c.Verb, c.Resource, where, err))
		case !r.Status.Allowed:
			why := r.Status.Reason
			if why == "" {
				why = "no RBAC rule allows it"
			}
			errs = append(errs, fmt.Errorf("kubernetes lender: may not %s %s %s (%s)", c.Verb, c.Resource, where, why))
		}
	}
	return errors.Join(errs...)
}

// load reads the template and builds the lender; it starts nothing.
// o is defaulted and validated.
func load(ctx context.Context, o Options) (*Provider, error) {
	o.EnsureDefaults()
	if err := o.Validate(); err != nil {
		return nil, err
	}
	// The dense workers' StatefulSet (the chart's), or a Deployment.
	var (
		t         *corev1.PodTemplateSpec
		owner     metav1.OwnerReference
		subdomain string
	)
	sts, err := o.Client.AppsV1().StatefulSets(o.Namespace).Get(ctx, o.Template, metav1.GetOptions{})
	switch {
	case err == nil:
		t, subdomain = &sts.Spec.Template, sts.Spec.ServiceName
		owner = metav1.OwnerReference{APIVersion: "apps/v1", Kind: "StatefulSet", Name: sts.Name, UID: sts.UID}
	case apierrors.IsNotFound(err):
		dep, derr := o.Client.AppsV1().Deployments(o.Namespace).Get(ctx, o.Template, metav1.GetOptions{})
		if derr != nil {
			return nil, fmt.Errorf("kubernetes lender: the dense workers' StatefulSet or Deployment %s/%s: %w", o.Namespace, o.Template, derr)
		}
		t, subdomain = &dep.Spec.Template, dep.Spec.Template.Spec.Subdomain
		owner = metav1.OwnerReference{APIVersion: "apps/v1", Kind: "Deployment", Name: dep.Name, UID: dep.UID, Controller: new(true)}
	default:
		return nil, fmt.Errorf("kubernetes lender: the dense workers' StatefulSet %s/%s: %w", o.Namespace, o.Template, err)
	}
	p := &Provider{o: o, workers: map[string]*worker{}, abandoned: map[string]bool{}, reclaims: make(chan capacity.ProviderReclaim, 64), stop: make(chan struct{})}
	if err := p.setTemplate(t, owner, subdomain); err != nil {
		return nil, err
	}
	return p, nil
}

// adopt takes a Pod an earlier run of this lender lent, still running
// and naming its model, as lent by this one (up to Max), and says
// whether it did: a run that ended without Close (killed, its node
// lost, out of memory) left workers serving a peak, which deleting
// took from the peak at once, and borrowing again returned minutes
// later. The controller adopts it as a borrowed worker nobody asked
// for, returned as any other once demand falls.
func (p *Provider) adopt(pod *corev1.Pod) bool {
	model := pod.Annotations[AnnotationModel]
	if model == "" || len(pod.Spec.Containers) == 0 || pod.Status.Phase == corev1.PodFailed || pod.Status.Phase == corev1.PodSucceeded {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.workers) >= p.o.Max {
		return false
	}
	// The Pod as the watch has it now, read under p.mu: an event the
	// watch took before (the listing's copy older), onPod dropped, not
	// following the Pod yet; one after waits on p.mu, and finds it lent.
	obj, ok, err := p.informer.GetStore().Get(pod)
	if err != nil || !ok {
		return true // deleted since the listing: nothing to adopt or delete
	}
	pod = obj.(*corev1.Pod)
	// Lent when the API server made it, by the API server's clock: one
	// ahead of this host's stamped it after the workers lent from now
	// on (listed before it, oldest first) and after its own readiness
	// (a negative time from lent to serving in the log and the loan's
	// events). Not after now, then.
	lent := pod.CreationTimestamp.Time
	if now := p.o.Now(); lent.IsZero() || lent.After(now) {
		lent = now
	}
	w := &worker{id: pod.Name, model: model, lent: lent, running: true}
	p.workers[pod.Name] = w
	p.o.Logf("adopting %s (model %s), lent by an earlier run", pod.Name, model)
	p.follow(w, pod, false) // its address, node and readiness, its end or delete
	return true
}

// setTemplate takes the dense worker's pod template from tmpl, owned by
// owner, and fits it to the pool; a lent pod's DNS name is POD.subdomain
// ("": none).
func (p *Provider) setTemplate(tmpl *corev1.PodTemplateSpec, owner metav1.OwnerReference, subdomain string) error {
	t := *tmpl.DeepCopy()
	if len(t.Spec.Containers) == 0 {
		return fmt.Errorf("kubernetes lender: %s %s has no container", owner.Kind, owner.Name)
	}
	// A StatefulSet's owner reference is not its controller's: it would
	// release pods that are not its ordinals (a Deployment controls its
	// pods through ReplicaSets, so it takes the lent ones as its own).
	p.owner = owner
	t.Spec.Subdomain = subdomain
	// The pool, not the serving pool: its nodes, its taint, a priority
	// below training's.
	t.Spec.NodeName = ""
	t.Spec.NodeSelector = maps.Clone(p.o.Pool)
	if a := t.Spec.Affinity; a != nil {
		a.NodeAffinity = nil
		if a.PodAffinity == nil && a.PodAntiAffinity == nil {
			t.Spec.Affinity = nil
		}
	}
	for _, tol := range p.o.Tolerations {
		if !slices.ContainsFunc(t.Spec.Tolerations, func(x corev1.Toleration) bool { return x.MatchToleration(&tol) }) {
			t.Spec.Tolerations = append(t.Spec.Tolerations, tol)
		}
	}
	t.Spec.PriorityClassName = p.o.PriorityClass
	t.Spec.Priority = nil // the admission resolves it from the class
	// The device: the template's GPU or MIG resource, or Options.Resource
	// in its place with the same count.
	c := &t.Spec.Containers[0]
	from, count := deviceOf(c)
	p.resource = from
	if p.o.Resource != "" {
		p.resource = p.o.Resource
		if count == 0 {
			count = 1
		}
		if from != "" {
			delete(c.Resources.Requests, from)
			delete(c.Resources.Limits, from)
		}
		q := *resource.NewQuantity(count, resource.DecimalSI)
		if c.Resources.Requests == nil {
			c.Resources.Requests = corev1.ResourceList{}
		}
		if c.Resources.Limits == nil {
			c.Resources.Limits = corev1.ResourceList{}
		}
		c.Resources.Requests[p.resource], c.Resources.Limits[p.resource] = q, q
	}
	p.per = count
	if t.Labels == nil {
		t.Labels = map[string]string{}
	}
	t.Labels[LabelLentBy] = p.o.Name
	if p.o.Grace > 0 {
		p.grace = new(int64(p.o.Grace.Round(time.Second) / time.Second))
	}
	p.template = t
	return nil
}

// deviceOf is the container's GPU or MIG resource and its count: the
// first extended resource (a name with a domain) it limits or requests
// whose name says a GPU or a MIG slice (nvidia.com/gpu, amd.com/gpu,
// nvidia.com/mig-1g.10gb), else the first extended resource. By name
// order alone, a NIC asked for beside the GPU (intel.com/sriov_netdevice,
// for RDMA) was taken for the device.
func deviceOf(c *corev1.Container) (corev1.ResourceName, int64) {
	extended := func(name corev1.ResourceName) bool {
		return strings.Contains(string(name), "/") && !strings.HasPrefix(string(name), "kubernetes.io/") && !strings.Contains(string(name), ".kubernetes.io/")
	}
	gpu := func(name corev1.ResourceName) bool {
		_, n, _ := strings.Cut(string(name), "/")
		return strings.Contains(n, "gpu") || strings.HasPrefix(n, "mig-")
	}
	for _, want := range []func(corev1.ResourceName) bool{gpu, func(corev1.ResourceName) bool { return true }} {
		for _, l := range []corev1.ResourceList{c.Resources.Limits, c.Resources.Requests} {
			for _, name := range slices.Sorted(maps.Keys(l)) {
				if extended(name) && want(name) {
					q := l[name]
					return name, q.Value()
				}
			}
		}
	}
	return "", 0
}

// PodFor is the Pod a worker named name runs in (exported for tests and
// `kubectl`-minded readers).
func (p *Provider) PodFor(name, model string) *corev1.Pod {
	t := p.template.DeepCopy()
	pod := &corev1.Pod{ObjectMeta: t.ObjectMeta, Spec: t.Spec}
	pod.Name, pod.Namespace = name, p.o.Namespace
	pod.GenerateName = ""
	pod.OwnerReferences = []metav1.OwnerReference{p.owner}
	if pod.Annotations == nil {
		pod.Annotations = map[string]string{}
	}
	pod.Annotations[AnnotationModel] = model
	// The DNS name the worker may advertise, POD.SUBDOMAIN, exists
	// only for a pod whose hostname is set: as a StatefulSet's pods'
	// are, its own name.
	pod.Spec.Hostname = ""
	if pod.Spec.Subdomain != "" {
		pod.Spec.Hostname = name
	}
	return pod
}

// watch starts the informer of the lender's Pods and waits for its
// first list.
func (p *Provider) watch(ctx context.Context) error {
	sel := labels.SelectorFromSet(labels.Set{LabelLentBy: p.o.Name}).String()
	// The generated informer keeps the client's watch-list semantics
	// (a fake clientset has none).
	p.informer = coreinformers.NewFilteredPodInformer(p.o.Client, p.o.Namespace, 0, cache.Indexers{},
		func(opts *metav1.ListOptions) { opts.LabelSelector = sel })
	_, err := p.informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { p.onPod(obj, false) },
		UpdateFunc: func(_, obj any) { p.onPod(obj, false) },
		DeleteFunc: func(obj any) { p.onPod(obj, true) },
	})
	if err != nil {
		return err
	}
	go p.informer.Run(p.stop)
	if !cache.WaitForCacheSync(ctx.Done(), p.informer.HasSynced) {
		close(p.stop)
		return fmt.Errorf("kubernetes lender: the watch of Pods %s in %s did not sync: %w", sel, p.o.Namespace, ctx.Err())
	}
	return nil
}

// onPod follows a lent Pod: its address once it runs, its readiness,
// its end, and a delete this lender did not make (a reclaim).
func (p *Provider) onPod(obj any, deleted bool) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	w := p.workers[pod.Name]
	if w == nil && p.abandoned[pod.Name] {
		switch {
		case deleted:
			delete(p.abandoned, pod.Name)
		case pod.DeletionTimestamp == nil:
			p.o.Logf("deleting %s: its create failed, but it was made", pod.Name)
			go func(name string) {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				if err := p.delete(ctx, name, p.grace); err != nil {
					p.o.Logf("delete %s: %v", name, err)
				}
			}(pod.Name)
		}
		return
	}
	if w == nil {
		return
	}
	p.follow(w, pod, deleted)
}

// follow is onPod for the lent worker w; p.mu is held.
func (p *Provider) follow(w *worker, pod *corev1.Pod, deleted bool) {
	if w.gone {
		return
	}
	if pod.Spec.NodeName != "" {
		w.nodeName = pod.Spec.NodeName
	}
	if deleted {
		w.gone, w.running = true, false
		if !w.deleting {
			var grace time.Duration
			if pod.DeletionGracePeriodSeconds != nil {
				grace = time.Duration(*pod.DeletionGracePeriodSeconds) * time.Second
			}
			p.reclaim(w, grace, "its Pod was deleted by another party")
		}
		p.o.Logf("lent Pod %s is deleted", w.id)
		return
	}
	switch pod.Status.Phase {
	case corev1.PodFailed, corev1.PodSucceeded:
		if w.running {
			w.running = false
			p.o.Logf("lent Pod %s ended: %s %s %s", w.id, pod.Status.Phase, pod.Status.Reason, pod.Status.Message)
			if pod.Status.Reason == "Evicted" || pod.Status.Reason == "Preempting" {
				p.reclaim(w, 0, "the kubelet "+strings.ToLower(pod.Status.Reason)+" it")
			}
		}
	case corev1.PodRunning:
		if w.addr == "" && pod.Status.PodIP != "" {
			w.addr = advertised(pod)
		}
	}
	if w.ready.IsZero() && isReady(pod) {
		w.ready = p.o.Now()
		p.o.Logf("lent Pod %s is ready on %s (%s), %s after it was lent", w.id, pod.Spec.NodeName, w.addr, w.ready.Sub(w.lent).Round(time.Millisecond))
	}
	if pod.DeletionTimestamp != nil && !w.deleting {
		var grace time.Duration
		if pod.DeletionGracePeriodSeconds != nil {
			grace = time.Duration(*pod.DeletionGracePeriodSeconds) * time.Second
		}
		why := "its Pod was deleted by another party"
		for _, c := range pod.Status.Conditions {
			if c.Type == corev1.DisruptionTarget && c.Status == corev1.ConditionTrue {
				why = fmt.Sprintf("%s: %s", c.Reason, c.Message)
			}
		}
		p.reclaim(w, grace, why)
	}
}

// reclaim reports w taken back, once. p.mu is held.
func (p *Provider) reclaim(w *worker, grace time.Duration, why string) {
	if w.reclaimed {
		return
	}
	select {
	case p.reclaims <- capacity.ProviderReclaim{Worker: w.id, Grace: grace, At: p.o.Now()}:
		w.reclaimed = true
		p.o.Logf("the cluster reclaims %s with %s grace (%s)", w.id, grace, why)
	default:
		p.o.Logf("the cluster reclaims %s (%s), but too many reclaims wait: not reported", w.id, why)
	}
}

func isReady(pod *corev1.Pod) bool {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// advertised is the address the worker in pod announces to the router,
// where the driver finds it in the registry: its --advertise-addr with
// the container's environment expanded ($(POD_NAME).prism-dense:8600),
// else the Pod's IP and the port of --addr (or of the port named grpc).
func advertised(pod *corev1.Pod) string {
	c := pod.Spec.Containers[0]
	flag := func(name string) string {
		for i, a := range c.Args {
			if a == name && i+1 < len(c.Args) {
				return c.Args[i+1]
			}
			if v, ok := strings.CutPrefix(a, name+"="); ok {
				return v
			}
		}
		return ""
	}
	port := ""
	if _, pt, err := net.SplitHostPort(flag("--addr")); err == nil {
		port = pt
	}
	for _, cp := range c.Ports {
		if port == "" && cp.Name == "grpc" {
			port = fmt.Sprint(cp.ContainerPort)
		}
	}
	if a := flag("--advertise-addr"); a != "" {
		env := map[string]string{}
		for _, e := range c.Env {
			switch {
			case e.ValueFrom == nil:
				env[e.Name] = e.Value
			case e.ValueFrom.FieldRef != nil:
				switch e.ValueFrom.FieldRef.FieldPath {
				case "metadata.name":
					env[e.Name] = pod.Name
				case "metadata.namespace":
					env[e.Name] = pod.Namespace
				case "status.podIP":
					env[e.Name] = pod.Status.PodIP
				case "spec.nodeName":
					env[e.Name] = pod.Spec.NodeName
				}
			}
		}
		for k, v := range env {
			a = strings.ReplaceAll(a, "$("+k+")", v)
		}
		// As the worker reads its flag (serve.Advertise): HOST alone,
		// or a port of 0, takes the port it listens on.
		host, pt, err := net.SplitHostPort(a)
		if err != nil {
			host, pt = strings.Trim(a, "[]"), ""
		}
		if pt == "" || pt == "0" {
			pt = port
		}
		return net.JoinHostPort(host, pt)
	}
	return net.JoinHostPort(pod.Status.PodIP, port)
}

func (p *Provider) Name() string { return "kubernetes" }

// Idle is how many workers the pool could take now: on each schedulable
// node, its allocatable devices minus what the Pods on them request, in
// whole workers (a worker's devices are on one node), less the lent Pods
// not yet placed, capped by Max less the workers lent. Without a device
// resource it is that cap.
func (p *Provider) Idle(ctx context.Context) (int, error) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return 0, nil
	}
	lent := len(p.workers)
	room := p.o.Max - lent
	fresh := p.o.IdleRefresh > 0 && p.o.Now().Sub(p.idleAt) < p.o.IdleRefresh
	free, lentThen := p.idleFree, p.idleLent
	p.mu.Unlock()
	if room <= 0 {
		return 0, nil
	}
	if p.resource == "" || p.per <= 0 {
		return room, nil
	}
	if fresh {
		// Workers lent since the count.
		free -= int64(max(0, lent-lentThen))
	} else {
		var err error
		if free, err = p.countFree(ctx); err != nil {
			return 0, err
		}
		p.mu.Lock()
		p.idleAt, p.idleFree, p.idleLent = p.o.Now(), free, len(p.workers)
		p.mu.Unlock()
	}
	return int(max(0, min(int64(room), free))), nil
}

// countFree counts the workers the pool's nodes could take: per node, the
// devices no Pod requests in whole workers (summed over nodes, devices
// free one here and one there would count a worker no node can hold),
// less one for each lent Pod not yet placed.
func (p *Provider) countFree(ctx context.Context) (int64, error) {
	nodes, err := p.o.Client.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: labels.SelectorFromSet(p.o.Pool).String()})
	if err != nil {
		return 0, fmt.Errorf("kubernetes lender: list the pool's nodes: %w", err)
	}
	var free int64
	for _, n := range nodes.Items {
		if n.Spec.Unschedulable || !nodeReady(&n) {
			continue
		}
		q, ok := n.Status.Allocatable[p.resource]
		if !ok {
			continue
		}
		left := q.Value()
		pods, err := p.o.Client.CoreV1().Pods("").List(ctx, metav1.ListOptions{
			FieldSelector: fields.AndSelectors(fields.OneTermEqualSelector("spec.nodeName", n.Name),
				fields.OneTermNotEqualSelector("status.phase", string(corev1.PodSucceeded)),
				fields.OneTermNotEqualSelector("status.phase", string(corev1.PodFailed))).String(),
		})
		if err != nil {
			return 0, fmt.Errorf("kubernetes lender: list the Pods on %s: %w", n.Name, err)
		}
		for i := range pods.Items {
			pod := &pods.Items[i]
			if pod.Spec.NodeName != n.Name || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
				continue
			}
			left -= podRequest(pod, p.resource)
		}
		// A node whose Pods request more than it has (a device gone
		// unhealthy under them) has none left, and takes none from the
		// others.
		free += max(0, left) / p.per
	}
	p.mu.Lock()
	for _, w := range p.workers {
		if w.nodeName == "" && !w.gone {
			free--
		}
	}
	p.mu.Unlock()
	return free, nil
}

func nodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// podRequest is what pod asks of res: the most of its containers' sum
// and of each init container (requests, else limits, as the scheduler
// counts extended resources).
func podRequest(pod *corev1.Pod, res corev1.ResourceName) int64 {
	of := func(c *corev1.Container) int64 {
		if q, ok := c.Resources.Requests[res]; ok {
			return q.Value()
		}
		if q, ok := c.Resources.Limits[res]; ok {
			return q.Value()
		}
		return 0
	}
	var sum int64
	for i := range pod.Spec.Containers {
		sum += of(&pod.Spec.Containers[i])
	}
	for i := range pod.Spec.InitContainers {
		sum = max(sum, of(&pod.Spec.InitContainers[i]))
	}
	return sum
}

// Borrow creates n Pods and returns their names at once; each is
// Running without an address until the Pod runs.
func (p *Provider) Borrow(ctx context.Context, model string, n int) ([]string, error) {
	var ids []string
	for i := range n {
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			return ids, errors.New("kubernetes lender: closed")
		}
		if p.dry {
			p.mu.Unlock()
			return ids, errors.New("kubernetes lender: a dry run lends nothing")
		}
		if len(p.workers) >= p.o.Max {
			p.mu.Unlock()
			return ids, fmt.Errorf("kubernetes lender: %d of %d workers: max %d lent", n-i, n, p.o.Max)
		}
		name := podName(p.o.Template)
		w := &worker{id: name, model: model, lent: p.o.Now(), running: true}
		p.workers[name] = w
		p.mu.Unlock()
		pod := p.PodFor(name, model)
		if _, err := p.o.Client.CoreV1().Pods(p.o.Namespace).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
			p.mu.Lock()
			delete(p.workers, name)
			maybe := maybeCreated(err)
			if maybe {
				p.abandoned[name] = true
			}
			p.mu.Unlock()
			if maybe {
				// Deleted now, with a context of its own (ctx may be what
				// was cancelled); a Pod made after this delete is deleted
				// when the watch sees it, or at Close.
				dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
				if derr := p.delete(dctx, name, p.grace); derr != nil {
					p.o.Logf("delete %s, whose create failed: %v", name, derr)
				}
				cancel()
			}
			return ids, fmt.Errorf("kubernetes lender: %d of %d workers: create Pod %s: %w", n-i, n, name, err)
		}
		p.o.Logf("lending %s on the pool %s (priority class %s)", name, labels.SelectorFromSet(p.o.Pool), p.o.PriorityClass)
		ids = append(ids, name)
	}
	return ids, nil
}

// maybeCreated says whether a Create that failed with err may have made
// the object all the same: any error but the API server's refusal
// (invalid, forbidden, already exists, ...), which says it did not.
func maybeCreated(err error) bool {
	var st apierrors.APIStatus
	if !errors.As(err, &st) {
		return true
	}
	return apierrors.IsTimeout(err) || apierrors.IsServerTimeout(err) || apierrors.IsInternalError(err) || apierrors.IsUnexpectedServerError(err)
}

// podName is TEMPLATE-loan-XXXXX, a DNS label.
func podName(template string) string {
	const letters = "bcdfghjklmnpqrstvwxz2456789"
	b := make([]byte, 5)
	_, _ = rand.Read(b)
	for i := range b {
		b[i] = letters[int(b[i])%len(letters)]
	}
	prefix := template
	if len(prefix) > 63-len("-loan-xxxxx") {
		prefix = strings.TrimRight(prefix[:63-len("-loan-xxxxx")], "-.")
	}
	return prefix + "-loan-" + string(b)
}

// delete deletes a Pod with grace (nil: the Pod's own); a Pod already
// gone is not an error.
func (p *Provider) delete(ctx context.Context, name string, grace *int64) error {
	err := p.o.Client.CoreV1().Pods(p.o.Namespace).Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: grace})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// Drain deletes the worker's Pod with the drain's grace: the kubelet
// sends the worker SIGTERM, on which it leaves the router's registry at
// once and exits when what it holds is done. A Pod already being
// deleted (a reclaim) is left to its own grace.
func (p *Provider) Drain(ctx context.Context, id string) error {
	p.mu.Lock()
	w := p.workers[id]
	if w == nil {
		p.mu.Unlock()
		return fmt.Errorf("kubernetes lender: drain %s: not lent", id)
	}
	w.draining = true
	if w.gone || w.deleting || w.reclaimed {
		p.mu.Unlock()
		return nil
	}
	w.deleting = true
	p.mu.Unlock()
	p.o.Logf("draining %s: its Pod is deleted with its grace; the kubelet's SIGTERM makes the worker leave the registry", id)
	if err := p.delete(ctx, id, p.grace); err != nil {
		// Maybe not deleted: the Return after it, or Close, deletes it
		// again.
		p.mu.Lock()
		w.deleteFailed = true
		p.mu.Unlock()
		return fmt.Errorf("kubernetes lender: drain %s: %w", id, err)
	}
	return nil
}

// returnGrace is the grace of a return's delete of a Pod still there:
// the drain's deadline has passed (or the worker never served).
var returnGrace = int64(1)

// Return deletes the worker's Pod if it is still there, with a short
// grace (it drained, or its deadline passed), and forgets it once the
// delete is accepted. A delete that fails (the API server unreachable, a
// timeout) keeps the worker lent, draining: it stays in Workers, so the
// controller returns it again, and Close deletes it; forgotten, its Pod
// would hold the training pool's GPU until someone deleted it by hand.
func (p *Provider) Return(ctx context.Context, id string) error {
	p.mu.Lock()
	w := p.workers[id]
	if w == nil {
		p.mu.Unlock()
		return fmt.Errorf("kubernetes lender: return %s: not lent", id)
	}
	if w.gone {
		delete(p.workers, id)
		p.mu.Unlock()
		return nil
	}
	w.deleting, w.draining = true, true
	p.mu.Unlock()
	if err := p.delete(ctx, id, &returnGrace); err != nil {
		p.mu.Lock()
		w.deleteFailed = true
		p.mu.Unlock()
		return fmt.Errorf("kubernetes lender: return %s (still lent; it is deleted again on the next return or at close): %w", id, err)
	}
	p.mu.Lock()
	delete(p.workers, id)
	p.mu.Unlock()
	p.o.Logf("returned %s: its Pod is deleted", id)
	return nil
}

// Workers are the Pods lent now.
func (p *Provider) Workers() []capacity.LentWorker {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]capacity.LentWorker, 0, len(p.workers))
	for _, w := range p.workers {
		out = append(out, capacity.LentWorker{ID: w.id, Model: w.model, Addr: w.addr, Running: w.running, Draining: w.draining, Lent: w.lent, Ready: w.ready})
	}
	slices.SortFunc(out, func(a, b capacity.LentWorker) int {
		if c := a.Lent.Compare(b.Lent); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	return out
}

func (p *Provider) Reclaims() <-chan capacity.ProviderReclaim { return p.reclaims }

// Detach stops the watch and leaves every lent Pod serving, for the
// lender's next run to adopt (New adopts the running and pending ones a
// run lent, up to Max): a rolling update of prism loan mid-peak keeps
// the capacity it lent. Nothing is lent afterwards.
func (p *Provider) Detach() { p.shutdown(false) }

// Close deletes every lent Pod with the drain's grace (the workers
// leave the registry and finish) and stops the watch. Nothing is lent
// afterwards.
func (p *Provider) Close() { p.shutdown(true) }

// shutdown stops the watch, once, deleting the lent Pods first when
// returnLent (Close) and leaving them otherwise (Detach).
func (p *Provider) shutdown(returnLent bool) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	var names []string
	if returnLent {
		for _, w := range p.workers {
			if !w.gone && (!w.deleting || w.deleteFailed) {
				w.deleting = true
				names = append(names, w.id)
			}
		}
		for name := range p.abandoned {
			names = append(names, name)
		}
	}
	p.mu.Unlock()
	if len(names) > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, n := range names {
			if err := p.delete(ctx, n, p.grace); err != nil {
				p.o.Logf("delete %s: %v", n, err)
			}
		}
	}
	close(p.stop)
}
