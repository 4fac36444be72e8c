package main

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/internal/auth/authflag"
)

// TestMenderTry: one attempt of a worker mending itself (--mend), on
// fakes for the routers' List and the copy. It copies only from a worker
// serving every model it serves (a sharded model's same shard) in sync,
// tries the next on one busy sending a copy, and ends the process
// (restart) once a copy is staged; it copies nothing within --mend-every
// of the last copy swapped in, nor while no router answers or names a
// source, and waits longer after each failed attempt, up to mendRetry.
func TestMenderTry(t *testing.T) {
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	emb := func(id string, models []string, shard int32, seq int64) *prismv1.WorkerInfo {
		w := &prismv1.WorkerInfo{Id: id, Role: prismv1.Role_ROLE_EMBEDDING, Addr: "addr-" + id, Models: models, Healthy: true, UpdateSeq: map[string]int64{}}
		for _, m := range models {
			w.UpdateSeq[m] = seq
			if shard >= 0 && m == "s" {
				w.Shards = map[string]*prismv1.ShardRef{m: {Shard: shard, Shards: 2}}
			}
		}
		return w
	}
	// The fleet: the worker mending (self) serves m and shard 1 of 2 of
	// s; a serves m alone; b m and shard 0 of s; c and d both, shard 1.
	fleet := &prismv1.ListResponse{
		Workers: []*prismv1.WorkerInfo{
			emb("self", []string{"m", "s"}, 1, 0),
			emb("a", []string{"m"}, -1, 5),
			emb("b", []string{"m", "s"}, 0, 5),
			emb("c", []string{"m", "s"}, 1, 5),
			emb("d", []string{"m", "s"}, 1, 5),
		},
		Updates: map[string]*prismv1.ModelUpdates{
			"m":        {Acknowledged: 5, Numbered: 5, InSync: []string{"a", "b", "c", "d"}, Stranded: []string{"self"}},
			"s#shard0": {Acknowledged: 5, Numbered: 5, InSync: []string{"b"}},
			"s#shard1": {Acknowledged: 5, Numbered: 5, InSync: []string{"c", "d"}, Stranded: []string{"self"}},
		},
	}
	for _, tc := range []struct {
		name     string
		replaced []string // replaced-<time> folders in the store folder
		list     func(addr string) (*prismv1.ListResponse, error)
		copy     map[string]error // per source; absent: staged
		tried    []string         // the sources copied from, in order (any order of c, d: sorted)
		restart  string           // the source of the copy that ended the process, "" none
		wait     time.Duration
	}{
		{name: "copied", list: func(string) (*prismv1.ListResponse, error) { return fleet, nil }, tried: []string{"addr-c"}, restart: "addr-c"},
		{name: "the first busy", list: func(string) (*prismv1.ListResponse, error) { return fleet, nil },
			copy:  map[string]error{"addr-c": status.Error(codes.ResourceExhausted, "busy"), "addr-d": status.Error(codes.ResourceExhausted, "busy")},
			tried: []string{"addr-c", "addr-d"}, wait: mendFirstRetry},
		{name: "a copy failing", list: func(string) (*prismv1.ListResponse, error) { return fleet, nil },
			copy:  map[string]error{"addr-c": errors.New("disk full"), "addr-d": errors.New("disk full")},
			tried: []string{"addr-c"}, wait: mendFirstRetry},
		{name: "copied an hour after the last copy", replaced: []string{"replaced-20261201T105959Z", "replaced-20261130T120000Z"},
			list: func(string) (*prismv1.ListResponse, error) { return fleet, nil }, tried: []string{"addr-c"}, restart: "addr-c"},
		{name: "within --mend-every of the last copy", replaced: []string{"replaced-20261201T113000Z-2", "replaced-20261130T120000Z"},
			list: func(string) (*prismv1.ListResponse, error) { return fleet, nil }, wait: 30*time.Minute + time.Second},
		{name: "no router answering", list: func(addr string) (*prismv1.ListResponse, error) {
			return nil, status.Errorf(codes.Unavailable, "router %s down", addr)
		}, wait: mendFirstRetry},
		{name: "the second router answering", list: func(addr string) (*prismv1.ListResponse, error) {
			if addr == "r1" {
				return nil, status.Error(codes.Unavailable, "down")
			}
			return fleet, nil
		}, tried: []string{"addr-c"}, restart: "addr-c"},
		{name: "no worker in sync holding the same shard", list: func(string) (*prismv1.ListResponse, error) {
			f := &prismv1.ListResponse{Workers: fleet.Workers[:3], Updates: fleet.Updates}
			return f, nil
		}, wait: mendFirstRetry},
	} {
		t.Run(tc.name, func(t *testing.T) {
			db := t.TempDir()
			for _, n := range tc.replaced { // each holding a store replaced
				if err := os.Mkdir(filepath.Join(db, n), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(db, n, "MANIFEST-000001"), nil, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			var logs strings.Builder
			m := newMender(db, []string{"r1", "r2"}, authflag.Flags{}, 1<<20, time.Hour, slog.New(slog.NewTextHandler(&logs, nil)))
			m.now = func() time.Time { return now }
			m.info = func() *prismv1.WorkerInfo { return fleet.Workers[0] }
			m.list = func(_ context.Context, addr string) (*prismv1.ListResponse, error) { return tc.list(addr) }
			var tried []string
			m.copyFrom = func(_ context.Context, from string) (bool, error) {
				tried = append(tried, from)
				if err := tc.copy[from]; err != nil {
					return false, err
				}
				return true, nil
			}
			var restarted error
			m.restart = func(err error) { restarted = err }
			out := map[string]string{"m": "stranded", "s": "diverged at update 3"}
			staged, wait := m.try(context.Background(), out, func(l slog.Level, msg string, args ...any) { m.log.Log(context.Background(), l, msg, args...) })
			// c and d are both sources: spread picks the first by host.
			slices.Sort(tried)
			if !slices.Equal(tried, tc.tried) && !(len(tc.tried) == 1 && len(tried) == 1 && (tried[0] == "addr-c" || tried[0] == "addr-d")) {
				t.Errorf("copied from %v, want %v", tried, tc.tried)
			}
			var mended *errMended
			switch {
			case tc.restart != "" && (!staged || !errors.As(restarted, &mended) || (mended.from != "addr-c" && mended.from != "addr-d")):
				t.Errorf("staged %v, restart %v; want the process ended after a copy from c or d", staged, restarted)
			case tc.restart == "" && (staged || restarted != nil):
				t.Errorf("staged %v, restart %v; want neither", staged, restarted)
			}
			if wait != tc.wait {
				t.Errorf("wait %v, want %v\n%s", wait, tc.wait, logs.String())
			}
			if staged && mended != nil && !strings.Contains(mended.Error(), filepath.Join(db, "copy-in")) {
				t.Errorf("the exit says %q, not where the copy is staged", mended.Error())
			}
		})
	}
	// Failed attempts wait longer each time, up to mendRetry.
	m := &mender{}
	var waits []time.Duration
	for range 6 {
		waits = append(waits, m.again())
	}
	if want := []time.Duration{2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, 30 * time.Second, 30 * time.Second}; !slices.Equal(waits, want) {
		t.Errorf("waits after failed attempts %v, want %v", waits, want)
	}
}
