package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	corev1 "k8s.io/api/core/v1"

	"github.com/prism-serve/prism/api/prismv1"
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
mid-peak).`,
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
			return runLoan(ctx, sp, routerAddr, routerMetrics, addr, model, onExit == "keep", creds, scraper, logf)
		},
	}
	fl := cmd.Flags()
	fl.StringVar(&lender, "lender", "", "the lender: kubernetes:max=N,template=NAME,pool=KEY=VALUE,priority-class=NAME[,taint=KEY[=VALUE][:EFFECT],resource=,namespace=,kubeconfig=,idle-refresh=] and the controller's keys of prism up --loan (capacity=,policy=,promo=,high=,target=,low=,p99=,queue=,min-lease=,cool-down=,drain-timeout=,startup=,borrow-timeout=,tick=,window=,grace=) (README: Promotions and capacity loaning)")
	fl.StringVar(&routerAddr, "router", "", "a router's gRPC address: the driver lists its registry (workers announce to every router)")
	fl.StringVar(&routerMetrics, "router-metrics", "", "the routers' /metrics URL; a host name is resolved at each tick and every address scraped (https://prism-router-headless:9090/metrics when the routers serve TLS: scraped with --certs, the router's certificate checked against the CA and for the router role; http:// with --insecure)")
	fl.StringVar(&addr, "metrics-addr", "0.0.0.0:9470", "where to serve GET /metrics (the prism_capacity_* counters) and GET /loan (lent workers, the timeline)")
	fl.StringVar(&onExit, "on-exit", "return", "what SIGTERM does with the lent Pods: return (delete them with their grace: they drain) or keep (leave them serving; the next prism loan adopts them, up to its max: for a rolling update of prism loan mid-peak; switching loaning off with keep leaves them until deleted: kubectl delete pod -l prism.dev/lent-by)")
	fl.StringVar(&model, "model", "dense", "the name of the dense pool in the metrics and the timeline (every dense worker serves every model)")
	tlsFlags.Register(cmd, auth.Dense)
	_ = cmd.MarkFlagRequired("lender")
	return cmd
}

// runLoan wires the kubernetes lender, the driver and its HTTP endpoint,
// and runs them until ctx ends.
func runLoan(ctx context.Context, sp loan.Spec, routerAddr, routerMetrics, addr, model string, keep bool, creds grpc.DialOption, scraper *http.Client, logf func(string, ...any)) error {
	k := sp.Kube
	pool, err := kube.ParsePool(k.Pool)
	if err != nil {
		return fmt.Errorf("--lender: %w", err)
	}
	var tols []corev1.Toleration
	for _, t := range k.Taints {
		tol, err := kube.ParseTaint(t)
		if err != nil {
			return fmt.Errorf("--lender: %w", err)
		}
		tols = append(tols, tol)
	}
	client, err := kube.NewClient(k.Kubeconfig)
	if err != nil {
		return err
	}
	ns := k.Namespace
	if ns == "" {
		ns = kube.OwnNamespace()
	}
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	prov, err := kube.New(sctx, kube.Options{
		Client: client, Namespace: ns, Template: k.Template, Max: sp.Max, Pool: pool, Tolerations: tols,
		PriorityClass: k.PriorityClass, Resource: corev1.ResourceName(k.Resource), Grace: sp.Grace, IdleRefresh: k.IdleRefresh, Logf: logf,
	})
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
	conn, err := grpc.NewClient(routerAddr, creds, serve.ListDialOption())
	if err != nil {
		return fmt.Errorf("dial router %s: %w", routerAddr, err)
	}
	defer conn.Close()
	reg := prismv1.NewRegistryClient(conn)
	d, err := loan.New(loan.Options{
		Provider: prov, Controller: sp.Controller, Model: model, Client: scraper,
		Registry: func(ctx context.Context) ([]*prismv1.WorkerInfo, error) {
			resp, err := reg.List(ctx, &prismv1.ListRequest{})
			return resp.GetWorkers(), err
		},
		RouterMetrics:     func() string { return loan.EveryAddress(ctx, routerMetrics) },
		CapacityPerWorker: sp.CapacityPerWorker, Tick: sp.Tick, Window: sp.Window, Logf: logf, Promotions: sp.Promotions,
	})
	if err != nil {
		return err
	}
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
