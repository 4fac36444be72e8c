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
	"github.com/prism-serve/prism/cpuserve/storecopy"
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
// --mend): when a model it serves is out for good (its store marks its
// copy diverged, or the sequencing router says it is stranded: behind by
// updates the router's log no longer holds, which the router's view is
// asked again to confirm), it asks the routers for the workers serving
// its models in sync, copies one's whole store into its own folder
// (staged: it holds the store open), checks the copy holds every model
// it serves and every update it applied of those not out, and ends the
// process (restart) so that its restart swaps the copy in. It copies
// again only every after the last copy it staged (store.RecordMend), so
// a worker whose build answers updates otherwise than its peers' (and
// diverges again after each copy) does not copy a store after each
// update.
type mender struct {
	db      string
	routers []string
	every   time.Duration
	// out is why each model is out for good (server.OutForGood), news
	// hears of a model newly out, forget drops a model the router no
	// longer says is stranded, and info is the worker's registry entry
	// under its current id.
	out  func() (map[string]string, error)
	news <-chan struct{}
	// damaged is the first file of the store a read found damaged ("":
	// none; store.Damaged), and damageNews hears of one: the worker
	// copies a serving worker's store then too, its models still in
	// sync (nil in tests that do not damage).
	damaged    func() string
	damageNews <-chan struct{}
	forget     func(models ...string)
	info       func() *prismv1.WorkerInfo
	log        *slog.Logger
	// restart ends the process with an errMended.
	restart func(error)
	now     func() time.Time
	// copyFrom copies a worker's store into db, staged for the
	// process's next open (receiveFrom) if accept takes it (else left
	// incomplete); list is a router's (the sequencing one's)
	// Registry/List; variables for the tests.
	copyFrom func(ctx context.Context, from string, accept func(storecopy.Result) error) (storecopy.Result, error)
	list     func(ctx context.Context, addr string) (*prismv1.ListResponse, error)
	// retry is the wait before the next attempt after a failed one;
	// attempts counts them, so each starts from another source.
	retry    time.Duration
	attempts int
	// metrics, nil without a registry (tests).
	metrics *mendMetrics
}

// again is the wait before the next attempt after a failed one.
func (m *mender) again() time.Duration {
	m.retry = min(max(2*m.retry, mendFirstRetry), mendRetry)
	return m.retry
}

// mendProgressEvery is how often the log says how far a copy is.
const mendProgressEvery = 10 * time.Second

func newMender(db string, routers []string, tls authflag.Flags, rate int64, every time.Duration, log *slog.Logger) *mender {
	m := &mender{db: db, routers: routers, every: every, log: log, now: time.Now}
	m.copyFrom = func(ctx context.Context, from string, accept func(storecopy.Result) error) (storecopy.Result, error) {
		// Staged, not swapped in: this worker holds db open.
		var said time.Time
		return receiveFrom(ctx, &tls, auth.Embedding, from, db, storecopy.Options{Rate: rate, Accept: accept, Progress: func(done, total int64) {
			m.metrics.progress(done, total)
			if time.Since(said) >= mendProgressEvery {
				said = time.Now()
				log.Info("mend: copying", "from", from, "bytes", done, "of", total)
			}
		}})
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
		out, err := m.outOrDamaged()
		if err != nil {
			say(slog.LevelError, "mend: cannot read which models are out for good", "err", err)
			m.metrics.set(mendWaiting)
			wait = m.again()
		} else if len(out) == 0 {
			m.metrics.set(mendIdle)
		} else {
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
		case <-m.damageNews:
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

// damagedWhy prefixes why a model is to be copied when the worker's
// store is damaged: it still serves the model, in sync.
const damagedWhy = "store damaged: "

// outOrDamaged is out (model -> why), and when the store is damaged
// every other model the worker serves as damaged (damagedWhy).
func (m *mender) outOrDamaged() (map[string]string, error) {
	out, err := m.out()
	if err != nil || m.damaged == nil {
		return out, err
	}
	if file := m.damaged(); file != "" {
		for _, model := range m.info().GetModels() {
			if _, ok := out[model]; !ok {
				out[model] = damagedWhy + file
			}
		}
	}
	return out, nil
}

// inSync says whether a model out for why is still served in sync (its
// updates taken): none out, or the store damaged.
func inSync(why string) bool { return why == "" || strings.HasPrefix(why, damagedWhy) }

// try is one attempt at mending the models out (model -> why): it
// returns whether a copy was staged (restart called), else how long to
// wait before the next (0: until news).
func (m *mender) try(ctx context.Context, out map[string]string, say func(slog.Level, string, ...any)) (bool, time.Duration) {
	last, mended, err := store.LastMend(vfs.Default, m.db)
	if err != nil {
		say(slog.LevelError, "mend: cannot read when this worker last mended itself", "db", m.db, "err", err)
		m.metrics.set(mendWaiting)
		return false, m.again()
	}
	m.metrics.mended(last, mended)
	if next := last.Add(m.every); mended && m.now().Before(next) {
		msg := "mend: out of serving again within --mend-every of this worker's last copy, so not copying again until then: "
		switch {
		case anyDiverged(out):
			msg += "diverged again, its build (plan, release) answers updates otherwise than its peers'; serve the build they serve"
		case anyDamaged(out):
			msg += "its store damaged again, the disk (or what writes to it) damages what is written; replace the volume, then copy a serving worker's store (prism store copy)"
		default:
			msg += "stranded again, the router's update log trims faster than a copy and a restart take; raise the router's --update-log-bytes, or keep the log with --update-log-dir"
		}
		say(slog.LevelError, msg, "out", whyOut(out), "last_copy", last.Format(time.RFC3339), "next_try", next.Format(time.RFC3339))
		m.metrics.set(mendHeld)
		return false, next.Sub(m.now()) + time.Second
	}
	w := m.info()
	resp, err := m.listAny(ctx)
	if err != nil {
		say(slog.LevelWarn, "mend: no router answers; asking again", "out", whyOut(out), "err", err)
		m.metrics.set(mendWaiting)
		return false, m.again()
	}
	// A model said stranded must be so in the sequencing router's view
	// now (its store's diverged mark is this worker's own, for good).
	var gone []string
	for model, why := range out {
		if why != "stranded" {
			continue
		}
		if u := resp.GetUpdates()[prismv1.UpdateSeqKeyOf(w, model)]; !slices.Contains(u.GetStranded(), w.GetId()) {
			gone = append(gone, model)
			delete(out, model)
		}
	}
	if len(gone) > 0 {
		m.log.Info("mend: the sequencing router no longer says this worker is stranded", "models", gone)
		m.forget(gone...)
	}
	if len(out) == 0 {
		m.metrics.set(mendIdle)
		return false, 0
	}
	need := map[string]router.ShardNeed{}
	for _, model := range w.GetModels() {
		need[model] = router.ShardNeed{}
		if ref := w.GetShards()[model]; ref.GetShards() > 0 {
			need[model] = router.ShardNeed{Shard: router.ShardLabel(int(ref.GetShard()), int(ref.GetShards())), Sharding: ref.GetSharding()}
		}
	}
	sources := router.CopySources(router.Fleet(resp), need, w.GetId())
	if len(sources) == 0 {
		say(slog.LevelWarn, "mend: no worker serves this worker's models in sync to copy from yet; asking the routers again", "out", whyOut(out))
		m.metrics.set(mendWaiting)
		return false, m.again()
	}
	// From another source each attempt: one that keeps failing (its
	// disk, a model it marks diverged) does not block the others.
	sources = spread(sources)
	k := m.attempts % len(sources)
	sources = append(sources[k:len(sources):len(sources)], sources[:k]...)
	m.attempts++
	m.log.Warn("mend: replacing this worker's store with a copy of a serving worker's (it stays out of the models' lookups meanwhile)", "out", whyOut(out), "sources", sources, "db", m.db)
	// The updates it holds before the copy (the source's checkpoint is
	// taken after): those it applies meanwhile are recent, and the
	// router's log replays them after the restart.
	before := m.info().GetUpdateSeq()
	m.metrics.set(mendCopying)
	for _, src := range sources {
		// Judged before the copy is marked complete: one refused is
		// never swapped in, whatever happens after.
		refused := false
		res, err := m.copyFrom(ctx, src, func(res storecopy.Result) error {
			if lacks := m.lacks(res, out, before); lacks != "" {
				refused = true
				return fmt.Errorf("the copy does not hold what this worker must: %s", lacks)
			}
			return nil
		})
		m.metrics.progress(0, 0)
		switch {
		case err == nil:
		case ctx.Err() != nil:
			return false, 0
		case status.Code(err) == codes.ResourceExhausted:
			m.metrics.attempt("busy")
			m.log.Info("mend: the worker asked is sending a copy already; trying the next", "from", src)
			continue
		default:
			if refused {
				m.metrics.attempt("refused")
			} else {
				m.metrics.attempt("failed")
			}
			m.log.Warn("mend: the copy failed or was not taken; trying the next worker (a copy cut short goes on where it stopped)", "from", src, "err", err, "models", heldOf(res))
			continue
		}
		m.log.Warn("mend: received a copy of a serving worker's store", "from", src, "store", res.Source, "files", res.Files, "bytes", res.Bytes, "kept_from_an_earlier_copy", res.Reused, "models", heldOf(res), "staged", res.Staged)
		m.metrics.attempt("staged")
		if err := store.RecordMend(vfs.Default, m.db, m.now()); err != nil {
			// Without the record --mend-every cannot hold back a next
			// copy; the one staged is good and is swapped in anyway.
			m.log.Error("mend: cannot record the copy's time (--mend-every will not hold back the next copy)", "err", err)
		} else {
			m.metrics.mended(m.now(), true)
		}
		m.restart(&errMended{from: src, staged: res.Staged})
		return true, 0
	}
	say(slog.LevelWarn, "mend: no worker gave a usable copy; trying again later", "out", whyOut(out), "sources", sources)
	m.metrics.set(mendWaiting)
	return false, m.again()
}

// heldOf writes what a copy holds, per model.
func heldOf(res storecopy.Result) []string {
	var held []string
	for _, ms := range res.Models {
		h := fmt.Sprintf("%s: version %d, updates applied %d", ms.Name, ms.Version, ms.Applied)
		if ms.Shards > 0 {
			h += ", " + shardOf(ms.Shard, ms.Shards)
		}
		held = append(held, h)
	}
	return held
}

// lacks says what a received copy lacks of what this worker must hold
// ("" nothing): every model it serves, of a sharded one the same shard
// (a source resharded since the router's answer), and of each not out
// for good (which it still serves, taking updates) every update it held
// before the copy (before), so no acknowledged update it alone may hold
// is lost with its store.
func (m *mender) lacks(res storecopy.Result, out map[string]string, before map[string]int64) string {
	w := m.info()
	copied := map[string]storecopy.ModelState{}
	for _, ms := range res.Models {
		copied[ms.Name] = ms
	}
	var missing []string
	for _, model := range w.GetModels() {
		ms, ok := copied[model]
		switch {
		case !ok:
			missing = append(missing, model)
		case ms.Diverged > 0:
			missing = append(missing, fmt.Sprintf("%s (the copy marks it diverged at %d)", model, ms.Diverged))
		case ms.Shard != int(w.GetShards()[model].GetShard()) || ms.Shards != int(w.GetShards()[model].GetShards()):
			missing = append(missing, fmt.Sprintf("%s %s (the copy holds %s)", model, shardOf(int(w.GetShards()[model].GetShard()), int(w.GetShards()[model].GetShards())), shardOf(ms.Shard, ms.Shards)))
		case ms.Shards > 0 && ms.Sharding != "" && w.GetShards()[model].GetSharding() != "" && ms.Sharding != w.GetShards()[model].GetSharding():
			missing = append(missing, fmt.Sprintf("%s %s of sharding %s (the copy holds that shard of sharding %s: the plan was sharded again)", model, shardOf(ms.Shard, ms.Shards), w.GetShards()[model].GetSharding(), ms.Sharding))
		case inSync(out[model]) && ms.Applied < before[model]:
			missing = append(missing, fmt.Sprintf("%s updates %d..%d", model, ms.Applied+1, before[model]))
		}
	}
	return strings.Join(missing, "; ")
}

// shardOf names shard k of n ("the whole model" when n is 0).
func shardOf(k, n int) string {
	if n == 0 {
		return "the whole model"
	}
	return "shard " + router.ShardLabel(k, n)
}

// listAny is the first answer of the routers asked in turn.
func (m *mender) listAny(ctx context.Context) (*prismv1.ListResponse, error) {
	var errs []error
	for _, addr := range m.routers {
		resp, err := m.list(ctx, addr)
		if err == nil {
			return resp, nil
		}
		errs = append(errs, err)
	}
	return nil, errors.Join(errs...)
}

// whyOut writes out (model -> why) in model order.
func whyOut(out map[string]string) string {
	var whys []string
	for _, model := range slices.Sorted(maps.Keys(out)) {
		whys = append(whys, model+": "+out[model])
	}
	return strings.Join(whys, "; ")
}

// anyDamaged says whether a model of out is out for a damaged store.
func anyDamaged(out map[string]string) bool {
	for _, why := range out {
		if strings.HasPrefix(why, damagedWhy) {
			return true
		}
	}
	return false
}

// anyDiverged says whether a model of out is out as diverged.
func anyDiverged(out map[string]string) bool {
	for _, why := range out {
		if strings.HasPrefix(why, "diverged") {
			return true
		}
	}
	return false
}
