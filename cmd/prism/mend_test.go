package main

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/cpuserve/store"
	"github.com/prism-serve/prism/cpuserve/storecopy"
	"github.com/prism-serve/prism/internal/auth/authflag"
)

// menderFleet is the routers' view in TestMenderTry: the worker mending
// (self) serves m, shard 1 of 2 of s, and t, and is stranded on m and
// diverged on s; a serves m alone; b m, t and shard 0 of s; c and d
// serve what self does, in sync. self holds update 7 of t, in sync.
func menderFleet() *prismv1.ListResponse {
	emb := func(id string, shard int32, models ...string) *prismv1.WorkerInfo {
		w := &prismv1.WorkerInfo{Id: id, Role: prismv1.Role_ROLE_EMBEDDING, Addr: "addr-" + id, Models: models, Healthy: true, UpdateSeq: map[string]int64{}}
		for _, m := range models {
			w.UpdateSeq[m] = map[string]int64{"m": 5, "s": 5, "t": 7}[m]
			if m == "s" {
				w.Shards = map[string]*prismv1.ShardRef{m: {Shard: shard, Shards: 2, Sharding: "00000000000000aa"}}
			}
		}
		return w
	}
	self := emb("self", 1, "m", "s", "t")
	self.UpdateSeq["m"], self.Diverged = 0, map[string]int64{"s": 3}
	return &prismv1.ListResponse{
		Workers: []*prismv1.WorkerInfo{self, emb("a", -1, "m"), emb("b", 0, "m", "s", "t"), emb("c", 1, "m", "s", "t"), emb("d", 1, "m", "s", "t")},
		Updates: map[string]*prismv1.ModelUpdates{
			"m":        {Acknowledged: 5, Numbered: 5, InSync: []string{"a", "b", "c", "d"}, Stranded: []string{"self"}},
			"t":        {Acknowledged: 7, Numbered: 7, InSync: []string{"self", "b", "c", "d"}},
			"s#shard0": {Acknowledged: 5, Numbered: 5, InSync: []string{"b"}},
			"s#shard1": {Acknowledged: 5, Numbered: 5, InSync: []string{"c", "d"}, LeftOut: []string{"self"}},
		},
	}
}

// TestMenderTry: one attempt of a worker mending itself (--mend), on
// fakes for the routers' List and the copy. It copies only from a worker
// serving every model it serves (a sharded model's same shard) in sync,
// not itself; it tries the next worker after one busy, failing, or whose
// copy lacks a model it serves or an update it applied of a model it is
// in sync on (that copy withdrawn), and ends the process (restart) once a
// good copy is staged, recording when. It copies nothing within
// --mend-every of its last copy, while no router answers or names a
// source, or once the router no longer says it is stranded (then it
// forgets it), and waits longer after each failed attempt, up to
// mendRetry; each attempt starts from another source.
func TestMenderTry(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	good := storecopy.Result{Files: 9, Bytes: 1 << 20, Models: []storecopy.ModelState{{Name: "m", Applied: 5}, {Name: "s", Applied: 5, Shard: 1, Shards: 2}, {Name: "t", Applied: 7}}}
	lacksT := storecopy.Result{Models: good.Models[:2]}
	behindT := storecopy.Result{Models: []storecopy.ModelState{{Name: "m", Applied: 5}, {Name: "s", Applied: 5, Shard: 1, Shards: 2}, {Name: "t", Applied: 6}}}
	otherShard := storecopy.Result{Models: []storecopy.ModelState{{Name: "m", Applied: 5}, {Name: "s", Applied: 5, Shard: 0, Shards: 2}, {Name: "t", Applied: 7}}}
	otherSharding := storecopy.Result{Models: []storecopy.ModelState{{Name: "m", Applied: 5}, {Name: "s", Applied: 5, Shard: 1, Shards: 2, Sharding: "00000000000000bb"}, {Name: "t", Applied: 7}}}
	fleet := func(string) (*prismv1.ListResponse, error) { return menderFleet(), nil }
	for _, tc := range []struct {
		name    string
		mended  time.Time // the last mend recorded (zero: none)
		out     map[string]string
		list    func(addr string) (*prismv1.ListResponse, error)
		copy    map[int]error            // per source asked, in turn; absent: the copy made
		copied  map[int]storecopy.Result // per source asked, in turn; absent: good
		tried   int                      // sources copied from
		restart bool                     // a good copy staged, the process ended
		wait    time.Duration
		forgot  []string
		said    string // in the log
		// during: the worker applies update 8 of t while it copies.
		during bool
		// state is prism_embedding_mend_state's after the attempt
		// (default: copying when restart, else waiting), outcomes
		// prism_embedding_mend_copies_total's (default: staged 1 when
		// restart).
		state    string
		outcomes map[string]float64
		// damaged: the store names a damaged file, and no model is out
		// otherwise.
		damaged string
	}{
		{name: "copied", list: fleet, tried: 1, restart: true},
		{name: "the first busy", list: fleet, copy: map[int]error{0: status.Error(codes.ResourceExhausted, "busy")}, tried: 2, restart: true,
			outcomes: map[string]float64{"busy": 1, "staged": 1}},
		{name: "the first failing", list: fleet, copy: map[int]error{0: errors.New("disk error")}, tried: 2, restart: true,
			outcomes: map[string]float64{"failed": 1, "staged": 1}},
		{name: "both busy", list: fleet, copy: map[int]error{0: status.Error(codes.ResourceExhausted, "busy"), 1: status.Error(codes.ResourceExhausted, "busy")},
			tried: 2, wait: mendFirstRetry, said: "no worker gave a usable copy", outcomes: map[string]float64{"busy": 2}},
		{name: "a copy lacking a model served", list: fleet, copied: map[int]storecopy.Result{0: lacksT}, tried: 2, restart: true, said: "must: t",
			outcomes: map[string]float64{"refused": 1, "staged": 1}},
		{name: "a copy of another shard", list: fleet, copied: map[int]storecopy.Result{0: otherShard}, tried: 2, restart: true, said: "must: s shard 1/2 (the copy holds shard 0/2)",
			outcomes: map[string]float64{"refused": 1, "staged": 1}},
		{name: "a copy of the same shard of another sharding", list: fleet, copied: map[int]storecopy.Result{0: otherSharding}, tried: 2, restart: true,
			said:     "must: s shard 1/2 of sharding 00000000000000aa (the copy holds that shard of sharding 00000000000000bb",
			outcomes: map[string]float64{"refused": 1, "staged": 1}},
		{name: "updates applied during the copy", list: fleet, during: true, tried: 1, restart: true},
		{name: "a copy behind on a model in sync", list: fleet, copied: map[int]storecopy.Result{0: behindT, 1: behindT},
			tried: 2, wait: mendFirstRetry, said: "must: t updates 7..7", outcomes: map[string]float64{"refused": 2}},
		{name: "an hour after the last copy", mended: now.Add(-time.Hour - time.Second), list: fleet, tried: 1, restart: true},
		{name: "diverged within --mend-every of the last copy", mended: now.Add(-30 * time.Minute), list: fleet, wait: 30*time.Minute + time.Second, said: "its build", state: mendHeld},
		{name: "stranded within --mend-every of the last copy", mended: now.Add(-30 * time.Minute), out: map[string]string{"m": "stranded"}, list: fleet,
			wait: 30*time.Minute + time.Second, said: "--update-log-bytes", state: mendHeld},
		{name: "no router answering", list: func(addr string) (*prismv1.ListResponse, error) {
			return nil, status.Errorf(codes.Unavailable, "router %s down", addr)
		}, wait: mendFirstRetry, said: "no router answers"},
		{name: "the second router answering", list: func(addr string) (*prismv1.ListResponse, error) {
			if addr == "r1" {
				return nil, status.Error(codes.Unavailable, "down")
			}
			return menderFleet(), nil
		}, tried: 1, restart: true},
		{name: "no worker in sync holding the same shard", list: func(string) (*prismv1.ListResponse, error) {
			f := menderFleet()
			f.Workers = f.Workers[:3]
			return f, nil
		}, wait: mendFirstRetry, said: "no worker serves"},
		{name: "a damaged store", damaged: "db/000010.sst", list: fleet, tried: 1, restart: true},
		{name: "a damaged store, copies behind on a model it serves in sync", damaged: "db/000010.sst", list: fleet, copied: map[int]storecopy.Result{0: behindT, 1: behindT},
			tried: 2, wait: mendFirstRetry, said: "must: t updates 7..7", outcomes: map[string]float64{"refused": 2}},
		{name: "damaged within --mend-every of the last copy", damaged: "db/000010.sst", mended: now.Add(-30 * time.Minute), list: fleet,
			wait: 30*time.Minute + time.Second, said: "store damaged again", state: mendHeld},
		{name: "no longer stranded", out: map[string]string{"m": "stranded"}, list: func(string) (*prismv1.ListResponse, error) {
			f := menderFleet()
			f.Updates["m"].Stranded = nil
			return f, nil
		}, forgot: []string{"m"}, said: "no longer says", state: mendIdle},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db := t.TempDir()
			if !tc.mended.IsZero() {
				if err := store.RecordMend(vfs.Default, db, tc.mended); err != nil {
					t.Fatal(err)
				}
			}
			var logs strings.Builder
			m := newMender(db, []string{"r1", "r2"}, authflag.Flags{}, 1<<20, time.Hour, slog.New(slog.NewTextHandler(&logs, nil)))
			m.now = func() time.Time { return now }
			m.metrics = newMendMetrics()
			var tried []string
			m.info = func() *prismv1.WorkerInfo {
				w := menderFleet().Workers[0]
				if tc.during && len(tried) > 0 {
					w.UpdateSeq["t"] = 8
				}
				return w
			}
			m.list = func(_ context.Context, addr string) (*prismv1.ListResponse, error) { return tc.list(addr) }
			refused := 0
			m.copyFrom = func(_ context.Context, from string, accept func(storecopy.Result) error) (storecopy.Result, error) {
				tried = append(tried, from)
				if err := tc.copy[len(tried)-1]; err != nil {
					return storecopy.Result{}, err
				}
				res, ok := tc.copied[len(tried)-1]
				if !ok {
					res = good
				}
				if err := accept(res); err != nil {
					refused++ // left incomplete, as Receive leaves it
					return res, err
				}
				res.Staged = filepath.Join(db, store.StagedDirName)
				return res, nil
			}
			var forgot []string
			m.forget = func(models ...string) { forgot = append(forgot, models...) }
			var restarted error
			m.restart = func(err error) { restarted = err }
			out := tc.out
			switch {
			case tc.damaged != "":
				out = map[string]string{}
			case out == nil:
				out = map[string]string{"m": "stranded", "s": "diverged at update 3"}
			}
			m.out = func() (map[string]string, error) { return out, nil }
			m.damaged = func() string { return tc.damaged }
			out, _ = m.outOrDamaged()
			staged, wait := m.try(context.Background(), out, func(l slog.Level, msg string, args ...any) { m.log.Log(context.Background(), l, msg, args...) })
			if len(tried) != tc.tried || slices.Contains(tried, "addr-self") || slices.ContainsFunc(tried, func(s string) bool { return s != "addr-c" && s != "addr-d" }) {
				t.Errorf("copied from %v, want %d of c and d", tried, tc.tried)
			}
			if len(tried) == 2 && tried[0] == tried[1] {
				t.Errorf("copied from %v: the same worker twice", tried)
			}
			var mended *errMended
			last, recorded, _ := store.LastMend(vfs.Default, db)
			switch {
			case tc.restart && (!staged || !errors.As(restarted, &mended) || mended.from != tried[len(tried)-1]):
				t.Errorf("staged %v, restart %v; want the process ended after the copy from %s", staged, restarted, tried[len(tried)-1])
			case tc.restart && (!recorded || !last.Equal(now)):
				t.Errorf("the mend recorded %v %v, want %v", last, recorded, now)
			case !tc.restart && (staged || restarted != nil):
				t.Errorf("staged %v, restart %v; want neither", staged, restarted)
			}
			if want := len(tc.copied); tc.restart && refused != want || !tc.restart && tc.copied != nil && refused != tc.tried {
				t.Errorf("refused %d copies", refused)
			}
			if wait != tc.wait {
				t.Errorf("wait %v, want %v\n%s", wait, tc.wait, logs.String())
			}
			if !slices.Equal(forgot, tc.forgot) {
				t.Errorf("forgot %v, want %v", forgot, tc.forgot)
			}
			if !strings.Contains(logs.String(), tc.said) {
				t.Errorf("the log does not say %q:\n%s", tc.said, logs.String())
			}
			state, outcomes := tc.state, tc.outcomes
			if state == "" && tc.restart {
				state = mendCopying
			} else if state == "" {
				state = mendWaiting
			}
			if outcomes == nil && tc.restart {
				outcomes = map[string]float64{"staged": 1}
			}
			for _, s := range mendStates {
				if got, want := value(m.metrics.state.WithLabelValues(s)), b2f(s == state); got != want {
					t.Errorf("prism_embedding_mend_state{state=%q} = %v, want %v", s, got, want)
				}
			}
			for _, o := range []string{"staged", "refused", "busy", "failed"} {
				if got := value(m.metrics.attempts.WithLabelValues(o)); got != outcomes[o] {
					t.Errorf("prism_embedding_mend_copies_total{outcome=%q} = %v, want %v", o, got, outcomes[o])
				}
			}
			if got, want := value(m.metrics.last), float64(last.Unix()); recorded && got != want {
				t.Errorf("prism_embedding_last_mend_timestamp_seconds = %v, want %v", got, want)
			}
			if got := value(m.metrics.copied); got != 0 {
				t.Errorf("prism_embedding_mend_copy_bytes = %v after the attempt, want 0", got)
			}
		})
	}
	// Failed attempts wait longer each time, up to mendRetry, and each
	// starts from another source.
	m := &mender{}
	var waits []time.Duration
	for range 6 {
		waits = append(waits, m.again())
	}
	if want := []time.Duration{2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, 30 * time.Second, 30 * time.Second}; !slices.Equal(waits, want) {
		t.Errorf("waits after failed attempts %v, want %v", waits, want)
	}
	m = newMender(t.TempDir(), []string{"r1"}, authflag.Flags{}, 1<<20, time.Hour, slog.New(slog.DiscardHandler))
	m.info = func() *prismv1.WorkerInfo { return menderFleet().Workers[0] }
	m.list = func(context.Context, string) (*prismv1.ListResponse, error) { return menderFleet(), nil }
	var first []string
	m.copyFrom = func(_ context.Context, from string, _ func(storecopy.Result) error) (storecopy.Result, error) {
		first = append(first, from)
		return storecopy.Result{}, errors.New("disk error")
	}
	for range 2 {
		m.try(context.Background(), map[string]string{"m": "stranded"}, func(slog.Level, string, ...any) {})
	}
	if len(first) != 4 || first[0] == first[2] {
		t.Errorf("two attempts copied from %v; want each to start from another worker", first)
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// value reads a gauge's or counter's value.
func value(c prometheus.Metric) float64 {
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		panic(err)
	}
	if m.Gauge != nil {
		return m.Gauge.GetValue()
	}
	return m.Counter.GetValue()
}
