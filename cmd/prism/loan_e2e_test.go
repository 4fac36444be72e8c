package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/capacity/loan"
	"github.com/prism-serve/prism/internal/auth"
	"github.com/prism-serve/prism/internal/kubetest"
	"github.com/prism-serve/prism/internal/readyline"
	"github.com/prism-serve/prism/models"
)

// loanStatus is what prism up's GET /loan answers (capacity/loan.Status).
type loanStatus struct {
	Borrowed int `json:"borrowed"`
	Workers  []struct {
		ID    string    `json:"id"`
		Addr  string    `json:"addr"`
		Ready time.Time `json:"ready"`
	} `json:"workers"`
	Events []struct {
		T        float64 `json:"t"`
		Kind     string  `json:"kind"`
		Worker   string  `json:"worker"`
		Reason   string  `json:"reason"`
		Borrowed int     `json:"borrowed"`
	} `json:"events"`
	CutOff int `json:"released_in_flight"`
}

func getLoan(t *testing.T, client *http.Client, base string) (loanStatus, []byte) {
	t.Helper()
	resp, err := client.Get(base + "/loan")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var s loanStatus
	if err := json.Unmarshal(b, &s); err != nil {
		t.Fatalf("GET /loan: %v: %s", err, b)
	}
	return s, b
}

// TestLoanPromotion: prism up --loan local:max=2 with one owned dense
// worker; the load generator's promotion drives the demand past it:
// workers are borrowed during the spike, one is reclaimed mid-spike
// (POST /loan/reclaim), the controller replaces it, and all are returned
// after; no request fails, and the report holds the borrowed workers
// second by second.
func TestLoanPromotion(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("real processes for about a minute")
	}
	dir := t.TempDir()
	_, part, _ := partitioned(t, dir, "dlrm-tiny")
	// One owned worker rated at 40 requests/s: the promotion's 75 needs
	// three. Short leases and ticks fit the run into a minute.
	cmd := exec.Command(prismBin, "up", "--model", part, "--addr", "127.0.0.1:0", "--db", filepath.Join(dir, "db"),
		"--dense-workers", "1", "--micro-batch", "64",
		"--loan", "local:max=2,capacity=40,tick=250ms,min-lease=5s,cool-down=2s,drain-timeout=5s,grace=5s")
	stdout, _ := cmd.StdoutPipe()
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			cmd.Process.Kill()
		}
	})
	var logMu sync.Mutex
	var upLog []string
	loanURL := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			line := sc.Text()
			logMu.Lock()
			upLog = append(upLog, line)
			logMu.Unlock()
			if testing.Verbose() {
				fmt.Fprintln(os.Stderr, "[up]", line)
			}
			if _, rest, ok := strings.Cut(line, "controller at "); ok {
				loanURL <- strings.Fields(rest)[0]
			}
		}
	}()
	w := readyline.Start(stdout, readyline.Up, readyline.WatchOptions{Anywhere: true})
	addr, err := w.Await(context.Background(), 2*time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	var base string
	select {
	case base = <-loanURL:
	case <-time.After(10 * time.Second):
		t.Fatal("prism up did not print the loan controller's address")
	}
	t.Logf("up at %s, loan controller at %s", addr, base)
	// The controller serves HTTPS with the router's certificate; a
	// reclaim needs an admin's (a dense worker's is refused).
	if !strings.HasPrefix(base, "https://") {
		t.Fatalf("the loan controller at %s, want HTTPS under TLS", base)
	}
	certs := filepath.Join(dir, "certs")
	clientOf := func(role auth.Role) *http.Client {
		t.Helper()
		c, err := auth.ScrapeTLS(auth.FilesFor(certs, role), auth.Router)
		if err != nil {
			t.Fatal(err)
		}
		return &http.Client{Transport: &http.Transport{TLSClientConfig: c}}
	}
	admin := clientOf(auth.Admin)
	if resp, err := clientOf(auth.Dense).Post(base+"/loan/reclaim?grace=5s", "", nil); err != nil || resp.StatusCode != http.StatusForbidden {
		t.Fatalf("a reclaim with a dense worker's certificate: %v %v, want 403", resp, err)
	}

	// Reclaim one borrowed worker once it has served 2 seconds: mid-spike.
	reclaimed := make(chan string, 1)
	stopWatch := make(chan struct{})
	go func() {
		defer close(reclaimed)
		for {
			select {
			case <-stopWatch:
				return
			case <-time.After(200 * time.Millisecond):
			}
			s, _ := getLoan(t, admin, base)
			for _, w := range s.Workers {
				if !w.Ready.IsZero() && time.Since(w.Ready) > 2*time.Second {
					resp, err := admin.Post(base+"/loan/reclaim?grace=5s&worker="+w.ID, "", nil)
					if err != nil {
						t.Error(err)
						return
					}
					b, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					if resp.StatusCode != http.StatusOK {
						t.Errorf("POST /loan/reclaim: %s: %s", resp.Status, b)
						return
					}
					reclaimed <- strings.TrimSpace(string(b))
					return
				}
			}
		}
	}()

	report := filepath.Join(dir, "report")
	start := time.Now()
	out, err := run(t, nil, "loadgen", "--target", addr, "--certs", filepath.Join(dir, "certs"), "--model", "dlrm-tiny",
		"--arrival", "promotion", "--rate", "25", "--promo-spike", "3", "--promo-day", "30s",
		"--promo-at", "6s", "--promo-ramp", "3s", "--promo-plateau", "10s", "--promo-decay", "3s",
		"--duration", "26s", "--candidates", "16", "--seed", "7", "--quiet",
		"--watch-borrowed", base+"/metrics", "--out", report)
	close(stopWatch)
	t.Logf("loadgen (%s):\n%s", time.Since(start).Round(time.Second), out)
	if err != nil {
		t.Fatalf("loadgen: %v", err)
	}
	victim := <-reclaimed
	if victim == "" {
		t.Fatal("no borrowed worker served long enough to be reclaimed")
	}

	// After the promotion everything borrowed goes back.
	deadline := time.Now().Add(25 * time.Second)
	var s loanStatus
	var raw []byte
	for {
		s, raw = getLoan(t, admin, base)
		if s.Borrowed == 0 && len(s.Workers) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("borrowed workers not returned after the promotion:\n%s", raw)
		}
		time.Sleep(250 * time.Millisecond)
	}
	os.WriteFile(filepath.Join(report, "loan.json"), raw, 0o644)

	var sum struct {
		Sent         int64            `json:"sent"`
		OK           int64            `json:"ok"`
		Errors       int64            `json:"errors"`
		ErrorsByCode map[string]int64 `json:"errors_by_code"`
		SLO          float64          `json:"slo_attainment"`
		Watched      string           `json:"watched"`
		Series       []*float64       `json:"watched_series"`
	}
	b, err := os.ReadFile(filepath.Join(report, "summary.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &sum); err != nil {
		t.Fatal(err)
	}
	// Admission may refuse with ResourceExhausted by design; nothing
	// else may fail.
	shed := sum.ErrorsByCode[codes.ResourceExhausted.String()]
	if other := sum.Errors - shed; other != 0 || sum.OK == 0 {
		t.Errorf("%d ok, %d failed other than shed (%v)", sum.OK, other, sum.ErrorsByCode)
	}
	if s.CutOff != 0 {
		t.Errorf("%d requests in flight cut off by a release", s.CutOff)
	}
	peak := 0.0
	var timeline []string
	for i, v := range sum.Series {
		if v != nil {
			peak = max(peak, *v)
			timeline = append(timeline, fmt.Sprintf("%d:%g", i, *v))
		}
	}
	if sum.Watched != "borrowed workers" || peak < 1 {
		t.Errorf("the report's borrowed workers peak at %g (%q)", peak, sum.Watched)
	}
	count := map[string]int{}
	var events []string
	for _, e := range s.Events {
		count[e.Kind+": "+e.Reason]++
		if e.Kind != "shed" {
			events = append(events, fmt.Sprintf("%.1fs %s %s %s (borrowed %d)", e.T, e.Kind, e.Worker, e.Reason, e.Borrowed))
		}
	}
	t.Logf("sent %d, ok %d, shed %d, SLO attainment %.3f; borrowed per second %s\nloan timeline:\n  %s",
		sum.Sent, sum.OK, shed, sum.SLO, strings.Join(timeline, " "), strings.Join(events, "\n  "))
	if count["drain: reclaim"] != 1 {
		t.Errorf("reclaimed worker %s: %d drains for reclaim, want 1", victim, count["drain: reclaim"])
	}
	if count["return: drained"]+count["return: grace end"] < 2 {
		t.Errorf("returns %v: want the reclaimed worker and the rest returned", count)
	}
	logMu.Lock()
	defer logMu.Unlock()
	for _, want := range []string{"loan: borrow ", "loan: the local lender reclaims " + victim, "loan: return " + victim} {
		found := false
		for _, l := range upLog {
			found = found || strings.Contains(l, want)
		}
		if !found {
			t.Errorf("prism up's log has no %q", want)
		}
	}
}

// TestDenseDrainDropsNothing: a dense worker sent SIGTERM under load (a
// drain: what a return or reclaim does) leaves the registry at once and
// finishes what it holds; every request is answered, none fails.
func TestDenseDrainDropsNothing(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	_, part, cfg := partitioned(t, dir, "dlrm-tiny")
	certs := newCerts(t)
	// A heartbeat of 500 ms: at 200 ms the one embedding worker expired
	// (600 ms without an announcement) on a host at load average 16, and
	// the router abandoned its calls in flight: not what this measures.
	router := startProc(t, readyline.Router, "serve", "router", "--certs", certs, "--addr", "127.0.0.1:0", "--heartbeat", "500ms", "--micro-batch", "16")
	denseArgs := []string{"serve", "dense", "--certs", certs, "--plan", part, "--router", router.addr}
	startProc(t, readyline.Dense, denseArgs...)
	startProc(t, readyline.Embedding, "serve", "embedding", "--certs", certs, "--plan", part, "--db", filepath.Join(dir, "db"), "--router", router.addr)
	conn := dial(t, router.addr, certs, auth.Admin)
	reg := prismv1.NewRegistryClient(conn)
	dense := func() int {
		ws, err := reg.List(context.Background(), &prismv1.ListRequest{})
		if err != nil {
			return -1
		}
		n := 0
		for _, w := range ws.GetWorkers() {
			if w.GetRole() == prismv1.Role_ROLE_DENSE {
				n++
			}
		}
		return n
	}
	waitDense := func(n int) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			if dense() == n {
				return
			}
		}
		t.Fatalf("never saw %d dense workers registered", n)
	}
	rec := prismv1.NewRecommenderClient(conn)
	src, _ := models.NewSynthetic(cfg.Signature(), models.SyntheticOptions{Seed: 3})
	b, _ := src.Next(64)
	req := toRequest(cfg.Name, b, nil)

	for round := range 3 {
		// A lent worker joins, serves under load, and is drained.
		lent := startProc(t, readyline.Dense, denseArgs...)
		waitDense(2)
		var wg sync.WaitGroup
		var mu sync.Mutex
		var ok, failed int
		var errs []string
		stop := make(chan struct{})
		for range 6 {
			wg.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
					}
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					_, err := rec.Recommend(ctx, req)
					cancel()
					mu.Lock()
					if err == nil {
						ok++
					} else {
						failed++
						if len(errs) < 5 {
							errs = append(errs, status.Convert(err).Message())
						}
					}
					mu.Unlock()
				}
			})
		}
		time.Sleep(400 * time.Millisecond)
		lent.cmd.Process.Signal(syscall.SIGTERM)
		exited := make(chan struct{})
		go func() { lent.cmd.Wait(); close(exited) }()
		select {
		case <-exited:
		case <-time.After(15 * time.Second):
			t.Fatal("the drained worker did not exit")
		}
		if n := dense(); n != 1 {
			t.Errorf("round %d: %d dense workers registered after the drain, want 1", round, n)
		}
		time.Sleep(300 * time.Millisecond)
		close(stop)
		wg.Wait()
		t.Logf("round %d: a dense worker drained under load: %d ok, %d failed %v", round, ok, failed, errs)
		if failed > 0 || ok == 0 {
			t.Fatalf("round %d: %d ok, %d failed: %v", round, ok, failed, errs)
		}
	}
}

// TestLoanDryRun: prism loan --dry-run against a router (TLS: its
// /metrics scraped over HTTPS) with a dense worker registered and a real
// API server (internal/kubetest; skipped without it). With the lender
// right it prints what it saw (the routers, the demand, the dense
// workers, the controller's decision now), the Pod it would lend as the
// server admitted it and the pool's idle count, and exits 0; each thing
// wrong (a PriorityClass that does not exist, a template that does not,
// the routers' metrics unreachable) makes it exit 1 naming it, after the
// other checks ran. No Pod is stored.
func TestLoanDryRun(t *testing.T) {
	t.Parallel()
	api, kc := loanCluster(t)
	ctx := context.Background()
	const ns = "prism"

	dir := t.TempDir()
	_, part, _ := partitioned(t, dir, "dlrm-tiny")
	certs := newCerts(t)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	metricsAddr := lis.Addr().String()
	lis.Close()
	router := startProc(t, readyline.Router, "serve", "router", "--certs", certs, "--addr", "127.0.0.1:0", "--metrics-addr", metricsAddr, "--heartbeat", "500ms")
	startProc(t, readyline.Dense, "serve", "dense", "--certs", certs, "--plan", part, "--router", router.addr)
	reg := prismv1.NewRegistryClient(dial(t, router.addr, certs, auth.Admin))
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		ws, err := reg.List(ctx, &prismv1.ListRequest{})
		if err == nil && slices.ContainsFunc(ws.GetWorkers(), func(w *prismv1.WorkerInfo) bool { return w.GetRole() == prismv1.Role_ROLE_DENSE }) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the dense worker never registered: %v", err)
		}
	}

	lender := func(kv ...string) string {
		keys := map[string]string{"max": "2", "template": "prism-dense", "pool": "pool=training", "taint": "pool=training:NoSchedule",
			"priority-class": "prism-loan", "namespace": ns, "kubeconfig": api.Kubeconfig, "capacity": "100", "window": "500ms", "tick": "250ms"}
		for i := 0; i < len(kv); i += 2 {
			keys[kv[i]] = kv[i+1]
		}
		parts := []string{}
		for _, k := range slices.Sorted(maps.Keys(keys)) {
			parts = append(parts, k+"="+keys[k])
		}
		return "kubernetes:" + strings.Join(parts, ",")
	}
	metrics := "https://" + metricsAddr + "/metrics"
	routerSeen := []string{"routers: 1 scraped: " + metrics, "demand: 0.0 requests/s offered", "dense workers: 1 serving, 0 starting, 0 draining",
		"controller: no decision now: 0.0 requests/s offered, 1 worker(s) of 100.0: under the high-water mark (85%)"}
	podSeen := []string{"kind: Pod", "priorityClassName: prism-loan", "priority: -10", "pool: training", "prism.dev/lent-by: prism-dense-loan",
		"lender: 2 idle of max=2 on the pool pool=training"}
	for _, tc := range []struct {
		name    string
		lender  string
		metrics string
		want    []string // in the output
		not     []string // not in it
		failed  string   // the error's line ("": exits 0)
	}{
		{name: "right", lender: lender(), metrics: metrics, want: append(append([]string{"prism loan --dry-run: every check passed"}, routerSeen...), podSeen...), not: []string{"FAILED"}},
		{name: "no such PriorityClass", lender: lender("priority-class", "prism-nope"), metrics: metrics, want: routerSeen,
			failed: "no PriorityClass with name prism-nope was found"},
		{name: "no such template", lender: lender("template", "prism-nope"), metrics: metrics, want: routerSeen, not: []string{"kind: Pod"},
			failed: "the dense workers' StatefulSet or Deployment prism/prism-nope"},
		{name: "routers unreachable", lender: lender(), metrics: "https://127.0.0.1:1/metrics", want: podSeen, not: []string{"routers: "},
			failed: "the routers' metrics (--router-metrics https://127.0.0.1:1/metrics)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, err := run(t, nil, "loan", "--dry-run", "--router", router.addr, "--router-metrics", tc.metrics, "--certs", certs, "--lender", tc.lender)
			t.Logf("prism loan --dry-run (%s):\n%s", tc.name, out)
			var ee *exec.ExitError
			switch {
			case tc.failed == "" && err != nil:
				t.Errorf("exit: %v, want 0", err)
			case tc.failed != "" && (!errors.As(err, &ee) || ee.ExitCode() != 1):
				t.Errorf("exit: %v, want 1", err)
			case tc.failed != "" && (!strings.Contains(out, "prism: loan --dry-run: 1 check(s) failed: ") || !strings.Contains(out, tc.failed)):
				t.Errorf("the output does not say that %q failed", tc.failed)
			}
			for _, w := range tc.want {
				if !strings.Contains(out, w) {
					t.Errorf("the output lacks %q", w)
				}
			}
			for _, n := range tc.not {
				if strings.Contains(out, n) {
					t.Errorf("the output has %q", n)
				}
			}
		})
	}
	pods, err := kc.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
	if err != nil || len(pods.Items) != 0 {
		t.Errorf("Pods stored after the dry runs: %d (%v)", len(pods.Items), err)
	}
}

// loanCluster is a real API server (internal/kubetest; skipped without
// it) as a lender finds it: namespace prism, the PriorityClass
// prism-loan, a node of 8 GPUs in the pool pool=training, and the dense
// workers' Deployment prism-dense; and a client of it.
func loanCluster(t *testing.T) (*kubetest.Server, kubernetes.Interface) {
	t.Helper()
	api := kubetest.Start(t)
	cfg, err := clientcmd.BuildConfigFromFlags("", api.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	kc, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	const ns = "prism"
	if _, err := kc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := kc.SchedulingV1().PriorityClasses().Create(ctx, &schedulingv1.PriorityClass{ObjectMeta: metav1.ObjectMeta{Name: "prism-loan"}, Value: -10}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	gpus := corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("8")}
	node, err := kc.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "train-1", Labels: map[string]string{"pool": "training"}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	node.Status = corev1.NodeStatus{Capacity: gpus, Allocatable: gpus, Conditions: []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue}}}
	if _, err := kc.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	sel := map[string]string{"app": "prism-dense"}
	one := corev1.ResourceList{"nvidia.com/gpu": resource.MustParse("1")}
	if _, err := kc.AppsV1().Deployments(ns).Create(ctx, &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "prism-dense"},
		Spec: appsv1.DeploymentSpec{Selector: &metav1.LabelSelector{MatchLabels: sel}, Template: corev1.PodTemplateSpec{
			ObjectMeta: metav1.ObjectMeta{Labels: sel},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "dense", Image: "registry.example/prism:1.0", Args: []string{"serve", "dense"},
				Resources: corev1.ResourceRequirements{Requests: one, Limits: one}}}},
		}},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return api, kc
}

// TestLoanDryRunLongWindow: the lender's checks after the window's wait
// (the Pod's dry run, the rights, the Pods lent) get a timeout of their
// own. They shared the template read's minute, from before the wait, so
// a window= of a minute or more failed every one of them with "context
// deadline exceeded", a configuration with nothing wrong reported as
// broken. The timeout is shortened here (dryRunAPITimeout) rather than
// the test waiting a minute; the routers are unreachable, which fails
// the dry run, but after the wait, as a real run's would.
func TestLoanDryRunLongWindow(t *testing.T) {
	t.Parallel()
	api, _ := loanCluster(t)
	old := dryRunAPITimeout
	dryRunAPITimeout = time.Second
	t.Cleanup(func() { dryRunAPITimeout = old })
	sp, err := loan.ParseSpec("kubernetes:max=2,template=prism-dense,pool=pool=training,priority-class=prism-loan,namespace=prism,capacity=100,window=1500ms,kubeconfig=" + api.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	err = dryRunLoan(context.Background(), sp, "127.0.0.1:1", "http://127.0.0.1:1/metrics", "dense",
		grpc.WithTransportCredentials(insecure.NewCredentials()), nil, &out, func(string, ...any) {})
	t.Logf("dry run:\n%s", out.String())
	if err == nil {
		t.Fatal("the dry run passed with the routers unreachable")
	}
	if !strings.Contains(out.String(), "lent Pod (admitted by the API server") || strings.Contains(out.String(), "deadline exceeded") {
		t.Errorf("the lender's checks after the window did not run in time: %v", err)
	}
}
