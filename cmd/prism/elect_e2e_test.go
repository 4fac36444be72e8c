package main

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	coordinationv1 "k8s.io/client-go/kubernetes/typed/coordination/v1"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/internal/auth"
	"github.com/prism-serve/prism/internal/kubetest"
	"github.com/prism-serve/prism/internal/leview"
	"github.com/prism-serve/prism/internal/readyline"
	"github.com/prism-serve/prism/plan"
)

// TestElectedFailoverCatchUp, on real processes and a real API server
// (skipped without one: make kube-apiserver): two routers elect their
// update sequencer through a Lease, three embedding workers hold the
// model. Worker 3 is killed and misses update 2; the holder is killed
// (kill -9) a moment later. The other router takes the Lease over and
// starts its sequencer from its copy of the old holder's update log
// (router/replica.go), so worker 3, back on its store holding update 1,
// is caught up to 2 by replay and serves again. Before the copy the new
// holder could not: worker 3 stayed out of serving until an operator
// copied a store.
func TestElectedFailoverCatchUp(t *testing.T) {
	api := kubetest.Start(t)
	dir := t.TempDir()
	_, part, cfg := partitioned(t, dir, "dlrm-tiny")
	p, err := plan.Read(part)
	if err != nil {
		t.Fatal(err)
	}
	dbs := make([]string, 3)
	for k := range dbs {
		dbs[k] = filepath.Join(dir, fmt.Sprintf("db%d", k))
		if out, err := run(t, nil, "ingest", part, "--db", dbs[k]); err != nil {
			t.Fatalf("ingest: %v\n%s", err, out)
		}
	}
	certs := newCerts(t)
	free := func() string {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer lis.Close()
		return lis.Addr().String()
	}
	addrs := []string{free(), free()}
	routers := make([]*proc, 2)
	for i, addr := range addrs {
		routers[i] = startProc(t, readyline.Router, "serve", "router", "--certs", certs, "--addr", addr, "--advertise-addr", addr,
			"--heartbeat", "200ms", "--update-quorum", "majority", "--sequencer-lease", "default/prism-router-sequencer",
			"--kubeconfig", api.Kubeconfig, "--sequencer-lease-duration", "2s")
	}
	both := strings.Join(addrs, ",")
	startProc(t, readyline.Dense, "serve", "dense", "--certs", certs, "--plan", part, "--router", both)
	embedding := func(k int) *proc {
		return startProc(t, readyline.Embedding, "serve", "embedding", "--certs", certs, "--plan", part, "--db", dbs[k], "--router", both)
	}
	workers := []*proc{embedding(0), embedding(1), embedding(2)}

	kc, err := clientcmd.BuildConfigFromFlags("", api.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	leases, err := coordinationv1.NewForConfig(kc)
	if err != nil {
		t.Fatal(err)
	}
	holder := func() int {
		l, err := leases.Leases("default").Get(context.Background(), "prism-router-sequencer", metav1.GetOptions{})
		if err != nil || l.Spec.HolderIdentity == nil {
			return -1
		}
		addr, _, _ := strings.Cut(*l.Spec.HolderIdentity, "#")
		for i, a := range addrs {
			if a == addr {
				return i
			}
		}
		return -1
	}
	row := make([]float32, p.Tables[0].Dim)
	update := func(via int, v float32) {
		t.Helper()
		conn := dial(t, addrs[via], certs, auth.Admin)
		defer conn.Close()
		for i := range row {
			row[i] = v
		}
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			_, err := prismv1.NewEmbeddingsClient(conn).Update(ctx, &prismv1.UpdateRequest{Model: cfg.Name, Table: p.Tables[0].Name, Ids: []int64{3}, Rows: leview.Bytes(row)})
			cancel()
			if err == nil {
				return
			}
			if status.Code(err) != codes.Unavailable || time.Now().After(deadline) {
				t.Fatalf("update %v via router %d: %v", v, via, err)
			}
		}
	}
	// holds waits until router via lists the embedding worker at addr
	// holding update seq.
	holds := func(via int, addr string, seq int64, within time.Duration) {
		t.Helper()
		conn := dial(t, addrs[via], certs, auth.Admin)
		defer conn.Close()
		var last string
		for deadline := time.Now().Add(within); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			ws, err := prismv1.NewRegistryClient(conn).List(context.Background(), &prismv1.ListRequest{})
			if err != nil {
				last = err.Error()
				continue
			}
			for _, w := range ws.GetWorkers() {
				if w.GetAddr() == addr {
					last = fmt.Sprintf("holds %d", w.GetUpdateSeq()[cfg.Name])
					if w.GetUpdateSeq()[cfg.Name] == seq {
						return
					}
				}
			}
		}
		t.Fatalf("router %d never listed the worker at %s holding update %d (last: %s)", via, addr, seq, last)
	}

	var a int
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if a = holder(); a >= 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no router took the Lease")
		}
	}
	b := 1 - a
	update(b, 1) // forwarded to the holder
	for _, w := range workers {
		holds(a, w.addr, 1, 10*time.Second)
	}
	// Worker 3 is killed and misses update 2 (acknowledged by the other
	// two, a majority); the follower copies the log at its heartbeat.
	workers[2].cmd.Process.Kill()
	workers[2].cmd.Wait()
	update(a, 2)
	time.Sleep(2 * time.Second) // ten heartbeats: the copy is pulled
	killed := time.Now()
	routers[a].cmd.Process.Kill()
	routers[a].cmd.Wait()
	back := embedding(2) // on its store: holds update 1
	for deadline := time.Now().Add(30 * time.Second); holder() != b; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("router %d never took the Lease over (holder %d)", b, holder())
		}
	}
	tookOver := time.Since(killed)
	holds(b, back.addr, 2, 20*time.Second)
	t.Logf("holder killed: the other router held the Lease after %v, and worker 3 held update 2 after %v (lease 2 s, heartbeat 200 ms)", tookOver.Round(time.Millisecond), time.Since(killed).Round(time.Millisecond))
	if !strings.Contains(routers[b].log.String(), "starts from its copy") {
		t.Errorf("router %d did not say it started from its copy:\n%s", b, routers[b].log.String())
	}
	update(b, 3)
	holds(b, back.addr, 3, 10*time.Second)
}
