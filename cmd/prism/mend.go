package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/cpuserve/store"
	"github.com/prism-serve/prism/internal/auth"
	"github.com/prism-serve/prism/internal/auth/authflag"
	"github.com/prism-serve/prism/router"
)

// errMended ends an embedding worker that mended itself: a copy of a
// serving worker's store is staged in its folder, and the restart that
// follows the exit (Kubernetes, prism up, systemd) swaps it in.
type errMended struct {
	from, staged string
}

func (e *errMended) Error() string {
	return fmt.Sprintf("exiting to be restarted: a copy of embedding worker %s's store is staged in %s, and the store's next open (this worker's restart) swaps it in", e.from, e.staged)
}

// A worker out for good that finds no worker to copy from, or whose
// copy failed, tries again after mendFirstRetry, doubling up to
// mendRetry: right after a router's restart the workers in sync are
// known within a few heartbeats.
const (
	mendFirstRetry = 2 * time.Second
	mendRetry      = 30 * time.Second
)

// mender is an embedding worker mending itself (prism serve embedding
// --mend): when a model it serves is out for good (the sequencing
// router marked its copy diverged, or said it is stranded: behind by
// updates the router's log no longer holds), it asks the routers for a
// worker serving its models in sync, copies that worker's whole store
// into its own folder (staged: it holds the store open), and ends the
// process (restart) so that its restart swaps the copy in. It copies
// again only every, after the last swap in the folder, so a worker whose
// own build answers updates otherwise than its peers' (and diverges
// again after each copy) does not copy a store after each update.
type mender struct {
	db      string
	routers []string
	tls     authflag.Flags
	rate    int64
	every   time.Duration
	// out is what the worker serves (OutForGood, OutNews) and what a
	// copy must hold (Info: its models, and the shard of each).
	out     func() (map[string]string, error)
	news    <-chan struct{}
	info    func() *prismv1.WorkerInfo
	log     *slog.Logger
	restart func(error)
	now     func() time.Time
	// copyFrom copies a worker's store into db, staged for the
	// process's next open (copyJob.copyIn), and says it was; a
	// variable for the tests.
	copyFrom func(ctx context.Context, from string) (staged bool, err error)
	// list is a router's (the sequencing one's) Registry/List.
	list func(ctx context.Context, addr string) (*prismv1.ListResponse, error)
	// retry is the wait before the next attempt after a failed one.
	retry time.Duration
}

// again is the wait before the next attempt after a failed one.
func (m *mender) again() time.Duration {
	m.retry = min(max(2*m.retry, mendFirstRetry), mendRetry)
	return m.retry
}

func newMender(db string, routers []string, tls authflag.Flags, rate int64, every time.Duration, log *slog.Logger) *mender {
	m := &mender{db: db, routers: routers, tls: tls, rate: rate, every: every, log: log, now: time.Now}
	m.copyFrom = func(ctx context.Context, from string) (bool, error) {
		j := &copyJob{tlsFlags: tls, db: db, rate: rate, self: true}
		staged, err := j.copyIn(ctx, from)
		if err == nil {
			r := j.received
			var held []string
			for _, ms := range r.Models {
				held = append(held, fmt.Sprintf("%s: version %d, updates applied %d", ms.Name, ms.Version, ms.Applied))
			}
			log.Warn("mend: received a copy of a serving worker's store", "from", from, "store", r.Source, "files", r.Files, "bytes", r.Bytes, "kept_from_an_earlier_copy", r.Reused, "models", held, "staged", r.Staged)
		}
		return staged, err
	}
	m.list = func(ctx context.Context, addr string) (*prismv1.ListResponse, error) {
		resp, _, err := sequencerList(ctx, &tls, auth.Embedding, addr, true)
		return resp, err
	}
	return m
}

// run mends until ctx ends or a copy is staged (then it calls restart
// with an errMended and returns).
func (m *mender) run(ctx context.Context) {
	var said string // the last reason for waiting logged, not repeated
	say := func(level slog.Level, msg string, args ...any) {
		if key := fmt.Sprint(msg, args); key != said {
			said = key
			m.log.Log(ctx, level, msg, args...)
		}
	}
	for {
		wait := time.Duration(0) // until news
		out, err := m.out()
		if err != nil {
			say(slog.LevelError, "mend: cannot read which models are out for good", "err", err)
			wait = m.again()
		} else if len(out) > 0 {
			var staged bool
			staged, wait = m.try(ctx, out, say)
			if staged {
				return
			}
		}
		var after <-chan time.Time
		var t *time.Timer
		if wait > 0 {
			t = time.NewTimer(wait)
			after = t.C
		}
		select {
		case <-ctx.Done():
		case <-m.news:
		case <-after:
		}
		if t != nil {
			t.Stop()
		}
		if ctx.Err() != nil {
			return
		}
	}
}

// try is one attempt at mending the models out (model -> why): it
// returns whether a copy was staged (restart called), else how long to
// wait before the next.
func (m *mender) try(ctx context.Context, out map[string]string, say func(slog.Level, string, ...any)) (bool, time.Duration) {
	models := slices.Sorted(maps.Keys(out))
	var whys []string
	for _, model := range models {
		whys = append(whys, model+": "+out[model])
	}
	why := strings.Join(whys, "; ")
	last, swapped, err := store.LastSwap(vfs.Default, m.db)
	if err != nil {
		say(slog.LevelError, "mend: cannot read when a copy was last swapped into the store", "db", m.db, "err", err)
		return false, m.again()
	}
	if next := last.Add(m.every); swapped && m.now().Before(next) {
		say(slog.LevelError, "mend: out of serving again within --mend-every of the last copy swapped into the store, so not copying again until then: if the worker diverged again, its build (plan, release) answers updates otherwise than its peers'; serve the build they serve",
			"out", why, "last_copy", last.Format(time.RFC3339), "next_try", next.Format(time.RFC3339), "kept", "replaced-* in "+m.db)
		return false, next.Sub(m.now()) + time.Second
	}
	sources, err := m.sources(ctx)
	if err == nil && len(sources) == 0 {
		err = errors.New("no embedding worker serves this worker's models in sync")
	}
	if err != nil {
		say(slog.LevelWarn, "mend: no worker to copy from yet; asking the routers again", "out", why, "err", err)
		return false, m.again()
	}
	m.log.Warn("mend: replacing this worker's store with a copy of a serving worker's (it stays out of the models' lookups meanwhile)", "out", why, "sources", sources, "db", m.db)
	for _, src := range spread(sources) {
		staged, err := m.copyFrom(ctx, src)
		switch {
		case err == nil && staged:
			m.restart(&errMended{from: src, staged: m.db + "/" + store.StagedDirName})
			return true, 0
		case status.Code(err) == codes.ResourceExhausted:
			m.log.Info("mend: the worker asked is sending a copy already; trying the next", "from", src)
		case ctx.Err() != nil:
			return false, 0
		default:
			say(slog.LevelError, "mend: the copy failed; trying again later (a copy cut short goes on where it stopped)", "from", src, "err", err)
			return false, m.again()
		}
	}
	say(slog.LevelWarn, "mend: every worker to copy from is sending a copy already; trying again later", "sources", sources)
	return false, m.again()
}

// sources asks the routers, in turn, for the workers serving every model
// this worker serves (and of a sharded model the same shard) in sync
// (router.CopySources): a copy must hold them all, since it replaces the
// whole store.
func (m *mender) sources(ctx context.Context) ([]string, error) {
	w := m.info()
	need := map[string]string{}
	for _, model := range w.GetModels() {
		need[model] = ""
		if ref := w.GetShards()[model]; ref.GetShards() > 0 {
			need[model] = router.ShardLabel(int(ref.GetShard()), int(ref.GetShards()))
		}
	}
	var errs []error
	for _, addr := range m.routers {
		resp, err := m.list(ctx, addr)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		// Not itself: it is out for good in the router's view, which
		// CopySources leaves out.
		return router.CopySources(router.Fleet(resp), need, ""), nil
	}
	return nil, errors.Join(errs...)
}
