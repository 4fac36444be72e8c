package router

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/internal/serve"
)

// The update queue's bound (--max-update-queue-bytes) is documented as
// bounding the router's memory, so it counts what an update waiting for
// its model's turn holds there: its decoded message and what serving it
// holds per call (the handler's goroutine, gRPC's stream, the driver's
// client). These tests serve a router over gRPC on loopback with the
// server tier's options (serve.New), hold its model's turn at a gated
// worker, and have a client in another process send it updates that
// wait: the router's process holds only the router's side of them.

// queueShape is an update's shape: ids rows of dim floats.
type queueShape struct {
	name     string
	ids, dim int
}

var queueShapes = []queueShape{
	{"one row of 16", 1, 16},
	{"64 rows of 64", 64, 64},
}

// request is the update the client process sends as its i-th.
func (sh queueShape) request(i int) *prismv1.UpdateRequest {
	req := &prismv1.UpdateRequest{Model: "m", Table: "t", Rows: make([]byte, 4*sh.ids*sh.dim)}
	for k := range sh.ids {
		req.Ids = append(req.Ids, int64(i*sh.ids+k))
	}
	return req
}

// queueServer is a router past its start-up wait, served by a
// serve.Server on loopback, whose one embedding worker holds the
// model's first update until the test ends: every update it is sent
// waits for its turn (or is refused).
type queueServer struct {
	rig  *updateRig
	addr string
}

func newQueueServer(t *testing.T, o Options) *queueServer {
	t.Helper()
	cn := &seqCN{}
	rig := newUpdateRig(t, o, cn)
	gate, entered := make(chan struct{}), make(chan struct{}, 1)
	cn.mu.Lock()
	cn.gate, cn.entered = gate, entered
	cn.mu.Unlock()
	first := make(chan error, 1)
	go func() { _, err := rig.update("t", 0, 1); first <- err }()
	<-entered
	s, err := serve.New("router", serve.Options{MetricsAddr: "off", ShutdownGrace: time.Second, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	prismv1.RegisterEmbeddingsServer(s.GRPC, rig.r.Updater())
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx) }()
	t.Cleanup(func() {
		cn.mu.Lock()
		cn.gate = nil
		cn.mu.Unlock()
		close(gate)
		if err := <-first; err != nil {
			t.Errorf("the update holding the turn: %v", err)
		}
		cancel()
		<-served
		rig.r.upd.wait()
	})
	return &queueServer{rig: rig, addr: s.Addr()}
}

// settled waits until the router has taken or refused n updates from
// the client beside the first one, and returns how many wait.
func (q *queueServer) settled(t *testing.T, n int) int {
	t.Helper()
	refused := q.rig.r.m.rejected.WithLabelValues("updates")
	deadline := time.Now().Add(2 * time.Minute)
	for {
		q.rig.r.upd.mu.Lock()
		waiting := len(q.rig.r.upd.clients) - 1
		q.rig.r.upd.mu.Unlock()
		if waiting+int(counterValue(t, refused)) >= n {
			// The refused calls' goroutines end a moment after their
			// answers are counted: until then they hold their stacks.
			for last, same := 0, 0; same < 5 && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
				if now := runtime.NumGoroutine(); now != last {
					last, same = now, 0
				} else {
					same++
				}
			}
			return waiting
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d updates wait and %v were refused, want %d in all", waiting, counterValue(t, refused), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// queueClient is the client process: it sends the router updates of
// its shape, "send N" at a time, and leaves them waiting.
type queueClient struct {
	in  io.WriteCloser
	out *bufio.Scanner
}

const queueClientEnv = "PRISM_UPDATE_QUEUE_CLIENT"

// startQueueClient starts the client process on conns connections to
// addr, and returns once they are up.
func startQueueClient(t *testing.T, addr string, conns int, sh queueShape) *queueClient {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestUpdateQueueClientProcess$")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s %d %d %d", queueClientEnv, addr, conns, sh.ids, sh.dim))
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	c := &queueClient{in: in, out: bufio.NewScanner(out)}
	c.expect(t, "ready")
	return c
}

func (c *queueClient) expect(t *testing.T, word string) {
	t.Helper()
	for c.out.Scan() {
		if line := c.out.Text(); strings.HasPrefix(line, "queueclient ") {
			if line != "queueclient "+word {
				t.Fatalf("client process: %s", line)
			}
			return
		}
	}
	t.Fatalf("client process ended: %v", c.out.Err())
}

// send has the client send n more updates, and returns once it has
// sent them (not waiting for their answers).
func (c *queueClient) send(t *testing.T, n int) {
	t.Helper()
	if _, err := fmt.Fprintf(c.in, "send %d\n", n); err != nil {
		t.Fatal(err)
	}
	c.expect(t, "sent")
}

// TestUpdateQueueClientProcess is the client process of the tests
// below (skipped when run otherwise).
func TestUpdateQueueClientProcess(t *testing.T) {
	spec := os.Getenv(queueClientEnv)
	if spec == "" {
		t.Skip("the client process of the update queue's memory tests")
	}
	var addr string
	var conns int
	var sh queueShape
	if _, err := fmt.Sscan(spec, &addr, &conns, &sh.ids, &sh.dim); err != nil {
		t.Fatal(err)
	}
	var clients []prismv1.EmbeddingsClient
	for range conns {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		c := prismv1.NewEmbeddingsClient(conn)
		// A bad update, refused at once: the connection is up.
		if _, err := c.Update(context.Background(), &prismv1.UpdateRequest{}); err == nil {
			t.Fatal("an empty update was taken")
		}
		clients = append(clients, c)
	}
	fmt.Println("queueclient ready")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	in := bufio.NewScanner(os.Stdin)
	sent := 0
	for in.Scan() {
		var n int
		if _, err := fmt.Sscanf(in.Text(), "send %d", &n); err != nil {
			t.Fatal(err)
		}
		for range n {
			req := sh.request(sent)
			c := clients[sent%len(clients)]
			sent++
			wg.Go(func() { c.Update(ctx, req) })
		}
		fmt.Println("queueclient sent")
	}
	// The parent closed stdin: the updates are answered or cut.
	cancel()
	wg.Wait()
}

// memUse is the router process's memory after a collection: the
// heap's live objects (live), the heap's spans in use (heap: live
// objects and the free slots among them) and the goroutine stacks'
// (stack).
type memUse struct{ live, heap, stack int64 }

func memNow() memUse {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return memUse{live: int64(ms.HeapAlloc), heap: int64(ms.HeapInuse), stack: int64(ms.StackInuse)}
}

func (m memUse) minus(o memUse) memUse {
	return memUse{m.live - o.live, m.heap - o.heap, m.stack - o.stack}
}

// TestUpdateQueueMemoryPerUpdate measures the router's memory per
// update waiting for its turn, of each shape: two steps of n updates
// each, from 4 connections, each step's growth per update.
func TestUpdateQueueMemoryPerUpdate(t *testing.T) {
	for _, sh := range queueShapes {
		t.Run(sh.name, func(t *testing.T) {
			if !inHeapChild(t) {
				return
			}
			q := newQueueServer(t, Options{MaxUpdateQueueBytes: 1 << 40})
			c := startQueueClient(t, q.addr, 4, sh)
			n := 2000
			if sh.ids*sh.dim > 64 {
				n = 500
			}
			req := sh.request(0)
			at := memNow()
			for step := 1; step <= 2; step++ {
				c.send(t, n)
				if got := q.settled(t, step*n); got != step*n {
					t.Fatalf("%d updates wait, want %d", got, step*n)
				}
				now := memNow()
				d := now.minus(at)
				at = now
				per := func(b int64) float64 { return float64(b) / float64(n) }
				t.Logf("step %d, %d more updates waiting, per update: %.0f bytes of live heap, %.0f of heap spans in use, %.0f of stacks: %.0f live and stacks, %.0f spans and stacks (counted: %d, before: %d)",
					step, n, per(d.live), per(d.heap), per(d.stack), per(d.live+d.stack), per(d.heap+d.stack), queuedBytes(req), len(req.GetRows())+8*len(req.GetIds()))
				// The count covers what a waiting update holds (a gRPC or
				// Go release that made a call heavier would pass it).
				if got := per(d.live + d.stack); got > 1.1*float64(queuedBytes(req)) {
					t.Errorf("a waiting update holds %.0f bytes of live heap and stack, over the %d queuedBytes counts: measure waitingUpdateBytes again", got, queuedBytes(req))
				}
			}
		})
	}
}

// TestUpdateQueueMemoryWithinLimit: with the queue's limit at 4 MiB, a
// flood of updates of each shape (more than would fit) leaves waiting
// updates holding at most about 4 MiB of the router's memory, heap and
// stacks: the rest are refused. Counted by their ids and rows alone
// (72 bytes for one row of 16 floats, where waiting it holds some 13
// KB), all 600 one-row updates waited, 1.8 times the limit (and as many
// more as were sent: 58,000 fit); of 64 rows of 64, 248 waited, 1.8
// times the limit.
func TestUpdateQueueMemoryWithinLimit(t *testing.T) {
	const limit = 4 << 20
	for _, sh := range queueShapes {
		t.Run(sh.name, func(t *testing.T) {
			if !inHeapChild(t) {
				return
			}
			q := newQueueServer(t, Options{MaxUpdateQueueBytes: limit})
			c := startQueueClient(t, q.addr, 4, sh)
			// Twice what the limit takes at what each holds.
			n := 600
			if sh.ids*sh.dim > 64 {
				n = 300
			}
			before := memNow()
			c.send(t, n)
			waiting := q.settled(t, n)
			d := memNow().minus(before)
			held := d.live + d.stack
			t.Logf("%d of %d updates wait, counted %d bytes: they hold %d bytes of live heap and stacks (%.2fx the limit); %d of heap spans and stacks in use (%.2fx)",
				waiting, n, q.rig.r.updateBytes.Load(), held, float64(held)/limit, d.heap+d.stack, float64(d.heap+d.stack)/limit)
			if float64(held) > 1.2*limit {
				t.Errorf("updates waiting within a limit of %d bytes hold %d bytes of memory (%.2fx)", limit, held, float64(held)/limit)
			}
			// Counting high refuses updates the memory had room for.
			if float64(held) < 0.6*limit {
				t.Errorf("updates waiting within a limit of %d bytes hold only %d bytes of memory (%.2fx)", limit, held, float64(held)/limit)
			}
			if waiting == n {
				t.Errorf("all %d updates wait: the flood did not reach the limit", n)
			}
		})
	}
}

// TestQueuedBytes: what an update taken counts against the queue's
// limit, its message as decoded and the call's own, each array and
// string at its size class (UpdateRequest's struct is 128 bytes on a
// 64-bit platform).
func TestQueuedBytes(t *testing.T) {
	if strconv.IntSize != 64 {
		t.Skip("the sizes are a 64-bit platform's")
	}
	const call, msg = waitingUpdateBytes, 128
	unknown := &prismv1.UpdateRequest{Model: "m", Table: "t", Ids: []int64{1}, Rows: make([]byte, 64)}
	unknown.ProtoReflect().SetUnknown([]byte{0xa8, 0x1f, 0x01}) // field 501, varint 1: a newer client's
	for _, tc := range []struct {
		name string
		req  *prismv1.UpdateRequest
		want int64
	}{
		{"one row of one float", queueShape{ids: 1, dim: 1}.request(0), call + msg + 8 + 8 + 8 + 8},
		{"one row of 16", queueShapes[0].request(0), call + msg + 8 + 8 + 8 + 64},
		{"64 rows of 64", queueShapes[1].request(0), call + msg + 8 + 8 + 512 + 16384},
		{"longer names", &prismv1.UpdateRequest{Model: "ranking-v2", Table: "emb_l.12.weight", Ids: []int64{1, 2, 3}, Rows: make([]byte, 3*4*10)},
			call + msg + 16 + 16 + 24 + 128},
		// Decoded, a packed field's array is allocated at its length; one
		// grown by append is counted at its capacity.
		{"ids' spare capacity", &prismv1.UpdateRequest{Model: "m", Table: "t", Ids: make([]int64, 3, 8), Rows: make([]byte, 12)},
			call + msg + 8 + 8 + 64 + 16},
		{"past the largest size class: whole pages", &prismv1.UpdateRequest{Model: "m", Table: "t", Ids: make([]int64, 1024), Rows: make([]byte, 1024*4*32+1)},
			call + msg + 8 + 8 + 8192 + 136<<10},
		{"unknown fields kept", unknown, call + msg + 8 + 8 + 8 + 64 + 8},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := queuedBytes(tc.req); got != tc.want {
				t.Errorf("queuedBytes = %d, want %d", got, tc.want)
			}
		})
	}
}
