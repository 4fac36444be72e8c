package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"github.com/prism-serve/prism/plan"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/gpuserve"
)

func init() { subcommands = append(subcommands, newUpCmd) }

type upFlags struct {
	plans      []string
	db         string
	addr       string
	gpuWorkers int
	cpuWorkers int
	threads    int
	microBatch int
	maxBatch   int
	maxDelay   time.Duration
	hotBytes   string
	ready      time.Duration
}

func newUpCmd() *cobra.Command {
	var f upFlags
	cmd := &cobra.Command{
		Use:   "up --model PLAN_DIR...",
		Short: "Start all three tiers on this machine (real gRPC on loopback) and print the address to call",
		Long: `up starts the router, one dense worker per GPU or MIG slice (one per CPU
core without a driver) and the embedding tier as child processes of this binary,
on loopback ports, waits until every model has both tiers registered, and
prints the Recommend address. Workers that die are restarted and register
again. Ctrl-C stops everything gracefully.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runUp(cmd, f)
		},
	}
	fl := cmd.Flags()
	fl.StringArrayVar(&f.plans, "model", nil, "partition folder (prism partition -o) to serve; repeatable")
	fl.StringVar(&f.db, "db", "", "embedding store folder (default: prism-db beside the first model)")
	fl.StringVar(&f.addr, "addr", "127.0.0.1:8500", "router address (Recommend)")
	fl.IntVar(&f.gpuWorkers, "gpu-workers", 0, "dense workers (0: one per GPU or MIG slice; without a driver, one per CPU core)")
	fl.IntVar(&f.cpuWorkers, "cpu-workers", 1, "embedding workers")
	fl.IntVar(&f.threads, "threads", 1, "ONNX Runtime threads per dense worker on the CPU")
	fl.IntVar(&f.microBatch, "micro-batch", 512, "router micro-batch size")
	fl.IntVar(&f.maxBatch, "max-batch", 512, "dense tier max batch size")
	fl.DurationVar(&f.maxDelay, "max-delay", 2*time.Millisecond, "dense tier max queue delay")
	fl.StringVar(&f.hotBytes, "hot-bytes", "", "embedding hot tier size (e.g. 512MiB; default: the store's)")
	fl.DurationVar(&f.ready, "ready-timeout", 10*time.Minute, "how long to wait for the tiers (ingest included)")
	return cmd
}

// child is one tier process.
type child struct {
	name  string
	args  []string
	env   []string
	ready string // stdout prefix announcing the listen address
	mu    sync.Mutex
	cmd   *exec.Cmd
	// done is closed when the current process has exited; err is then
	// its exit status. One goroutine per process calls Wait.
	done chan struct{}
	err  error
	// halt is closed when up shuts down: a process started after that is
	// stopped at once.
	halt chan struct{}
}

func isClosed(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func (c *child) start(exe string, timeout time.Duration) (string, error) {
	cmd := exec.Command(exe, c.args...)
	cmd.Env = append(os.Environ(), c.env...)
	// Its own process group: a Ctrl-C at the terminal reaches up alone,
	// which then stops the tiers in order.
	// Pdeathsig: if up dies without stopping them, the tiers get SIGTERM
	// instead of living on (an orphaned embedding worker would keep the
	// store's lock).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	cmd.Stderr = prefixWriter(os.Stderr, "["+c.name+"] ")
	out, err := cmd.StdoutPipe()
	if err != nil {
		return "", err
	}
	if err := cmd.Start(); err != nil {
		return "", fmt.Errorf("start %s: %w", c.name, err)
	}
	done := make(chan struct{})
	c.mu.Lock()
	c.cmd, c.done = cmd, done
	halted := c.halt != nil && isClosed(c.halt)
	c.mu.Unlock()
	if halted {
		// Shutdown began while this (re)start was under way.
		cmd.Process.Signal(syscall.SIGTERM)
	}
	addrc := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		sent := false
		for sc.Scan() {
			line := sc.Text()
			if !sent && strings.HasPrefix(line, c.ready) {
				addrc <- strings.Fields(strings.TrimPrefix(line, c.ready))[0]
				sent = true
			}
			fmt.Fprintf(os.Stdout, "[%s] %s\n", c.name, line)
		}
		if !sent {
			close(addrc)
		}
		err := cmd.Wait()
		c.mu.Lock()
		c.err = err
		c.mu.Unlock()
		close(done)
	}()
	select {
	case addr, ok := <-addrc:
		if !ok {
			<-done
			return "", fmt.Errorf("%s exited before it was ready (see its log above)", c.name)
		}
		return addr, nil
	case <-time.After(timeout):
		cmd.Process.Kill()
		<-done
		return "", fmt.Errorf("%s not ready after %s", c.name, timeout)
	}
}

func (c *child) signal(sig os.Signal) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cmd != nil && c.cmd.Process != nil {
		c.cmd.Process.Signal(sig)
	}
}

// wait blocks until the current process exits (at once if none started).
func (c *child) wait() error {
	c.mu.Lock()
	done := c.done
	c.mu.Unlock()
	if done == nil {
		return nil
	}
	<-done
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// stop sends SIGTERM and waits up to grace for the exit, then kills.
func (c *child) stop(grace time.Duration) {
	c.signal(syscall.SIGTERM)
	exited := make(chan struct{})
	go func() { c.wait(); close(exited) }()
	select {
	case <-exited:
	case <-time.After(grace):
		c.signal(os.Kill)
		<-exited
	}
}

func runUp(cmd *cobra.Command, f upFlags) error {
	if len(f.plans) == 0 {
		return errors.New("up: at least one --model PLAN_DIR is needed (make one with prism partition)")
	}
	var models []string
	for _, p := range f.plans {
		plan, err := plan.Read(p)
		if err != nil {
			return fmt.Errorf("up: %w", err)
		}
		models = append(models, plan.Model.Name)
	}
	if f.db == "" {
		f.db = filepath.Join(filepath.Dir(filepath.Clean(f.plans[0])), "prism-db")
	}
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	ctx, stop := signalContext()
	defer stop()

	// Stop order: the router first (it drains the requests in flight,
	// which still need both tiers), then the embedding workers (whose
	// last lookups still call the dense workers), then the dense workers.
	var children []*child
	stopping := make(chan struct{})
	shutdown := func() {
		for _, c := range children {
			c.mu.Lock()
		}
		close(stopping)
		for _, c := range children {
			c.mu.Unlock()
		}
		order := map[string]int{"router": 0, "cpu": 1, "gpu": 2}
		for stage := range 3 {
			var wg sync.WaitGroup
			for _, c := range children {
				if order[strings.TrimRight(c.name, "0123456789")] == stage {
					wg.Add(1)
					go func() { defer wg.Done(); c.stop(15 * time.Second) }()
				}
			}
			wg.Wait()
		}
	}
	defer shutdown()

	rt := &child{name: "router", ready: "router listening on ", args: []string{"serve", "router", "--addr", f.addr, "--micro-batch", fmt.Sprint(f.microBatch)}}
	children = append(children, rt)
	routerAddr, err := rt.start(exe, 30*time.Second)
	if err != nil {
		return err
	}

	planArgs := func() []string {
		var a []string
		for _, p := range f.plans {
			a = append(a, "--plan", p)
		}
		return a
	}
	disc, err := gpuserve.Discover(nvml.New())
	if err != nil {
		return fmt.Errorf("up: device discovery: %w", err)
	}
	if disc.NoDriver != "" {
		fmt.Fprintf(cmd.ErrOrStderr(), "up: no NVIDIA driver (%s): dense workers run on the CPU\n", disc.NoDriver)
	}
	workers := gpuserve.Plan(disc)
	if disc.NoDriver != "" && f.gpuWorkers == 0 {
		// On the CPU, one single-threaded dense worker per core: requests
		// spread over them with no barrier between threads, which measured
		// 25% more throughput than one worker with a thread per core
		// (BENCHMARKS.md).
		f.gpuWorkers = runtime.GOMAXPROCS(0) // the CPUs this container may use
	}
	if f.gpuWorkers > 0 {
		// More workers than devices share the devices round-robin.
		base := len(workers)
		for len(workers) < f.gpuWorkers {
			workers = append(workers, workers[len(workers)%base])
		}
		workers = workers[:f.gpuWorkers]
	}
	var workerChildren []*child
	for i, w := range workers {
		args := append([]string{"serve", "gpu", "--router", routerAddr, "--threads", fmt.Sprint(f.threads), "--max-batch", fmt.Sprint(f.maxBatch), "--max-delay", f.maxDelay.String()}, planArgs()...)
		workerChildren = append(workerChildren, &child{name: fmt.Sprintf("gpu%d", i), ready: "dense tier listening on ", args: args, env: w.Env, halt: stopping})
	}
	for i := range f.cpuWorkers {
		db := f.db
		if i > 0 {
			// Pebble locks its folder: each further embedding worker keeps its own copy.
			db = fmt.Sprintf("%s-%d", f.db, i)
		}
		args := append([]string{"serve", "cpu", "--router", routerAddr, "--db", db}, planArgs()...)
		if f.hotBytes != "" {
			args = append(args, "--hot-bytes", f.hotBytes)
		}
		workerChildren = append(workerChildren, &child{name: fmt.Sprintf("cpu%d", i), ready: "embedding tier listening on ", args: args, halt: stopping})
	}
	for _, c := range workerChildren {
		children = append(children, c)
		if _, err := c.start(exe, f.ready); err != nil {
			return err
		}
	}
	if err := waitRegistered(ctx, routerAddr, models, len(workers), f.cpuWorkers, f.ready); err != nil {
		return err
	}
	fmt.Fprintf(cmd.OutOrStdout(), "Prism is up: Recommend at %s (models %s; %d dense, %d embedding workers). Ctrl-C stops it.\n", routerAddr, strings.Join(models, ", "), len(workers), f.cpuWorkers)

	// Supervise: a worker that dies is restarted and registers again.
	for _, c := range workerChildren {
		go func() {
			for {
				err := c.wait()
				select {
				case <-stopping:
					return
				default:
				}
				if ctx.Err() != nil {
					return
				}
				fmt.Fprintf(cmd.ErrOrStderr(), "up: %s exited (%v); restarting\n", c.name, err)
				select {
				case <-ctx.Done():
					return
				case <-time.After(time.Second):
				}
				if _, err := c.start(exe, f.ready); err != nil {
					fmt.Fprintf(cmd.ErrOrStderr(), "up: restarting %s: %v\n", c.name, err)
				}
			}
		}()
	}
	<-ctx.Done()
	fmt.Fprintln(cmd.ErrOrStderr(), "up: stopping")
	return nil
}

// waitRegistered polls the router's registry until every model has its
// workers.
func waitRegistered(ctx context.Context, addr string, models []string, gpus, cpus int, timeout time.Duration) error {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	reg := prismv1.NewRegistryClient(conn)
	deadline := time.Now().Add(timeout)
	for {
		resp, err := reg.List(ctx, &prismv1.ListRequest{})
		if err == nil {
			ok := true
			for _, m := range models {
				var c, g int
				for _, w := range resp.GetWorkers() {
					for _, wm := range w.GetModels() {
						if wm == m && w.GetRole() == prismv1.Role_ROLE_EMBEDDING {
							c++
						}
						if wm == m && w.GetRole() == prismv1.Role_ROLE_DENSE {
							g++
						}
					}
				}
				if c < cpus || g < gpus {
					ok = false
				}
			}
			if ok {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("up: workers did not all register within %s", timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// prefixWriter prefixes every line written to w.
func prefixWriter(w io.Writer, prefix string) io.Writer {
	pr, pw := io.Pipe()
	go func() {
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			fmt.Fprintf(w, "%s%s\n", prefix, sc.Text())
		}
	}()
	return pw
}
