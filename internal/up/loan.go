package up

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/capacity/loan"
	"github.com/prism-serve/prism/capacity/local"
	"github.com/prism-serve/prism/gpuserve/devices"
	"github.com/prism-serve/prism/internal/auth"
	"github.com/prism-serve/prism/internal/readyline"
	"github.com/prism-serve/prism/internal/serve"
	"github.com/prism-serve/prism/internal/supervise"
)

// routerMetricsWatch passes the supervisor's output through and keeps
// the metrics address of the router's latest ready line ("[router]
// router listening on ADDR (metrics MADDR)"): the loan driver scrapes it,
// and a restarted router is followed.
type routerMetricsWatch struct {
	w    io.Writer
	addr atomic.Pointer[string]
	// httpAddr is the line's HTTP/JSON address (readyline.RouterHTTP).
	httpAddr atomic.Pointer[string]
	// scheme is "https" when the router serves TLS (and so /metrics),
	// "http" (or "") otherwise; set before url is called.
	scheme string
}

func (r *routerMetricsWatch) Write(b []byte) (int, error) {
	if s := string(b); strings.HasPrefix(s, "[router] router listening on ") {
		if _, rest, ok := strings.Cut(s, "(metrics "); ok {
			if a, _, ok := strings.Cut(rest, ")"); ok && a != "" {
				r.addr.Store(&a)
			}
		}
		if a := readyline.RouterHTTP(s); a != "" {
			r.httpAddr.Store(&a)
		}
	}
	return r.w.Write(b)
}

// http is the HTTP/JSON address of the router's latest ready line, ""
// when it named none.
func (r *routerMetricsWatch) http() string {
	if a := r.httpAddr.Load(); a != nil {
		return *a
	}
	return ""
}

func (r *routerMetricsWatch) url() string {
	if a := r.addr.Load(); a != nil {
		scheme := r.scheme
		if scheme == "" {
			scheme = "http"
		}
		return scheme + "://" + *a + "/metrics"
	}
	return ""
}

// LoanSlots are the devices the local lender lends: those the owned
// dense workers leave free (GPUs or MIG slices; without a driver, the
// CPU cores beyond them), shared round-robin when fewer than max; none
// free shares all the devices (or, on the CPU, the cores).
func LoanSlots(disc devices.Discovery, owned, max, cpus int) []local.Slot {
	var slots []local.Slot
	if disc.NoDriver != "" || len(disc.Devices) == 0 {
		for i := owned; i < cpus; i++ {
			slots = append(slots, local.Slot{Name: fmt.Sprintf("cpu core %d", i)})
		}
		if len(slots) == 0 {
			slots = append(slots, local.Slot{Name: "cpu (shared with the owned workers)"})
		}
		return slots
	}
	all := devices.Plan(disc)
	free := all
	if owned < len(all) {
		free = all[owned:]
	}
	for _, w := range free {
		slots = append(slots, local.Slot{Name: fmt.Sprintf("%v %d %s", w.Device.Kind, w.Device.Index, w.Device.UUID), Env: w.Env})
	}
	return slots
}

// startLoan runs capacity loaning beside the router (prism up --loan):
// the local lender, the controller's driver, and the HTTP endpoint of
// its metrics and reclaims. stop ends them, the lent workers first.
func startLoan(ctx context.Context, c Config, sp loan.Spec, routerAddr string, creds grpc.DialOption, metrics *routerMetricsWatch, disc devices.Discovery, owned []devices.Worker, models []string) (stop func(), err error) {
	logf := func(format string, args ...any) { fmt.Fprintf(c.Stderr, "up: "+format+"\n", args...) }
	slots := LoanSlots(disc, len(owned), sp.Max, runtime.GOMAXPROCS(0))
	if (disc.NoDriver != "" || len(disc.Devices) == 0) && c.Threads == 0 && os.Getenv("GOMAXPROCS") == "" {
		// A lent CPU worker is lent one core: with --threads 0 its
		// sessions share that core, not every core of the machine.
		for i := range slots {
			slots[i].Env = append(slots[i].Env, "GOMAXPROCS=1")
		}
	}
	prov, err := local.New(local.Options{
		Max: sp.Max, Slots: slots,
		// Lent worker k (of those lent at once) has the certificate of
		// dense worker owned+k, so each id is bound to a certificate of
		// its own (all shared dense-0's).
		ArgsFor: func(k int) []string { return DenseArgs(c, routerAddr, len(owned)+k) },
		Starter: &supervise.Exec{Path: c.Exe, Stderr: c.Stderr}, Stdout: c.Stdout,
		Logf:         func(format string, args ...any) { logf("loan: "+format, args...) },
		ReadyTimeout: c.ReadyTimeout, ReclaimAfter: sp.ReclaimAfter, ReclaimGrace: sp.Grace, Hold: sp.Hold,
	})
	if err != nil {
		return nil, err
	}
	conn, err := grpc.NewClient(routerAddr, creds, serve.ListDialOption())
	if err != nil {
		return nil, fmt.Errorf("loan: dial router %s: %w", routerAddr, err)
	}
	reg := prismv1.NewRegistryClient(conn)
	// The router's /metrics is HTTPS under TLS: scraped as admin, the
	// router verified against the CA.
	var scraper *http.Client
	metrics.scheme = serve.MetricsScheme(!c.Insecure)
	if !c.Insecure {
		admin, err := auth.ResolveCerts(c.Certs, auth.Admin)
		if err != nil {
			conn.Close()
			return nil, fmt.Errorf("loan: %w", err)
		}
		tc, err := auth.ScrapeTLS(admin.Files, auth.Router)
		if err != nil {
			conn.Close()
			return nil, fmt.Errorf("loan: %w", err)
		}
		scraper = &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: tc}}
	}
	d, err := loan.New(loan.Options{
		Client:   scraper,
		Provider: prov, Controller: sp.Controller, Model: strings.Join(models, ","),
		Registry: func(ctx context.Context) ([]*prismv1.WorkerInfo, error) {
			resp, err := reg.List(ctx, &prismv1.ListRequest{})
			return resp.GetWorkers(), err
		},
		RouterMetrics: metrics.url, CapacityPerWorker: sp.CapacityPerWorker, Tick: sp.Tick, Window: sp.Window, Logf: logf, Promotions: sp.Promotions,
	})
	if err != nil {
		conn.Close()
		return nil, err
	}
	lis, err := net.Listen("tcp", sp.Addr)
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("loan: listen %s: %w", sp.Addr, err)
	}
	// Under TLS the endpoint is HTTPS with the router's certificate, as
	// the router's /metrics: reads for any client, verified or not; a
	// reclaim (it drains a worker) for an admin certificate only.
	handler, scheme := d.Handler(), "http"
	if !c.Insecure {
		rf, err := auth.ResolveCerts(c.Certs, auth.Router)
		var st *tls.Config
		if err == nil {
			st, err = auth.ServerTLS(rf.Files, auth.ServerTLSOptions{AllowNoClientCert: true})
		}
		if err != nil {
			lis.Close()
			conn.Close()
			return nil, fmt.Errorf("loan: %w", err)
		}
		lis = tls.NewListener(lis, serve.MetricsTLS(st, false))
		handler, scheme = adminWrites(handler), "https"
	}
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logf("loan: http: %v", err)
		}
	}()
	names := make([]string, len(slots))
	for i, s := range slots {
		names[i] = s.Name
	}
	capa := "measured when the workers saturate"
	if sp.CapacityPerWorker > 0 {
		capa = fmt.Sprintf("%g requests/s per worker", sp.CapacityPerWorker)
	}
	o := d.Options()
	logf("loan: local lender, up to %d dense workers on %s; %s policy, capacity %s, tick %s, minimum lease %s, cool-down %s; controller at %s://%s (GET /metrics, GET /loan, POST /loan/reclaim)",
		sp.Max, strings.Join(names, ", "), o.Policy, capa, sp.Tick, o.MinLease, o.CoolDown, scheme, lis.Addr())
	dctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { d.Run(dctx) })
	return func() {
		cancel()
		wg.Wait()
		prov.Close()
		srv.Close()
		conn.Close()
	}, nil
}

// adminWrites lets through reads (GET, HEAD) from any client and other
// requests (POST /loan/reclaim) only from a client whose verified
// certificate is an admin's: the endpoint serves HTTPS with client
// certificates optional, as a tier's /metrics does.
func adminWrites(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			if r.TLS == nil || len(r.TLS.VerifiedChains) == 0 || len(r.TLS.VerifiedChains[0]) == 0 {
				http.Error(w, r.Method+" "+r.URL.Path+" needs a client certificate of role admin (prism certs init's admin folder)", http.StatusUnauthorized)
				return
			}
			if role := auth.RoleOf(r.TLS.VerifiedChains[0][0]); role != auth.Admin {
				http.Error(w, fmt.Sprintf("%s %s needs role admin; the client certificate's is %q", r.Method, r.URL.Path, role), http.StatusForbidden)
				return
			}
		}
		h.ServeHTTP(w, r)
	})
}
