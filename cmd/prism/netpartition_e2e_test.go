package main

import (
	"context"
	"fmt"
	"maps"
	"net"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/cpuserve/store"
	"github.com/prism-serve/prism/internal/leview"
	"github.com/prism-serve/prism/internal/netns"
	"github.com/prism-serve/prism/internal/readyline"
	"github.com/prism-serve/prism/models"
)

// The network-partition campaign of issue 14: the fault campaign's
// promises (no acknowledged update lost, no accepted request hung)
// under partitions rather than process kills. Every process runs on a
// "host" of its own kind (a network namespace on a bridge, real TCP,
// mutual TLS), and a partition is a host's link taken down (netns
// SetLink: the process lives on, nothing reaches it) and brought back,
// or the path between two hosts alone cut (a blackhole route to the
// other in each namespace). The clients (update stream, Recommend load)
// run in the root namespace. Each test skips, saying why, without root
// and iproute2.

// partNet is the hosts, the model and the certificates of one test.
type partNet struct {
	t     *testing.T
	topo  *netns.Topology
	dir   string
	part  string
	certs string
	cfg   models.Config
	dim   int
}

// newPartNet makes n hosts (skipping the test where namespaces cannot
// be made), dlrm-tiny partitioned and certificates for every host.
func newPartNet(t *testing.T, n int) *partNet {
	t.Helper()
	if err := netns.Available(); err != nil {
		t.Skipf("skipping the partition test: cannot make network namespaces here (%v); it needs root and iproute2", err)
	}
	dir := t.TempDir()
	_, part, cfg := partitioned(t, dir, "dlrm-tiny")
	topo, err := netns.New(n)
	if err != nil {
		t.Skipf("skipping the partition test: cannot build the namespaces (%v)", err)
	}
	// Registered before the processes: cleanups run last first, so the
	// processes stop before their namespaces go.
	t.Cleanup(func() {
		if err := topo.Close(); err != nil {
			t.Errorf("removing the namespaces: %v", err)
		}
	})
	certs := filepath.Join(dir, "certs")
	args := []string{"certs", "init", certs}
	for _, h := range topo.Hosts {
		args = append(args, "--host", h.Addr)
	}
	if out, err := run(t, nil, args...); err != nil {
		t.Fatalf("certs init: %v\n%s", err, out)
	}
	return &partNet{t: t, topo: topo, dir: dir, part: part, certs: certs, cfg: cfg, dim: cfg.EmbDim}
}

func (n *partNet) host(i int) *netns.Host { return n.topo.Hosts[i] }

// router starts a router on host i.
func (n *partNet) router(i int, extra ...string) *proc {
	n.t.Helper()
	h := n.host(i)
	args := append([]string{"serve", "router", "--certs", n.certs, "--addr", net.JoinHostPort(h.Addr, "0"),
		"--heartbeat", partHeartbeat.String(), "--micro-batch", "16"}, extra...)
	return startIn(n.t, n.topo, h, readyline.Router, args...)
}

// embedding starts an embedding worker on host i, on store db, which
// announces to routers.
func (n *partNet) embedding(i int, db, routers string) *proc {
	n.t.Helper()
	return startIn(n.t, n.topo, n.host(i), readyline.Embedding, "serve", "embedding", "--certs", n.certs, "--plan", n.part,
		"--threads", "1", "--db", db, "--addr", ":0", "--router", routers)
}

// dense starts a dense worker on host i.
func (n *partNet) dense(i int, routers string) *proc {
	n.t.Helper()
	return startIn(n.t, n.topo, n.host(i), readyline.Dense, "serve", "dense", "--certs", n.certs, "--plan", n.part,
		"--threads", "1", "--addr", ":0", "--router", routers)
}

// link takes host i's link down or up.
func (n *partNet) link(i int, up bool) {
	n.t.Helper()
	if err := n.topo.SetLink(n.host(i), up); err != nil {
		n.t.Fatal(err)
	}
}

const (
	partHeartbeat   = 200 * time.Millisecond
	partRecDeadline = 2 * time.Second
	partUpdAttempt  = 2 * time.Second
)

// workers lists what the router at conn's registry holds: the
// embedding workers' addresses with the update each announces, and
// every worker's address.
func workersOf(conn *grpc.ClientConn, model string) (emb map[string]int64, all []string, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	ws, err := prismv1.NewRegistryClient(conn).List(ctx, &prismv1.ListRequest{})
	if err != nil {
		return nil, nil, err
	}
	emb = map[string]int64{}
	for _, w := range ws.GetWorkers() {
		all = append(all, w.GetAddr())
		if w.GetRole() == prismv1.Role_ROLE_EMBEDDING {
			emb[w.GetAddr()] = w.GetUpdateSeq()[model]
		}
	}
	sort.Strings(all)
	return emb, all, nil
}

// awaitWorkers waits until the router at conn lists exactly addrs
// among its embedding workers.
func awaitWorkers(t *testing.T, conn *grpc.ClientConn, what string, within time.Duration, addrs ...string) time.Duration {
	t.Helper()
	want := slices.Sorted(slices.Values(addrs))
	began := time.Now()
	var got []string
	var err error
	for deadline := time.Now().Add(within); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		var emb map[string]int64
		if emb, _, err = workersOf(conn, ""); err == nil {
			got = slices.Sorted(maps.Keys(emb))
			if slices.Equal(got, want) {
				return time.Since(began)
			}
		}
	}
	t.Fatalf("%s: the registry lists %v (%v), want %v", what, got, err, want)
	return 0
}

// partUpdate is one update of a stream, with each attempt's outcome.
type partUpdate struct {
	faultUpdate
	via      []int // the router each attempt went to
	attempts []partAttempt
}

type partAttempt struct {
	start, end time.Time
	err        error
}

// updateStream is one sequential client writing faultRow(k) to a row
// of the first faultTables tables, retrying each update (as a client
// does on Unavailable) until it is acknowledged or giveUp passes, then
// going on with the next. Its routers take the attempts in turn.
type updateStream struct {
	t       *testing.T
	model   string
	dim     int
	clients []prismv1.EmbeddingsClient
	giveUp  time.Duration

	mu      sync.Mutex
	updates []*partUpdate
	stop    chan struct{}
	done    chan struct{}
}

func startUpdates(t *testing.T, model string, dim int, giveUp time.Duration, conns ...*grpc.ClientConn) *updateStream {
	s := &updateStream{t: t, model: model, dim: dim, giveUp: giveUp, stop: make(chan struct{}), done: make(chan struct{})}
	for _, c := range conns {
		s.clients = append(s.clients, prismv1.NewEmbeddingsClient(c))
	}
	go s.run()
	t.Cleanup(s.halt)
	return s
}

func (s *updateStream) run() {
	defer close(s.done)
	turn := 0
	for k := 1; ; k++ {
		select {
		case <-s.stop:
			return
		default:
		}
		// Rows are overwritten often: 4 tables x 12 ids, in an order
		// of k's hash.
		h := uint64(faultValue(k, 99)*1024 + 512)
		u := &partUpdate{faultUpdate: faultUpdate{k: k, table: int(h % faultTables), id: int64(h / faultTables % faultIDs)}}
		s.mu.Lock()
		s.updates = append(s.updates, u)
		s.mu.Unlock()
		req := &prismv1.UpdateRequest{Model: s.model, Table: models.TableName(u.table), Ids: []int64{u.id}, Rows: leview.Bytes(faultRow(k, s.dim))}
		for giveUp := time.Now().Add(s.giveUp); time.Now().Before(giveUp); {
			via := turn % len(s.clients)
			turn++
			ctx, cancel := context.WithTimeout(context.Background(), partUpdAttempt)
			start := time.Now()
			_, err := s.clients[via].Update(ctx, req)
			cancel()
			s.mu.Lock()
			u.attempts = append(u.attempts, partAttempt{start, time.Now(), err})
			u.via = append(u.via, via)
			if err == nil {
				u.acked = true
			} else {
				u.lastErr = err.Error()
			}
			s.mu.Unlock()
			if err == nil {
				break
			}
			if c := status.Code(err); c == codes.PermissionDenied || c == codes.Unauthenticated || c == codes.InvalidArgument {
				break
			}
			select {
			case <-s.stop:
				return
			case <-time.After(30 * time.Millisecond):
			}
		}
	}
}

// halt stops the stream (the update under way ends its attempt).
func (s *updateStream) halt() {
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	<-s.done
}

// acked counts the updates acknowledged so far.
func (s *updateStream) acked() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, u := range s.updates {
		if u.acked {
			n++
		}
	}
	return n
}

// window counts the attempts begun at from or later and ended by to:
// acknowledged, and failed by code.
// waitAcked waits until k more updates than now are acknowledged,
// failing t past within.
func (s *updateStream) waitAcked(t *testing.T, k int, within time.Duration) {
	t.Helper()
	target := s.acked() + k
	for deadline := time.Now().Add(within); s.acked() < target; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d updates acknowledged, want %d within %v", s.acked(), target, within)
		}
	}
}

func (s *updateStream) window(from, to time.Time) (ok int, failed map[codes.Code]int, ackedKs []int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	failed = map[codes.Code]int{}
	for _, u := range s.updates {
		for _, a := range u.attempts {
			if a.start.Before(from) || a.end.After(to) {
				continue
			}
			if a.err == nil {
				ok++
				ackedKs = append(ackedKs, u.k)
			} else {
				failed[status.Code(a.err)]++
			}
		}
	}
	return ok, failed, ackedKs
}

// late lists the attempts that outlived their deadline by over a
// second: hung.
func (s *updateStream) late() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, u := range s.updates {
		for _, a := range u.attempts {
			if took := a.end.Sub(a.start); took > partUpdAttempt+time.Second {
				out = append(out, fmt.Sprintf("update %d: an attempt took %v (%v)", u.k, took.Round(time.Millisecond), a.err))
			}
		}
	}
	return out
}

// acceptable is, per row the stream wrote, the values a store may hold
// once the stream stopped and the workers settled: the row's last
// acknowledged update, or a later one whose answer was not OK (it keeps
// its number and may have been applied). Rows never acknowledged are
// not checked.
func (s *updateStream) acceptable() (map[rowKey][]int, map[rowKey]int, int, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	last := map[rowKey]int{}
	acked, unacked := 0, 0
	for _, u := range s.updates {
		if u.acked {
			acked++
			last[rowKey{u.table, u.id}] = u.k
		} else {
			unacked++
		}
	}
	out := map[rowKey][]int{}
	for key, k := range last {
		out[key] = []int{k}
	}
	for _, u := range s.updates {
		key := rowKey{u.table, u.id}
		if k, ok := last[key]; ok && !u.acked && u.k > k {
			out[key] = append(out[key], u.k)
		}
	}
	return out, last, acked, unacked
}

// recLoad is Recommend load from the root namespace: clients calls in
// a loop, each with partRecDeadline.
type recLoad struct {
	mu    sync.Mutex
	calls []recCall
	stop  chan struct{}
	wg    sync.WaitGroup
}

type recCall struct {
	start, end time.Time
	err        error
}

func startLoad(t *testing.T, cfg models.Config, clients int, conns ...*grpc.ClientConn) *recLoad {
	l := &recLoad{stop: make(chan struct{})}
	src, _ := models.NewSynthetic(cfg.Signature(), models.SyntheticOptions{Seed: 11})
	b, _ := src.Next(32)
	req := toRequest(cfg.Name, b, nil)
	for i := range clients {
		rec := prismv1.NewRecommenderClient(conns[i%len(conns)])
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for {
				select {
				case <-l.stop:
					return
				default:
				}
				ctx, cancel := context.WithTimeout(context.Background(), partRecDeadline)
				start := time.Now()
				_, err := rec.Recommend(ctx, req)
				cancel()
				l.mu.Lock()
				l.calls = append(l.calls, recCall{start, time.Now(), err})
				l.mu.Unlock()
				if err != nil {
					time.Sleep(10 * time.Millisecond)
				}
			}
		}()
	}
	t.Cleanup(l.halt)
	return l
}

func (l *recLoad) halt() {
	select {
	case <-l.stop:
	default:
		close(l.stop)
	}
	l.wg.Wait()
}

// window counts the calls begun in [from, to): ok, failed by code, and
// the ones that outlived their deadline by over a second (hung).
func (l *recLoad) window(from, to time.Time) (ok int, failed map[codes.Code]int, hung []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	failed = map[codes.Code]int{}
	for _, c := range l.calls {
		if c.start.Before(from) || !c.start.Before(to) {
			continue
		}
		if took := c.end.Sub(c.start); took > partRecDeadline+time.Second {
			hung = append(hung, fmt.Sprintf("a call took %v (%v)", took.Round(time.Millisecond), c.err))
		}
		if c.err == nil {
			ok++
		} else {
			failed[status.Code(c.err)]++
		}
	}
	return ok, failed, hung
}

// settle waits until the sequencing router at conn lists n embedding
// workers all holding the last update it numbered, and returns it.
func settle(t *testing.T, conn *grpc.ClientConn, model string, n int, within time.Duration) int64 {
	t.Helper()
	var last map[string]int64
	var numbered int64
	var err error
	for deadline := time.Now().Add(within); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		var ws *prismv1.ListResponse
		ws, err = prismv1.NewRegistryClient(conn).List(ctx, &prismv1.ListRequest{})
		cancel()
		if err != nil {
			continue
		}
		numbered = ws.GetUpdates()[model].GetNumbered()
		last = map[string]int64{}
		for _, w := range ws.GetWorkers() {
			if w.GetRole() == prismv1.Role_ROLE_EMBEDDING {
				last[w.GetAddr()] = w.GetUpdateSeq()[model]
			}
		}
		if len(last) == n && !slices.ContainsFunc(slices.Collect(maps.Values(last)), func(s int64) bool { return s != numbered }) {
			return numbered
		}
	}
	t.Errorf("the embedding workers never all held the last update numbered, %d: %v (%v)", numbered, last, err)
	return -1
}

// checkStores stops the embedding workers (SIGTERM) and reads every row
// the stream acknowledged from each store: a row no store holds at an
// acceptable value is a lost update; a store holding another value is
// behind; replicas holding different rows or numbers differ.
func checkStores(t *testing.T, model string, dim int, s *updateStream, workers []*proc, dbs []string) (lost, behind, differ int) {
	t.Helper()
	for _, w := range workers {
		w.cmd.Process.Signal(syscall.SIGTERM)
		w.cmd.Wait()
	}
	acceptable, last, _, _ := s.acceptable()
	keys := make([]rowKey, 0, len(acceptable))
	for k := range acceptable {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		return keys[i].table < keys[j].table || keys[i].table == keys[j].table && keys[i].id < keys[j].id
	})
	rows := make([]map[rowKey][]float32, len(dbs))
	seqs := make([]int64, len(dbs))
	holders := map[rowKey]int{}
	for i, db := range dbs {
		st, err := store.Open(db, &store.Options{ReadOnly: true, HotBytes: -1})
		if err != nil {
			t.Fatalf("open store %s: %v", db, err)
		}
		if seqs[i], err = st.AppliedSeq(model); err != nil {
			t.Error(err)
		}
		rows[i] = map[rowKey][]float32{}
		for _, key := range keys {
			out := make([]float32, dim)
			if err := st.Lookup(model, []store.TableLookup{{Table: models.TableName(key.table), IDs: []int64{key.id}, Pooling: store.PoolNone, Out: out}}); err != nil {
				t.Fatalf("store %s: %v", db, err)
			}
			rows[i][key] = out
			if slices.ContainsFunc(acceptable[key], func(k int) bool { return slices.Equal(out, faultRow(k, dim)) }) {
				holders[key]++
			} else {
				behind++
				t.Logf("store %d (update %d): table %d row %d lacks its last acknowledged update %d", i, seqs[i], key.table, key.id, last[key])
			}
		}
		st.Close()
	}
	for _, key := range keys {
		if holders[key] == 0 {
			lost++
			t.Errorf("LOST: table %d row %d: no store holds its last acknowledged update %d", key.table, key.id, last[key])
		}
		for i := 1; i < len(dbs); i++ {
			if !slices.Equal(rows[i][key], rows[0][key]) {
				differ++
				t.Errorf("replicas differ: table %d row %d: store 0 and store %d hold different rows", key.table, key.id, i)
			}
		}
	}
	if slices.Min(seqs) != slices.Max(seqs) {
		t.Errorf("replicas hold different update numbers: %v", seqs)
	}
	t.Logf("stores: %d rows checked, update numbers %v; %d lost, %d store rows behind, %d rows differing", len(keys), seqs, lost, behind, differ)
	return lost, behind, differ
}

// codesString prints a count by code.
func codesString(m map[codes.Code]int) string {
	var parts []string
	for c, n := range m {
		parts = append(parts, fmt.Sprintf("%v %d", c, n))
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}

// TestNetPartitionSequencer: the router that numbers the updates (on host
// 0, with its update log on disk and a dense worker) and three
// embedding workers on hosts 1-3, under an update stream and Recommend
// load from the root namespace.
//
//  1. Every embedding worker's link goes down for 3 s at once: the
//     sequencer loses them all mid-stream. No update attempted while
//     they are cut off may be acknowledged; once back, every worker is
//     caught up.
//  2. A majority's links go down (hosts 1, 2): once the registry drops
//     them, the one left is the whole of the live workers and updates
//     are acknowledged by it alone. Then it is cut off and the majority
//     comes back at the same moment: it must be caught up from the
//     router's log with what only the cut-off worker holds, before it
//     serves.
//  3. All back: every acknowledged update is in every store, the stores
//     are identical, and no call outlived its deadline.
func TestNetPartitionSequencer(t *testing.T) {
	t.Parallel()
	n := newPartNet(t, 4)
	began := time.Now()
	router := n.router(0, "--update-log-dir", filepath.Join(n.dir, "router-log"))
	n.dense(0, router.addr)
	var emb []*proc
	var dbs []string
	for i := 1; i <= 3; i++ {
		dbs = append(dbs, filepath.Join(n.dir, fmt.Sprintf("db%d", i)))
		emb = append(emb, n.embedding(i, dbs[i-1], router.addr))
	}
	conn := dialRestartable(t, router.addr, n.certs)
	all := []string{}
	for _, p := range emb {
		all = append(all, p.addr)
	}
	awaitWorkers(t, conn, "start", 30*time.Second, all...)

	ups := startUpdates(t, n.cfg.Name, n.dim, 20*time.Second, conn)
	load := startLoad(t, n.cfg, 2, conn)
	waitAcked := func(k int, within time.Duration) { t.Helper(); ups.waitAcked(t, k, within) }
	waitAcked(20, 20*time.Second)

	// 1. The sequencer loses every embedding worker.
	for i := 1; i <= 3; i++ {
		n.link(i, false)
	}
	// From here, every link is down: taken before the last went down,
	// an attempt that host 3 answered while hosts 1 and 2 were being
	// cut (each ip command takes tens of ms on a loaded machine) read
	// as acknowledged during the partition.
	cut := time.Now()
	time.Sleep(3 * time.Second)
	restored := time.Now()
	for i := 1; i <= 3; i++ {
		n.link(i, true)
	}
	// An attempt begun after the cut and ended before the restore
	// reached no worker.
	ok, failed, ks := ups.window(cut, restored)
	t.Logf("all embedding workers cut off for 3 s: %d update attempts acknowledged %v, failed: %s", ok, ks, codesString(failed))
	if ok > 0 {
		t.Errorf("updates %v were acknowledged while every embedding worker was cut off from the sequencer", ks)
	}
	waitAcked(10, 30*time.Second)
	t.Logf("updates acknowledged again %v after the links came back", time.Since(restored).Round(time.Millisecond))

	// 2. A majority cut off; then the minority that took the updates
	// alone is cut off as the majority comes back.
	n.link(1, false)
	n.link(2, false)
	awaitWorkers(t, conn, "hosts 1 and 2 cut off", 10*time.Second, emb[2].addr)
	minority := ups.acked()
	waitAcked(5, 20*time.Second)
	minority = ups.acked() - minority
	swap := time.Now()
	n.link(3, false)
	n.link(1, true)
	n.link(2, true)
	awaitWorkers(t, conn, "hosts 1 and 2 back, 3 cut off", 20*time.Second, emb[0].addr, emb[1].addr)
	waitAcked(5, 30*time.Second)
	t.Logf("%d updates acknowledged by host 3 alone; with it cut off, hosts 1-2 took updates again %v after the swap", minority, time.Since(swap).Round(time.Millisecond))
	n.link(3, true)
	awaitWorkers(t, conn, "all back", 20*time.Second, all...)
	waitAcked(5, 30*time.Second)

	ups.halt()
	load.halt()
	seq := settle(t, conn, n.cfg.Name, 3, 20*time.Second)
	_, _, acked, unacked := ups.acceptable()
	rok, rfailed, hung := load.window(began, time.Now())
	lost, behind, differ := checkStores(t, n.cfg.Name, n.dim, ups, emb, dbs)
	late := ups.late()
	t.Logf("partition campaign (sequencer): updates %d acknowledged, %d not; workers settled at update %d; %d lost, %d store rows behind, %d differing; Recommend %d ok, failed %s, %d hung; updates hung %d; took %v",
		acked, unacked, seq, lost, behind, differ, rok, codesString(rfailed), len(hung), len(late), time.Since(began).Round(time.Millisecond))
	for _, h := range append(hung, late...) {
		t.Errorf("hung: %s", h)
	}
	if behind > 0 {
		t.Errorf("%d store rows lack an acknowledged update although the router persists its log and every worker is back", behind)
	}
}

// TestNetPartitionRouters: two routers (host 0 sequences, host 1 forwards
// its updates there, --sequencer), two embedding workers (hosts 2, 3)
// announcing to both, a dense worker beside each; an update stream
// alternating between the routers and Recommend load on both.
//
//  1. The sequencer's link goes down for 5 s: nothing is acknowledged
//     through either router meanwhile (the forwarding router answers
//     Unavailable; it never numbers an update itself), and the
//     forwarding router keeps serving lookups.
//  2. The forwarding router's link goes down for 3 s, then both
//     routers' at once: afterwards every acknowledged update is in both
//     stores, the stores are identical, and no call outlived its
//     deadline.
func TestNetPartitionRouters(t *testing.T) {
	t.Parallel()
	n := newPartNet(t, 4)
	began := time.Now()
	a := n.router(0, "--update-log-dir", filepath.Join(n.dir, "router-log"))
	b := n.router(1, "--sequencer", a.addr)
	routers := a.addr + "," + b.addr
	var emb []*proc
	var dbs []string
	for i := 2; i <= 3; i++ {
		dbs = append(dbs, filepath.Join(n.dir, fmt.Sprintf("db%d", i)))
		emb = append(emb, n.embedding(i, dbs[i-2], routers))
		n.dense(i, routers)
	}
	connA := dialRestartable(t, a.addr, n.certs)
	connB := dialRestartable(t, b.addr, n.certs)
	for _, c := range []*grpc.ClientConn{connA, connB} {
		awaitWorkers(t, c, "start", 30*time.Second, emb[0].addr, emb[1].addr)
	}
	ups := startUpdates(t, n.cfg.Name, n.dim, 20*time.Second, connA, connB)
	loadB := startLoad(t, n.cfg, 2, connB)
	loadA := startLoad(t, n.cfg, 1, connA)
	waitAcked := func(k int, within time.Duration) { t.Helper(); ups.waitAcked(t, k, within) }
	waitAcked(20, 30*time.Second)

	// 1. The sequencer cut off.
	n.link(0, false)
	cut := time.Now() // the link down (see TestNetPartitionSequencer)
	time.Sleep(5 * time.Second)
	restored := time.Now()
	n.link(0, true)
	ok, failed, ks := ups.window(cut, restored)
	rok, rfailed, _ := loadB.window(cut.Add(partRecDeadline), restored)
	t.Logf("sequencer cut off for 5 s: %d update attempts acknowledged %v, failed: %s; Recommend through the forwarding router: %d ok, failed %s", ok, ks, codesString(failed), rok, codesString(rfailed))
	if ok > 0 {
		t.Errorf("updates %v were acknowledged while the sequencer was cut off", ks)
	}
	if rok == 0 {
		t.Errorf("the forwarding router served nothing while the sequencer was cut off")
	}
	waitAcked(10, 30*time.Second)
	t.Logf("updates acknowledged again %v after the sequencer's link came back", time.Since(restored).Round(time.Millisecond))

	// 2. The forwarding router cut off; then both.
	n.link(1, false)
	waitAcked(5, 20*time.Second)
	time.Sleep(time.Second)
	n.link(1, true)
	waitAcked(5, 30*time.Second)
	n.link(0, false)
	n.link(1, false)
	time.Sleep(3 * time.Second)
	n.link(0, true)
	n.link(1, true)
	for _, c := range []*grpc.ClientConn{connA, connB} {
		awaitWorkers(t, c, "all back", 20*time.Second, emb[0].addr, emb[1].addr)
	}
	waitAcked(10, 30*time.Second)

	ups.halt()
	loadA.halt()
	loadB.halt()
	seq := settle(t, connA, n.cfg.Name, 2, 20*time.Second)
	_, _, acked, unacked := ups.acceptable()
	var hung []string
	for _, l := range []*recLoad{loadA, loadB} {
		_, _, h := l.window(began, time.Now())
		hung = append(hung, h...)
	}
	okA, failedA, _ := loadA.window(began, time.Now())
	okB, failedB, _ := loadB.window(began, time.Now())
	lost, behind, differ := checkStores(t, n.cfg.Name, n.dim, ups, emb, dbs)
	late := ups.late()
	t.Logf("partition campaign (routers): updates %d acknowledged, %d not; workers settled at update %d; %d lost, %d store rows behind, %d differing; Recommend via sequencer %d ok, failed %s; via follower %d ok, failed %s; %d hung; updates hung %d; took %v",
		acked, unacked, seq, lost, behind, differ, okA, codesString(failedA), okB, codesString(failedB), len(hung), len(late), time.Since(began).Round(time.Millisecond))
	for _, h := range append(hung, late...) {
		t.Errorf("hung: %s", h)
	}
	if behind > 0 {
		t.Errorf("%d store rows lack an acknowledged update although every worker is back", behind)
	}
}

// TestNetPartitionDense: a router (host 0), an embedding worker (host 1)
// and two dense workers (hosts 2, 3), under Recommend load with a
// deadline and without one (the router's --default-timeout bounds it).
// A dense worker's link goes down with calls in flight: every call ends
// by its deadline, those begun once the registry dropped it succeed on
// the other, and it rejoins when its link is back and serves alone
// while the other is cut off. The calls in flight to it when its link
// went down are retried on the other once it expires: every call is
// answered (they waited out their deadlines: 4 of those with one, 2
// without).
func TestNetPartitionDense(t *testing.T) {
	t.Parallel()
	n := newPartNet(t, 4)
	began := time.Now()
	const defaultTimeout = 3 * time.Second
	router := n.router(0, "--default-timeout", defaultTimeout.String())
	emb := n.embedding(1, filepath.Join(n.dir, "db"), router.addr)
	n.dense(2, router.addr)
	n.dense(3, router.addr)
	conn := dialRestartable(t, router.addr, n.certs)
	awaitWorkers(t, conn, "start", 30*time.Second, emb.addr)
	denseOn := func() []string {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		ws, err := prismv1.NewRegistryClient(conn).List(ctx, &prismv1.ListRequest{})
		if err != nil {
			return []string{err.Error()}
		}
		var out []string
		for _, w := range ws.GetWorkers() {
			if w.GetRole() == prismv1.Role_ROLE_DENSE {
				host, _, _ := net.SplitHostPort(w.GetAddr())
				out = append(out, host)
			}
		}
		sort.Strings(out)
		return out
	}
	waitDense := func(what string, within time.Duration, hosts ...int) time.Time {
		t.Helper()
		var want []string
		for _, i := range hosts {
			want = append(want, n.host(i).Addr)
		}
		sort.Strings(want)
		var got []string
		for deadline := time.Now().Add(within); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
			if got = denseOn(); slices.Equal(got, want) {
				return time.Now()
			}
		}
		t.Fatalf("%s: the registry lists dense workers on %v, want %v", what, got, want)
		return time.Time{}
	}
	waitDense("start", 30*time.Second, 2, 3)

	load := startLoad(t, n.cfg, 3, conn)
	// One client sets no deadline: the router's default timeout bounds
	// its calls.
	src, _ := models.NewSynthetic(n.cfg.Signature(), models.SyntheticOptions{Seed: 3})
	batch, _ := src.Next(48)
	req := toRequest(n.cfg.Name, batch, nil)
	var nmu sync.Mutex
	var noDeadline []recCall
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		rec := prismv1.NewRecommenderClient(conn)
		for {
			select {
			case <-stop:
				return
			default:
			}
			start := time.Now()
			// No deadline goes to the router; a watchdog far past its
			// timeout cancels a call that hung.
			ctx, cancel := context.WithCancel(context.Background())
			watchdog := time.AfterFunc(30*time.Second, cancel)
			_, err := rec.Recommend(ctx, req)
			watchdog.Stop()
			cancel()
			nmu.Lock()
			noDeadline = append(noDeadline, recCall{start, time.Now(), err})
			nmu.Unlock()
			if err != nil {
				time.Sleep(10 * time.Millisecond)
			}
		}
	}()
	t.Cleanup(func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		wg.Wait()
	})
	time.Sleep(time.Second)

	for _, c := range []struct{ cut, other int }{{3, 2}, {2, 3}} {
		cut := time.Now()
		n.link(c.cut, false)
		dropped := waitDense(fmt.Sprintf("host %d cut off", c.cut), 10*time.Second, c.other)
		settled := dropped.Add(partRecDeadline + 200*time.Millisecond)
		time.Sleep(time.Until(settled) + 1500*time.Millisecond)
		ok, failed, _ := load.window(settled, time.Now())
		t.Logf("dense worker on host %d cut off: dropped after %v; calls begun since: %d ok, failed %s", c.cut, dropped.Sub(cut).Round(time.Millisecond), ok, codesString(failed))
		if ok == 0 || len(failed) > 0 {
			t.Errorf("with host %d cut off and dropped: %d calls ok, failed %s; want all ok", c.cut, ok, codesString(failed))
		}
		up := time.Now()
		n.link(c.cut, true)
		back := waitDense(fmt.Sprintf("host %d back", c.cut), 20*time.Second, 2, 3)
		t.Logf("host %d rejoined %v after its link came back", c.cut, back.Sub(up).Round(time.Millisecond))
		time.Sleep(partRecDeadline + 500*time.Millisecond)
	}
	close(stop)
	wg.Wait()
	load.halt()

	ok, failed, hung := load.window(began, time.Now())
	nok, nfailed := 0, map[codes.Code]int{}
	for _, c := range noDeadline {
		if took := c.end.Sub(c.start); took > defaultTimeout+time.Second {
			hung = append(hung, fmt.Sprintf("a call without a deadline took %v (%v)", took.Round(time.Millisecond), c.err))
		}
		if c.err == nil {
			nok++
		} else {
			nfailed[status.Code(c.err)]++
		}
	}
	t.Logf("partition campaign (dense): Recommend with a deadline %d ok, failed %s; without one %d ok, failed %s; %d hung; took %v",
		ok, codesString(failed), nok, codesString(nfailed), len(hung), time.Since(began).Round(time.Millisecond))
	if len(failed) > 0 || len(nfailed) > 0 {
		t.Errorf("calls failed (%s with a deadline, %s without one): want every one answered, those in flight at a cut retried on the other dense worker", codesString(failed), codesString(nfailed))
	}
	for _, h := range hung {
		t.Errorf("hung: %s", h)
	}
}

// TestNetPartitionFlap: a router and a dense worker (host 0), two
// embedding workers (hosts 1, 2); host 2's link flaps (down 1 s, up 1 s)
// for 14 s under an update stream and Recommend load. Afterwards both
// stores hold every acknowledged update and are identical.
func TestNetPartitionFlap(t *testing.T) {
	t.Parallel()
	n := newPartNet(t, 3)
	began := time.Now()
	router := n.router(0, "--update-log-dir", filepath.Join(n.dir, "router-log"))
	n.dense(0, router.addr)
	var emb []*proc
	var dbs []string
	for i := 1; i <= 2; i++ {
		dbs = append(dbs, filepath.Join(n.dir, fmt.Sprintf("db%d", i)))
		emb = append(emb, n.embedding(i, dbs[i-1], router.addr))
	}
	conn := dialRestartable(t, router.addr, n.certs)
	awaitWorkers(t, conn, "start", 30*time.Second, emb[0].addr, emb[1].addr)
	ups := startUpdates(t, n.cfg.Name, n.dim, 20*time.Second, conn)
	load := startLoad(t, n.cfg, 2, conn)
	for deadline := time.Now().Add(20 * time.Second); ups.acked() < 20; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d updates acknowledged before the flapping", ups.acked())
		}
	}
	flapFrom := time.Now()
	for range 7 {
		n.link(2, false)
		time.Sleep(time.Second)
		n.link(2, true)
		time.Sleep(time.Second)
	}
	flapped := time.Now()
	ok, failed, _ := ups.window(flapFrom, flapped)
	t.Logf("host 2 flapping for %v: %d update attempts acknowledged, failed %s", flapped.Sub(flapFrom).Round(time.Millisecond), ok, codesString(failed))
	awaitWorkers(t, conn, "after the flapping", 30*time.Second, emb[0].addr, emb[1].addr)
	target := ups.acked() + 10
	for deadline := time.Now().Add(30 * time.Second); ups.acked() < target; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d updates acknowledged after the flapping, want %d", ups.acked(), target)
		}
	}
	ups.halt()
	load.halt()
	seq := settle(t, conn, n.cfg.Name, 2, 30*time.Second)
	_, _, acked, unacked := ups.acceptable()
	rok, rfailed, hung := load.window(began, time.Now())
	lost, behind, differ := checkStores(t, n.cfg.Name, n.dim, ups, emb, dbs)
	late := ups.late()
	t.Logf("partition campaign (flapping): updates %d acknowledged, %d not; workers settled at update %d; %d lost, %d store rows behind, %d differing; Recommend %d ok, failed %s, %d hung; updates hung %d; took %v",
		acked, unacked, seq, lost, behind, differ, rok, codesString(rfailed), len(hung), len(late), time.Since(began).Round(time.Millisecond))
	for _, h := range append(hung, late...) {
		t.Errorf("hung: %s", h)
	}
	if behind > 0 {
		t.Errorf("%d store rows lack an acknowledged update although every worker is back", behind)
	}
}

// block cuts (or mends) the path between hosts a and b alone: a
// blackhole route to the other's address in each namespace, so each
// host still reaches every other one.
func (n *partNet) block(a, b int, on bool) {
	n.t.Helper()
	op := "add"
	if !on {
		op = "del"
	}
	for _, p := range [][2]*netns.Host{{n.host(a), n.host(b)}, {n.host(b), n.host(a)}} {
		if out, err := exec.Command("ip", "-n", p[0].Name, "route", op, "blackhole", p[1].Addr+"/32").CombinedOutput(); err != nil {
			n.t.Fatalf("ip -n %s route %s blackhole %s: %v: %s", p[0].Name, op, p[1].Addr, err, out)
		}
	}
}

// TestNetPartitionFollowerStaleView: two routers, the sequencer A (host 0)
// and B forwarding to it (host 1), three embedding workers (hosts 2-4)
// and a dense worker (host 5). The path between the routers is cut (B's
// polls of A's view fail), then the paths between A and some workers
// alone (ip route blackhole in both namespaces: every other path
// stays): A drops them and acknowledges an update held by the rest. B
// still hears every worker announce, the cut-off ones a number below
// the acknowledged one: a Recommend through B must not read the row
// the acknowledged update replaced.
//
// Found so: B took its last view's list of workers in sync for as long
// as its polls failed (a minority cut off: a third of B's answers read
// the old row, for the whole partition); and B's floor, the quorum-th
// highest claim, assumed the quorum counted among the workers B hears,
// while A counts it among those it reaches (a majority cut off: A
// acknowledged on the one left, and nearly every answer through B read
// the old row).
func TestNetPartitionFollowerStaleView(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		cut  []int // the workers cut off from the sequencer (0-2)
	}{
		{"a minority cut off from the sequencer", []int{2}},
		{"a majority cut off from the sequencer", []int{0, 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			followerStaleView(t, tc.cut)
		})
	}
}

func followerStaleView(t *testing.T, cut []int) {
	n := newPartNet(t, 6)
	a := n.router(0, "--update-log-dir", filepath.Join(n.dir, "router-log"))
	b := n.router(1, "--sequencer", a.addr)
	routers := a.addr + "," + b.addr
	var emb []*proc
	for i := 2; i <= 4; i++ {
		emb = append(emb, n.embedding(i, filepath.Join(n.dir, fmt.Sprintf("db%d", i)), routers))
	}
	n.dense(5, routers)
	connA := dialRestartable(t, a.addr, n.certs)
	connB := dialRestartable(t, b.addr, n.certs)
	for _, c := range []*grpc.ClientConn{connA, connB} {
		awaitWorkers(t, c, "start", 30*time.Second, emb[0].addr, emb[1].addr, emb[2].addr)
	}
	// Candidate 0 reads row id of the first table.
	src, _ := models.NewSynthetic(n.cfg.Signature(), models.SyntheticOptions{Seed: 42})
	batch, _ := src.Next(1)
	req := toRequest(n.cfg.Name, batch, nil)
	table := models.TableName(0)
	in := slices.IndexFunc(req.Candidates.Inputs, func(x *prismv1.Input) bool { return len(x.Ids) > 0 })
	id := req.Candidates.Inputs[in].Ids[0]
	update := func(v float32) {
		t.Helper()
		row := make([]float32, n.dim)
		for i := range row {
			row[i] = v
		}
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_, err := prismv1.NewEmbeddingsClient(connA).Update(ctx, &prismv1.UpdateRequest{Model: n.cfg.Name, Table: table, Ids: []int64{id}, Rows: leview.Bytes(row)})
			cancel()
			if err == nil {
				return
			}
			if status.Code(err) != codes.Unavailable || time.Now().After(deadline) {
				t.Fatalf("update to %v: %v", v, err)
			}
		}
	}
	score := func(conn *grpc.ClientConn) (float32, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		resp, err := prismv1.NewRecommenderClient(conn).Recommend(ctx, req)
		if err != nil {
			return 0, err
		}
		return resp.GetScores()[0], nil
	}
	// Every worker holds update 1 (the row at 1), through either router.
	update(1)
	holding := func(conn *grpc.ClientConn, what string, want map[string]int64) {
		t.Helper()
		var held map[string]int64
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			if held, _, _ = workersOf(conn, n.cfg.Name); maps.Equal(held, want) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: the workers hold %v, want %v", what, held, want)
			}
		}
	}
	holding(connB, "update 1", map[string]int64{emb[0].addr: 1, emb[1].addr: 1, emb[2].addr: 1})
	var old float32
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		s, err := score(connB)
		if err == nil {
			old = s
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("recommend through B: %v", err)
		}
	}
	time.Sleep(4 * partHeartbeat) // B polls A's view with every worker in sync

	// B cut off from A; then A from worker 3.
	n.block(0, 1, true)
	t.Cleanup(func() { n.block(0, 1, false) })
	time.Sleep(4 * partHeartbeat)
	var left []string
	held := map[string]int64{}
	for i, w := range emb {
		if slices.Contains(cut, i) {
			n.block(0, 2+i, true)
			t.Cleanup(func() { n.block(0, 2+i, false) })
			held[w.addr] = 1
			continue
		}
		left = append(left, w.addr)
		held[w.addr] = 2
	}
	awaitWorkers(t, connA, "A drops the workers cut off", 10*time.Second, left...)
	update(3) // acknowledged by the workers A still reaches
	// B hears every worker announce: those A reaches hold update 2, the
	// others update 1.
	holding(connB, "update 2 through B", held)
	// Past the heartbeat in which a follower may still read the row an
	// update replaced (README): B's polls have failed for seconds.
	time.Sleep(5 * partHeartbeat)
	var mu sync.Mutex
	stale, fresh, failed := 0, 0, map[codes.Code]int{}
	var wg sync.WaitGroup
	for range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 20 {
				s, err := score(connB)
				mu.Lock()
				switch {
				case err != nil:
					failed[status.Code(err)]++
				case s == old:
					stale++
				default:
					fresh++
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	t.Logf("through B, cut off from A, after an update A acknowledged: %d Recommends read the new row, %d the row it replaced, failed %s", fresh, stale, codesString(failed))
	if stale > 0 {
		t.Errorf("%d Recommends through the forwarding router read a row an acknowledged update had replaced", stale)
	}
	if fresh == 0 {
		t.Errorf("no Recommend through B was answered with the new row")
	}
}

// TestNetPartitionSilentSequencer: two routers, the sequencer A (host 0)
// and B forwarding to it (host 1), an embedding and a dense worker
// (host 2) announcing to both, and an update stream through B. The
// path between the routers alone is cut (a blackhole route: packets
// dropped, no reset) for 8 s: every update attempted through B
// meanwhile is answered Unavailable (retry), as README promises for a
// sequencer that cannot be reached, and within its deadline; none is
// acknowledged; once the path is back, updates through B are
// acknowledged again. Found so: each forward waited out its deadline
// and ended DeadlineExceeded (the connection to the sequencer noticed
// nothing), which a client retrying on Unavailable does not retry.
func TestNetPartitionSilentSequencer(t *testing.T) {
	t.Parallel()
	n := newPartNet(t, 3)
	a := n.router(0)
	b := n.router(1, "--sequencer", a.addr)
	routers := a.addr + "," + b.addr
	emb := n.embedding(2, filepath.Join(n.dir, "db"), routers)
	n.dense(2, routers)
	connB := dialRestartable(t, b.addr, n.certs)
	awaitWorkers(t, connB, "start", 30*time.Second, emb.addr)
	ups := startUpdates(t, n.cfg.Name, n.dim, time.Minute, connB)
	waitAcked := func(k int, within time.Duration) { t.Helper(); ups.waitAcked(t, k, within) }
	waitAcked(5, 30*time.Second)

	n.block(0, 1, true)
	cut := time.Now() // once both routes are in
	blocked := true
	t.Cleanup(func() {
		if blocked {
			n.block(0, 1, false)
		}
	})
	time.Sleep(8 * time.Second)
	healed := time.Now()
	n.block(0, 1, false)
	blocked = false
	ok, failed, ks := ups.window(cut, healed)
	waitAcked(5, 30*time.Second)
	back := time.Since(healed)
	ups.halt()
	var slow []string
	ups.mu.Lock()
	defer ups.mu.Unlock()
	for _, u := range ups.updates {
		for _, at := range u.attempts {
			if !at.start.Before(cut) && !at.end.After(healed) && at.err != nil && at.end.Sub(at.start) > partUpdAttempt*3/4 {
				slow = append(slow, fmt.Sprintf("update %d: %v after %v", u.k, status.Code(at.err), at.end.Sub(at.start).Round(time.Millisecond)))
			}
		}
	}
	t.Logf("the routers' path cut for 8 s: update attempts through the forwarding router %d acknowledged %v, failed: %s; %d answered after over 3/4 of their deadline; acknowledged again %v after the path came back",
		ok, ks, codesString(failed), len(slow), back.Round(time.Millisecond))
	if ok > 0 {
		t.Errorf("updates %v were acknowledged while the forwarding router was cut off from the sequencer", ks)
	}
	if failed[codes.Unavailable] == 0 || len(failed) > 1 {
		t.Errorf("updates through the forwarding router cut off from the sequencer failed %s; want Unavailable (retry) only", codesString(failed))
	}
	for _, s := range slow {
		t.Errorf("held near its deadline: %s", s)
	}
}
