package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/capacity"
	"github.com/prism-serve/prism/capacity/kube"
	"github.com/prism-serve/prism/capacity/loan"
	"github.com/prism-serve/prism/internal/auth"
	"github.com/prism-serve/prism/internal/auth/authflag"
	"github.com/prism-serve/prism/internal/serve"
)

func init() { subcommands = append(subcommands, newLoanCmd) }

func newLoanCmd() *cobra.Command {
	var (
		lender, routerAddr, routerMetrics, addr, model, onExit string
		tlsFlags                                               authflag.Flags
		dryRun                                                 bool
	)
	cmd := &cobra.Command{
		Use:   "loan --lender kubernetes:max=N,... --router ADDR --router-metrics URL",
		Short: "Run the capacity-loaning controller beside the routers on a cluster: borrow dense workers from a training pool for peaks",
		Long: `loan runs the capacity controller and its driver (what prism up --loan runs
beside its router) as a process of its own, for Kubernetes, where there is no
prism up: each tick it scrapes every router's /metrics (a name resolving to
several addresses, such as the routers' headless Service, is scraped address by
address and the demand summed), lists a router's registry, and borrows, drains
and returns dense workers through the lender. The kubernetes lender places
borrowed dense workers as Pods on the training pool's nodes (the dense
StatefulSet's or Deployment's pod template, the pool's node selector and taint, a PriorityClass
below training's); a Pod deleted, evicted or preempted is a reclaim. It serves
GET /metrics (prism_capacity_*) and GET /loan on --metrics-addr. SIGTERM deletes
the lent Pods with their grace (they drain) and exits; with --on-exit keep it
leaves them serving for the next run to adopt (a rolling update of prism loan
mid-peak). --dry-run checks all this and lends nothing: it scrapes the routers
and lists the registry as a tick does and prints the demand and the decision
the controller would take now, and sends the Pod it would lend to the API
server with a server-side dry run (admission, validation, quotas, the
PriorityClass, its rights); it exits non-zero naming each check that failed.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if onExit != "return" && onExit != "keep" {
				return fmt.Errorf("--on-exit %q: want return or keep", onExit)
			}
			sp, err := loan.ParseSpec(lender)
			if err != nil {
				return fmt.Errorf("--lender: %w", err)
			}
			if sp.Provider != "kubernetes" {
				return fmt.Errorf("--lender %s: prism loan runs the kubernetes lender; the local one runs in prism up --loan", lender)
			}
			if routerAddr == "" || routerMetrics == "" {
				return errors.New("--router (a router's gRPC address, for its registry) and --router-metrics (the routers' /metrics URL) are needed")
			}
			tlsFlags.WarnClient(cmd.ErrOrStderr(), "prism loan")
			creds, err := tlsFlags.Dial(auth.Dense, auth.Router)
			if err != nil {
				return err
			}
			// A router serving TLS serves /metrics over HTTPS: scraped
			// with this process's certificate, the router's verified.
			var scraper *http.Client
			if strings.HasPrefix(routerMetrics, "https://") {
				files, ok, err := tlsFlags.Files(auth.Dense, false)
				if err != nil {
					return err
				}
				if !ok {
					return errors.New("--router-metrics https://... needs --certs (or --tls-cert/--tls-key/--tls-ca), not --insecure")
				}
				tc, err := auth.ScrapeTLS(files, auth.Router)
				if err != nil {
					return err
				}
				scraper = &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: tc}}
			}
			stderr := cmd.ErrOrStderr()
			logf := func(format string, args ...any) {
				fmt.Fprintf(stderr, "%s loan: %s\n", time.Now().UTC().Format(time.RFC3339), fmt.Sprintf(format, args...))
			}
			ctx, stop := signalContext()
			defer stop()
			if dryRun {
				return dryRunLoan(ctx, sp, routerAddr, routerMetrics, model, creds, scraper, cmd.OutOrStdout(), logf)
			}
			return runLoan(ctx, sp, routerAddr, routerMetrics, addr, model, onExit == "keep", creds, scraper, logf)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&lender, "lender", "", "the lender: kubernetes:max=N,template=NAME,pool=KEY=VALUE,priority-class=NAME[,taint=KEY[=VALUE][:EFFECT],resource=,namespace=,kubeconfig=,idle-refresh=] and the controller's keys of prism up --loan (capacity=,policy=,promo=,high=,target=,low=,p99=,queue=,min-lease=,cool-down=,drain-timeout=,startup=,borrow-timeout=,tick=,window=,grace=) (README: Promotions and capacity loaning)")
	fl.StringVar(&routerAddr, "router", "", "a router's gRPC address: the driver lists its registry (workers announce to every router)")
	fl.StringVar(&routerMetrics, "router-metrics", "", "the routers' /metrics URL; a host name is resolved at each tick and every address scraped (https://prism-router-headless:9090/metrics when the routers serve TLS: scraped with --certs, the router's certificate checked against the CA and for the router role; http:// with --insecure)")
	fl.StringVar(&addr, "metrics-addr", "0.0.0.0:9470", "where to serve GET /metrics (the prism_capacity_* counters) and GET /loan (lent workers, the timeline)")
	fl.StringVar(&onExit, "on-exit", "return", "what SIGTERM does with the lent Pods: return (delete them with their grace: they drain) or keep (leave them serving; the next prism loan adopts them, up to its max: for a rolling update of prism loan mid-peak; switching loaning off with keep leaves them until deleted: kubectl delete pod -l prism.dev/lent-by)")
	fl.BoolVar(&dryRun, "dry-run", false, "check the configuration and lend nothing: scrape the routers and list the registry once, print the demand and the controller's decision now, send the Pod it would lend to the API server with a server-side dry run (nothing stored) and print it; exits non-zero naming what failed (README: Promotions and capacity loaning)")
	fl.StringVar(&model, "model", "dense", "the name of the dense pool in the metrics and the timeline (every dense worker serves every model)")
	tlsFlags.Register(cmd, auth.Dense)
	_ = cmd.MarkFlagRequired("lender")
	return cmd
}

// runLoan wires the kubernetes lender, the driver and its HTTP endpoint,
// and runs them until ctx ends.
func runLoan(ctx context.Context, sp loan.Spec, routerAddr, routerMetrics, addr, model string, keep bool, creds grpc.DialOption, scraper *http.Client, logf func(string, ...any)) error {
	k := sp.Kube
	ko, err := lenderOptions(sp, logf)
	if err != nil {
		return err
	}
	ns := ko.Namespace
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	prov, err := kube.New(sctx, ko)
	cancel()
	if err != nil {
		return err
	}
	defer func() {
		if keep {
			prov.Detach()
			return
		}
		prov.Close()
	}()
	d, closeConn, err := newLoanDriver(ctx, sp, prov, routerAddr, routerMetrics, model, creds, scraper, logf)
	if err != nil {
		return err
	}
	defer closeConn()
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("--metrics-addr: %w", err)
	}
	srv := &http.Server{Handler: d.Handler(), ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logf("http: %v", err)
		}
	}()
	defer srv.Close()
	capa := "measured when the workers saturate"
	if sp.CapacityPerWorker > 0 {
		capa = fmt.Sprintf("%g requests/s per worker", sp.CapacityPerWorker)
	}
	o := d.Options()
	logf("kubernetes lender: up to %d dense workers as Pods of %s/%s's template on nodes %s (priority class %s, tolerating %s); %s policy, capacity %s, tick %s, minimum lease %s, cool-down %s; controller at http://%s (GET /metrics, GET /loan)",
		sp.Max, ns, k.Template, strings.Join(k.Pool, ","), k.PriorityClass, strings.Join(k.Taints, ","), o.Policy, capa, sp.Tick, o.MinLease, o.CoolDown, lis.Addr())
	var wg sync.WaitGroup
	wg.Go(func() { d.Run(ctx) })
	wg.Wait()
	if keep {
		logf("stopping: the lent Pods are left serving (--on-exit keep): the next prism loan adopts them")
		return nil
	}
	logf("stopping: the lent Pods are deleted with their grace (they drain)")
	return nil
}

// lenderOptions are the kubernetes lender's options as --lender says.
func lenderOptions(sp loan.Spec, logf func(string, ...any)) (kube.Options, error) {
	k := sp.Kube
	pool, err := kube.ParsePool(k.Pool)
	if err != nil {
		return kube.Options{}, fmt.Errorf("--lender: %w", err)
	}
	var tols []corev1.Toleration
	for _, t := range k.Taints {
		tol, err := kube.ParseTaint(t)
		if err != nil {
			return kube.Options{}, fmt.Errorf("--lender: %w", err)
		}
		tols = append(tols, tol)
	}
	client, err := kube.NewClient(k.Kubeconfig)
	if err != nil {
		return kube.Options{}, err
	}
	ns := k.Namespace
	if ns == "" {
		ns = kube.OwnNamespace()
	}
	return kube.Options{
		Client: client, Namespace: ns, Template: k.Template, Max: sp.Max, Pool: pool, Tolerations: tols,
		PriorityClass: k.PriorityClass, Resource: corev1.ResourceName(k.Resource), Grace: sp.Grace, IdleRefresh: k.IdleRefresh, Logf: logf,
	}, nil
}

// newLoanDriver is the driver over prov, listing the registry of the
// router at routerAddr and scraping every address of routerMetrics;
// closeConn closes its connection to the router.
func newLoanDriver(ctx context.Context, sp loan.Spec, prov capacity.Provider, routerAddr, routerMetrics, model string, creds grpc.DialOption, scraper *http.Client, logf func(string, ...any)) (d *loan.Driver, closeConn func(), err error) {
	conn, err := grpc.NewClient(routerAddr, creds, serve.ListDialOption())
	if err != nil {
		return nil, nil, fmt.Errorf("dial router %s: %w", routerAddr, err)
	}
	reg := prismv1.NewRegistryClient(conn)
	d, err = loan.New(loan.Options{
		Provider: prov, Controller: sp.Controller, Model: model, Client: scraper,
		Registry: func(ctx context.Context) ([]*prismv1.WorkerInfo, error) {
			resp, err := reg.List(ctx, &prismv1.ListRequest{})
			if err != nil {
				return nil, fmt.Errorf("router %s: %w", routerAddr, err)
			}
			return resp.GetWorkers(), nil
		},
		RouterMetrics:     func() string { return loan.EveryAddress(ctx, routerMetrics) },
		CapacityPerWorker: sp.CapacityPerWorker, Tick: sp.Tick, Window: sp.Window, Logf: logf, Promotions: sp.Promotions,
	})
	if err != nil {
		conn.Close()
		return nil, nil, err
	}
	return d, func() { conn.Close() }, nil
}

// dryRunAPITimeout bounds the dry run's calls to the API server (a
// variable for tests).
var dryRunAPITimeout = time.Minute

// dryRunLoan is prism loan --dry-run: what a run would see and do, with
// nothing lent. It writes its report to out and returns an error naming
// every check that failed. A scrape that fails fails it: the driver
// sums the routers only when every one answers, so a router the dry
// run cannot scrape would leave every tick of a real run without a
// demand, and nothing borrowed at the peak.
func dryRunLoan(ctx context.Context, sp loan.Spec, routerAddr, routerMetrics, model string, creds grpc.DialOption, scraper *http.Client, out io.Writer, logf func(string, ...any)) error {
	ko, err := lenderOptions(sp, logf)
	if err != nil {
		return err
	}
	var failed []string
	fail := func(err error) {
		failed = append(failed, err.Error())
		fmt.Fprintf(out, "FAILED: %v\n", err)
	}
	fmt.Fprintf(out, "prism loan --dry-run: nothing is lent\n")
	// The lender first: the driver's tick asks its idle count. One whose
	// template cannot be read is replaced by none (nothing idle), so
	// that the routers are still checked.
	sctx, cancel := context.WithTimeout(ctx, dryRunAPITimeout)
	defer cancel()
	var prov capacity.Provider = noLender{}
	kp, err := kube.Inspect(sctx, ko)
	if err != nil {
		fail(err)
	} else {
		prov = kp
		defer kp.Close()
	}
	d, closeConn, err := newLoanDriver(ctx, sp, prov, routerAddr, routerMetrics, model, creds, scraper, logf)
	if err != nil {
		return err
	}
	defer closeConn()
	pl, tickErr := d.DryRun(ctx)
	switch {
	case tickErr != nil:
		fail(tickErr)
	case pl.ScrapeErr != nil:
		fail(fmt.Errorf("the routers' metrics (--router-metrics %s): %w", routerMetrics, pl.ScrapeErr))
	case len(pl.Routers) == 0:
		fail(fmt.Errorf("--router-metrics %s: no router to scrape", routerMetrics))
	}
	if tickErr == nil {
		// Without a scrape there is no demand, nor a decision from it.
		o := pl.Obs
		if pl.ScrapeErr == nil && len(pl.Routers) > 0 {
			fmt.Fprintf(out, "routers: %d scraped: %s\n", len(pl.Routers), strings.Join(pl.Routers, " "))
			if pl.Measured {
				fmt.Fprintf(out, "demand: %.1f requests/s offered, %.1f shed, p99 %s, %d in flight (over %s)\n", o.Offered, o.Shed, o.P99, o.QueueDepth, d.Window())
			} else {
				fmt.Fprintf(out, "demand: not measured (a router restarted, or the routers scraped changed, between the two scrapes %s apart); %d in flight\n", d.Window(), o.QueueDepth)
			}
		}
		states := map[capacity.WorkerState]int{}
		for _, w := range o.Workers {
			states[w.State]++
		}
		fmt.Fprintf(out, "dense workers: %d serving, %d starting, %d draining (registry of %s)\n", states[capacity.Serving], states[capacity.Starting], states[capacity.Draining], routerAddr)
		if pl.ScrapeErr == nil && len(pl.Routers) > 0 {
			fmt.Fprintf(out, "controller: %s\n", dryRunDecision(pl, d.Options()))
		}
	}
	if kp != nil {
		// A timeout of their own: the template read's, from before the
		// window's wait (window=, a minute or more), had ended, and every
		// check below failed "context deadline exceeded".
		sctx, cancel := context.WithTimeout(ctx, dryRunAPITimeout)
		defer cancel()
		if pod, err := kp.DryRun(sctx, model); err != nil {
			fail(err)
		} else {
			// As kubectl prints it: its kind, without the server's field
			// bookkeeping.
			pod.APIVersion, pod.Kind = "v1", "Pod"
			pod.ManagedFields = nil
			b, err := yaml.Marshal(pod)
			if err != nil {
				return err
			}
			fmt.Fprintf(out, "lent Pod (admitted by the API server in a dry run, not stored):\n---\n%s---\n", b)
		}
		if err := kp.Access(sctx); err != nil {
			fail(err)
		}
		if lent, err := kp.Lent(sctx); err != nil {
			fail(err)
		} else if len(lent) > 0 {
			fmt.Fprintf(out, "lender: %d Pod(s) lent now (a run adopts up to max=%d and deletes the rest): %s\n", len(lent), sp.Max, strings.Join(lent, " "))
		}
		if tickErr == nil {
			fmt.Fprintf(out, "lender: %d idle of max=%d on the pool %s\n", pl.Idle, sp.Max, strings.Join(sp.Kube.Pool, ","))
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("loan --dry-run: %d check(s) failed: %s", len(failed), strings.Join(failed, "; "))
	}
	fmt.Fprintf(out, "prism loan --dry-run: every check passed\n")
	return nil
}

// dryRunDecision says what the controller would do now, and why.
func dryRunDecision(pl loan.Plan, o capacity.Options) string {
	var ds []string
	for _, dec := range pl.Decisions {
		switch dec.Kind {
		case capacity.Borrow:
			ds = append(ds, fmt.Sprintf("borrow %d dense worker(s) (%s)", dec.N, dec.Reason))
		case capacity.Shed:
			ds = append(ds, fmt.Sprintf("advise shedding %.0f%% (%s)", 100*dec.Frac, dec.Reason))
		default:
			ds = append(ds, dec.String())
		}
	}
	cp := pl.Obs.CapacityPerWorker
	capa := "capacity per worker unknown: measured the first time the workers saturate, or give capacity="
	if cp > 0 {
		capa = fmt.Sprintf("capacity %.1f requests/s per worker", cp)
	}
	if len(ds) > 0 {
		return fmt.Sprintf("would %s; %s", strings.Join(ds, ", "), capa)
	}
	why := capa
	if cp > 0 {
		n := 0
		for _, w := range pl.Obs.Workers {
			if w.State != capacity.Draining {
				n++
			}
		}
		why = fmt.Sprintf("%.1f requests/s offered, %d worker(s) of %.1f: under the high-water mark (%.0f%%)", pl.Obs.Offered, n, cp, 100*o.High)
	}
	return "no decision now: " + why
}

// noLender stands in for a lender whose template could not be read, so
// that a dry run still checks the routers: it has nothing idle and
// lends nothing.
type noLender struct{}

func (noLender) Name() string                              { return "kubernetes" }
func (noLender) Idle(context.Context) (int, error)         { return 0, nil }
func (noLender) Workers() []capacity.LentWorker            { return nil }
func (noLender) Reclaims() <-chan capacity.ProviderReclaim { return nil }
func (noLender) Borrow(context.Context, string, int) ([]string, error) {
	return nil, errors.New("a dry run lends nothing")
}
func (noLender) Drain(context.Context, string) error  { return errors.New("a dry run lends nothing") }
func (noLender) Return(context.Context, string) error { return errors.New("a dry run lends nothing") }
