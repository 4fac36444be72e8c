package main

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"os"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/cpuserve/store"
	"github.com/prism-serve/prism/cpuserve/storecopy"
	"github.com/prism-serve/prism/internal/auth"
	"github.com/prism-serve/prism/internal/auth/authflag"
	"github.com/prism-serve/prism/internal/flagval"
	"github.com/prism-serve/prism/internal/progress"
	"github.com/prism-serve/prism/internal/serve"
	"github.com/prism-serve/prism/router"
)

// copyJob is one prism store copy: flags and where it writes.
type copyJob struct {
	tlsFlags      authflag.Flags
	from, db      string
	allowDiverged bool
	rate          int64
	routerAddr    string
	models        []string
	shard, shards int
	seed          bool
	seedWait      time.Duration
	out, errOut   io.Writer
}

func newStoreCopyCmd() *cobra.Command {
	var (
		j    copyJob
		rate string
	)
	cmd := &cobra.Command{
		Use:   "copy (--from ADDR | --router ADDR --model NAME... [--shard K --shards N]) --db DIR [--seed] [--certs DIR] [--rate BYTES/s]",
		Short: "Replace a store with a copy of a serving embedding worker's (the mend for a diverged worker, the seed of a new one)",
		Long: `copy asks the embedding worker at --from (its gRPC address, as prism status
lists it) for a consistent copy of its whole store and makes it the store in
--db: the mend for a worker whose copy of a model diverged from its peers'
(prism status: diverged) or fell further behind than the router's update log
reaches (stranded). The copy is written into a folder inside --db, each file
checked against the sender's size and CRC-32C, and opened as a store before it
counts as complete; then it is swapped in: at once when no process holds --db,
else by the store's next open, so with the worker still running (a Kubernetes
Pod, its volume mounted at --db) restart it once the copy is staged. The
store's own files are kept in a folder replaced-<time> inside --db; remove it
once the worker serves again. The worker asked must serve the same models (and
shard) and be in sync (prism status: serving); the copy carries its updates,
versions and marks. Every block of the copy's table files is read back
against its checksum before it counts (a worker's disk can damage a block its
own reads have not reached). A copy whose own store marks a model diverged,
or that lacks a model the store it replaces holds or holds another shard of
it (another number, or the plan sharded again; checked when no process holds
--db), is refused unless --allow-diverged. A copy cut short goes on where it
stopped when run again. Needs an admin or an embedding worker's certificate
(--certs DIR: inside a worker's Pod, the folder the chart mounts).

--router ADDR --model NAME (repeated; --shard K --shards N for a shard's
worker) asks that router (or the one sequencing updates, which it names) for
the workers serving those models (and shard) in sync and out of none, instead
of --from, and copies from one of them (spread by this host's name; the next
when one is sending a copy already).

--seed is a new replica's first start (the chart's embedding Pods run it
before their ingest step): it copies only into a folder holding no store (a
staged copy, or a swap cut short, is swapped in instead), and when there is
nothing to copy, because the models have had no update (a store ingested from
the plan is as good: the router numbered none, and the workers of the models it
has registered hold none), it copies nothing and says so. While it cannot tell
(the router unreachable, in its start-up window, an election under way, no
worker of the models registered yet, none serving), it asks again for
--seed-wait, then copies nothing. A store ingested
from the plan instead would lack the models' updates, which the router's log
may no longer hold: the worker would stay out, stranded.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if rate != "" {
				var err error
				if j.rate, err = flagval.Bytes(strings.TrimSuffix(rate, "/s")); err != nil || j.rate < storecopy.MinRate {
					return fmt.Errorf("--rate %q: want bytes a second, at least 1MiB/s, e.g. 200MiB/s", rate)
				}
			}
			if (j.from == "") == (j.routerAddr == "") {
				return errors.New("give one of --from ADDR (a worker) and --router ADDR (a router to ask for one)")
			}
			if j.routerAddr != "" && len(j.models) == 0 {
				return errors.New("--router: give the models the copy must hold (--model NAME, repeated)")
			}
			if (j.shard >= 0) != (j.shards > 0) || (j.shards > 0 && j.shard >= j.shards) {
				return fmt.Errorf("--shard %d --shards %d: give both, K below N, or neither", j.shard, j.shards)
			}
			if j.seed && j.routerAddr == "" {
				return errors.New("--seed goes with --router (it asks whether there is anything to copy)")
			}
			j.out, j.errOut = cmd.OutOrStdout(), cmd.ErrOrStderr()
			j.tlsFlags.WarnClient(j.errOut, "prism store copy")
			return j.run(cmd.Context())
		},
	}
	f := cmd.Flags()
	f.StringVar(&j.from, "from", "", "the gRPC address of an embedding worker serving the same models in sync (prism status lists them)")
	f.StringVar(&j.routerAddr, "router", "", "instead of --from: a router's gRPC address, to ask for a worker serving --model (and --shard) in sync")
	f.StringArrayVar(&j.models, "model", nil, "with --router: a model the copy must hold, served in sync (repeat for each)")
	f.IntVar(&j.shard, "shard", -1, "with --router: the shard (K of --shards N) of the models the copy must hold (-1: whole models)")
	f.IntVar(&j.shards, "shards", 0, "with --shard: the models' shard count")
	f.BoolVar(&j.seed, "seed", false, "a new replica's first start: copy only into a folder holding no store, and nothing when the models have had no update")
	f.DurationVar(&j.seedWait, "seed-wait", 2*time.Minute, "with --seed: how long to keep asking while the router cannot tell what to copy")
	f.StringVar(&j.db, "db", "", "the store folder to replace (made if missing)")
	f.StringVar(&rate, "rate", "", "bound the copy to this many bytes a second (e.g. 200MiB/s), so the worker copied keeps its disk for its lookups; unbounded by default")
	f.BoolVar(&j.allowDiverged, "allow-diverged", false, "take a copy whose store marks a model diverged, or that lacks a model the store it replaces holds, or holds another shard of it")
	_ = cmd.MarkFlagRequired("db")
	j.tlsFlags.Register(cmd, auth.Admin)
	return cmd
}

func (j *copyJob) run(ctx context.Context) error {
	if j.seed {
		if done, err := j.seeded(); done || err != nil {
			return err
		}
	}
	if j.from != "" {
		return j.copyFrom(ctx, j.from)
	}
	var deadline time.Time
	if j.seed {
		deadline = time.Now().Add(j.seedWait)
	}
	for {
		sources, nothing, err := j.sources(ctx, j.routerAddr, true)
		if nothing {
			return j.nothingToCopy("no update of " + j.what() + ", by the router or its workers")
		}
		if err == nil && len(sources) == 0 {
			err = fmt.Errorf("router %s: no embedding worker serves %s in sync (prism status --router %s)", j.routerAddr, j.what(), j.routerAddr)
		}
		if err == nil {
			fmt.Fprintf(j.out, "router %s names %s to copy from\n", j.routerAddr, strings.Join(sources, ", "))
			for _, src := range spread(sources) {
				err = j.copyFrom(ctx, src)
				if status.Code(err) != codes.ResourceExhausted {
					return err // done, or failed for another reason than a busy sender
				}
				fmt.Fprintf(j.errOut, "%s is sending a copy already; trying the next\n", src)
			}
		}
		if !j.seed {
			return err
		}
		if time.Now().After(deadline) {
			return j.nothingToCopy(fmt.Sprintf("after --seed-wait %v: %v", j.seedWait, err))
		}
		fmt.Fprintf(j.errOut, "nothing to copy from yet (%v); asking again\n", err)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(2 * time.Second):
		}
	}
}

// what names the models (and shard) the copy must hold.
func (j *copyJob) what() string {
	w := strings.Join(j.models, ", ")
	if j.shards > 0 {
		w += fmt.Sprintf(" (shard %d of %d)", j.shard, j.shards)
	}
	return w
}

// seeded says whether --seed has nothing to do: a store is there (a
// copy staged complete, or a swap cut short, is swapped in first).
func (j *copyJob) seeded() (bool, error) {
	_, staged := os.Stat(vfs.Default.PathJoin(j.db, store.StagedDirName, store.StagedCompleteName))
	_, journal := os.Stat(vfs.Default.PathJoin(j.db, store.SwapJournalName))
	if staged == nil || journal == nil {
		s, err := store.Open(j.db, &store.Options{HotBytes: -1})
		if err != nil {
			return true, fmt.Errorf("swap in the copy staged in %s: %w", j.db, err)
		}
		rep, ok := s.Swapped()
		if err := s.Close(); err != nil {
			return true, err
		}
		if ok {
			fmt.Fprintf(j.out, "swapped in the copy staged before (%s): nothing copied (--seed)\n", rep.Kept())
			return true, nil
		}
	}
	desc, err := pebble.Peek(j.db, vfs.Default)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return true, fmt.Errorf("--seed: read %s: %w", j.db, err)
	}
	if err == nil && desc.Exists {
		fmt.Fprintf(j.out, "%s holds a store already: nothing copied (--seed)\n", j.db)
		return true, nil
	}
	return false, nil
}

// nothingToCopy ends a --seed run that copies nothing (the ingest step
// makes the store), dropping an incomplete copy an earlier run left.
func (j *copyJob) nothingToCopy(why string) error {
	if dropped, err := storecopy.DropIncomplete(j.db, nil); err != nil {
		return err
	} else if dropped {
		fmt.Fprintf(j.out, "dropped the incomplete copy an earlier run left in %s\n", j.db)
	}
	fmt.Fprintf(j.out, "nothing to copy (%s): nothing copied (--seed)\n", why)
	return nil
}

// spread orders sources from one picked by this host's name, so new
// replicas started together ask different workers.
func spread(sources []string) []string {
	if len(sources) < 2 {
		return sources
	}
	host, _ := os.Hostname()
	h := fnv.New32a()
	h.Write([]byte(host))
	k := int(h.Sum32() % uint32(len(sources)))
	return append(sources[k:len(sources):len(sources)], sources[:k]...)
}

// sources asks the router at addr (Registry/List) for the embedding
// workers to copy from (router.CopySources). nothing: the models (of
// the shard) have had no update, so a store ingested from the plan is
// as good: the router sequences updates, is past the models' start-up
// window, numbered none of theirs, and the workers of theirs it has
// registered (one at least: a router just started knows no model until
// its workers announce, and would read as "no update") hold none. A
// router that does not sequence is asked for the one that does,
// followed once (follow). An error is "cannot tell yet".
func (j *copyJob) sources(ctx context.Context, addr string, follow bool) (sources []string, nothing bool, err error) {
	resp, addr, err := sequencerList(ctx, &j.tlsFlags, auth.Admin, addr, follow)
	if err != nil {
		return nil, false, err
	}
	need := map[string]router.ShardNeed{}
	updated := false
	for _, m := range j.models {
		key := prismv1.UpdateSeqKey(m, -1)
		need[m] = router.ShardNeed{}
		if j.shards > 0 {
			need[m] = router.ShardNeed{Shard: router.ShardLabel(j.shard, j.shards)}
			key = prismv1.UpdateSeqKey(m, int32(j.shard))
		}
		u := resp.GetUpdates()[key]
		if u.GetSettling() {
			return nil, false, fmt.Errorf("router %s is in its start-up window", addr)
		}
		updated = updated || u.GetNumbered() > 0 || u.GetAcknowledged() > 0
		registered := false
		for _, w := range resp.GetWorkers() {
			if w.GetRole() != prismv1.Role_ROLE_EMBEDDING || !slices.Contains(w.GetModels(), m) || prismv1.UpdateSeqKeyOf(w, m) != key {
				continue
			}
			if j.shards > 0 && int(w.GetShards()[m].GetShards()) != j.shards {
				continue // another sharding's worker
			}
			registered = true
			updated = updated || w.GetUpdateSeq()[m] > 0
		}
		if !registered && !updated {
			return nil, false, fmt.Errorf("router %s has no embedding worker of %s registered (just started, or none up yet)", addr, j.what())
		}
	}
	if !updated {
		return nil, true, nil
	}
	return router.CopySources(router.Fleet(resp), need, ""), false, nil
}

// sequencerList is the Registry/List answer of the router at addr, or,
// when it does not sequence embedding updates, of the one it names that
// does (followed once, with follow): only that one knows which workers
// are in sync. It returns the address of the router that answered.
func sequencerList(ctx context.Context, tlsFlags *authflag.Flags, role auth.Role, addr string, follow bool) (*prismv1.ListResponse, string, error) {
	creds, err := tlsFlags.Dial(role, auth.Router)
	if err != nil {
		return nil, addr, err
	}
	conn, err := grpc.NewClient(addr, creds, serve.ListDialOption())
	if err != nil {
		return nil, addr, fmt.Errorf("dial router %s: %w", addr, err)
	}
	defer conn.Close()
	lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	resp, err := prismv1.NewRegistryClient(conn).List(lctx, &prismv1.ListRequest{})
	if err != nil {
		return nil, addr, fmt.Errorf("router %s: %w", addr, err)
	}
	if resp.GetNotSequencing() {
		if seq := resp.GetSequencer(); follow && seq != "" && seq != addr {
			return sequencerList(ctx, tlsFlags, role, seq, false)
		}
		return nil, addr, fmt.Errorf("router %s does not sequence embedding updates and names none that does (an election under way?)", addr)
	}
	return resp, addr, nil
}

// receiveFrom receives a copy of the store of the embedding worker at
// from into store folder db (storecopy.Receive with o, its Context
// ctx), dialling it with role's certificate: an admin's (prism store
// copy), or an embedding worker's mending itself.
func receiveFrom(ctx context.Context, tlsFlags *authflag.Flags, role auth.Role, from, db string, o storecopy.Options) (storecopy.Result, error) {
	creds, err := tlsFlags.Dial(role, auth.Embedding)
	if err != nil {
		return storecopy.Result{}, err
	}
	conn, err := grpc.NewClient(from, creds)
	if err != nil {
		return storecopy.Result{}, fmt.Errorf("dial embedding worker %s: %w", from, err)
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	client := prismv1.NewEmbeddingTierClient(conn)
	o.Context = ctx
	res, err := storecopy.Receive(func(req *prismv1.SnapshotRequest) (storecopy.Stream, error) {
		return client.Snapshot(ctx, req)
	}, db, o)
	if err != nil {
		return res, fmt.Errorf("%w (copying from embedding worker %s)", err, from)
	}
	return res, nil
}

// copyFrom copies the store of the worker at from into j.db and swaps
// it in (or stages it for the process holding j.db).
func (j *copyJob) copyFrom(ctx context.Context, from string) error {
	_, err := j.copyIn(ctx, from)
	return err
}

// copyIn is copyFrom, saying whether the copy was staged for the
// process holding j.db (the worker) rather than swapped in.
func (j *copyJob) copyIn(ctx context.Context, from string) (staged bool, err error) {
	var bar, checkBar, verifyBar *progress.Bar
	res, err := receiveFrom(ctx, &j.tlsFlags, auth.Admin, from, j.db, storecopy.Options{AllowDiverged: j.allowDiverged, Rate: j.rate,
		Verify: func(done, total int64) {
			if bar != nil {
				bar.Done()
			}
			if verifyBar == nil {
				verifyBar = progress.New(j.errOut, "check the copy's blocks", total, true)
			}
			verifyBar.Set(done)
		},
		Check: func(done, total int64) {
			if checkBar == nil {
				checkBar = progress.New(j.errOut, "check what an earlier copy left", total, true)
			}
			checkBar.Set(done)
		},
		Progress: func(done, total int64) {
			if checkBar != nil {
				checkBar.Done()
			}
			if bar == nil {
				bar = progress.New(j.errOut, "copy", total, true)
			}
			bar.Set(done)
		}})
	if bar != nil {
		bar.Done()
	}
	if verifyBar != nil {
		verifyBar.Done()
	}
	if err != nil {
		return false, err
	}
	out := j.out
	fmt.Fprintf(out, "received a copy of %s's store (%s): %d files, %s", from, res.Source, res.Files, progress.Bytes(res.Bytes))
	if res.Reused > 0 {
		fmt.Fprintf(out, " (%d files, %s, kept from an earlier copy)", res.Reused, progress.Bytes(res.ReusedBytes))
	}
	fmt.Fprintln(out)
	for _, m := range res.Models {
		fmt.Fprintf(out, "  %s: version %d, updates applied %d", m.Name, m.Version, m.Applied)
		if m.Shards > 0 {
			fmt.Fprintf(out, ", %s", shardOf(m.Shard, m.Shards))
			if m.Sharding != "" {
				fmt.Fprintf(out, " of sharding %s", m.Sharding)
			}
		}
		if m.Diverged > 0 {
			fmt.Fprintf(out, ", DIVERGED at %d (the worker copied is out of serving itself: copy one prism status shows serving)", m.Diverged)
		}
		fmt.Fprintln(out)
	}
	s, err := store.Open(j.db, &store.Options{HotBytes: -1})
	if errors.Is(err, syscall.EAGAIN) {
		fmt.Fprintf(out, "staged in %s: the process holding %s (its worker) swaps it in at its next start; restart it\n", res.Staged, j.db)
		return true, nil
	} else if err != nil {
		return false, fmt.Errorf("swap the copy in: %w (unless the swap was made, the copy stays staged in %s for the store's next open)", err, res.Staged)
	}
	rep, swapped := s.Swapped()
	if err := s.Close(); err != nil {
		return false, err
	}
	if !swapped {
		return false, fmt.Errorf("the copy staged in %s was not swapped in (another process swapped or replaced it meanwhile?)", res.Staged)
	}
	fmt.Fprintf(out, "swapped in: %s is the copy now; %s\n", j.db, keptNote(rep))
	return false, nil
}

// keptNote says where a swap kept the store's files from before, and
// to remove them once the worker serves.
func keptNote(rep store.SwapReport) string {
	if rep.Replaced == "" {
		return rep.Kept()
	}
	return rep.Kept() + " (remove that folder once the worker serves)"
}
