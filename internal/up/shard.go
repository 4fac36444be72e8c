package up

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/prism-serve/prism/cpuserve/store"
	"github.com/prism-serve/prism/plan"
)

// A plan with a sharding section (prism shard) is served by
// shards x Config.Replicas embedding workers: replica r of shard k has
// a store of its own (Pebble locks its folder), ShardDB(DB, k, r), into
// which up ingests shard k of every sharded plan (prism ingest --shard
// K as a child process) unless the store already holds it. DB is then
// the parent folder of the shards' stores, not a store itself. A plan
// without sharding served beside a sharded one is ingested whole by
// each of these workers at its start, as up's workers always do.

// openStore opens an embedding store to check what it holds: a
// variable for the tests.
var openStore = store.Open

// sharded is a sharded plan up serves.
type sharded struct {
	dir, model string
	shards     int
	plan       *plan.Plan
}

// shardedPlans are the sharded plans among plans (read from dirs), and
// their common shard count (0: none is sharded). Sharded plans with
// different shard counts cannot share embedding workers: an error.
func shardedPlans(dirs []string, plans []*plan.Plan) (out []sharded, shards int, err error) {
	for i, p := range plans {
		if p.Sharding == nil || p.Sharding.Shards < 1 {
			continue
		}
		name := p.ServedName(dirs[i])
		if shards != 0 && p.Sharding.Shards != shards {
			return nil, 0, fmt.Errorf("model %q is sharded into %d shards, %q into %d: one prism up runs one sharding (serve them with two)", out[0].model, shards, name, p.Sharding.Shards)
		}
		shards = p.Sharding.Shards
		out = append(out, sharded{dir: dirs[i], model: name, shards: shards, plan: p})
	}
	return out, shards, nil
}

// checkNames refuses two plans of one model name: the second would be
// ingested as another version of the first in the same stores (a
// sharded one's shards replaced by the whole model), and then both
// tiers' workers refuse to start.
func checkNames(dirs []string, plans []*plan.Plan) error {
	seen := map[string]string{}
	for i, p := range plans {
		name := p.ServedName(dirs[i])
		if d, ok := seen[name]; ok {
			return fmt.Errorf("--model %s and --model %s are both model %q: one prism up serves a model once (prism partition names it after the ONNX graph, or its metadata prism.model)", d, dirs[i], name)
		}
		seen[name] = dirs[i]
	}
	return nil
}

// ShardDB is the store folder of replica r of shard k under the parent
// folder db: db/shard-K for the first replica, db/shard-K-R for the
// others.
func ShardDB(db string, k, r int) string {
	if r == 0 {
		return filepath.Join(db, fmt.Sprintf("shard-%d", k))
	}
	return filepath.Join(db, fmt.Sprintf("shard-%d-%d", k, r))
}

// embeddingDB is the store folder of embedding worker i: with sharding
// replica i mod Replicas of shard i / Replicas, else DB for the first
// and DB-i for the others.
func embeddingDB(c Config, i int) string {
	if c.shards > 0 {
		r := max(c.Replicas, 1)
		return ShardDB(c.DB, i/r, i%r)
	}
	if i == 0 {
		return c.DB
	}
	return fmt.Sprintf("%s-%d", c.DB, i)
}

// checkShardParent refuses a DB that is itself a store (an unsharded
// prism up used it): the shards' stores go in folders below it.
func checkShardParent(db string) error {
	if _, err := os.Stat(db); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	if isStore(db) {
		if parent := filepath.Dir(filepath.Clean(db)); strings.HasPrefix(filepath.Base(db), "shard-") {
			return fmt.Errorf("%s is one shard's store; a sharded model's --db is the folder of its shards' stores: give --db %s", db, parent)
		}
		return fmt.Errorf("%s is an embedding store (of an unsharded model?); a sharded model needs a folder for its shards' stores (db/shard-K): give another --db", db)
	}
	return nil
}

// isStore says whether dir holds a Pebble store (its OPTIONS file, or
// the CURRENT of older formats).
func isStore(dir string) bool {
	if _, err := os.Stat(filepath.Join(dir, "CURRENT")); err == nil {
		return true
	}
	m, _ := filepath.Glob(filepath.Join(dir, "OPTIONS-*"))
	return len(m) > 0
}

// holdsShards says, for each of plans, whether the store in dir holds,
// as its active version, shard k of the plan's model as its sharding
// places it (a store ingested for another sharding of the same shard
// count is ingested again: its embedding worker would refuse it). It
// opens the store once for them all: a read-only open replays the
// store's WAL, and a platform serves tens of models.
func holdsShards(dir string, plans []sharded, k int) []bool {
	held := make([]bool, len(plans))
	if !isStore(dir) {
		return held
	}
	st, err := openStore(dir, &store.Options{HotBytes: -1, ReadOnly: true})
	if err != nil {
		return held
	}
	defer st.Close()
	for i, p := range plans {
		held[i] = st.MatchShard(p.model, p.plan, k) == nil
	}
	return held
}

// ingestShards ingests, for every replica of every shard, the shard of
// each sharded plan its store does not hold yet, one prism ingest
// --shard K child at a time (their progress and reports on Stderr).
func ingestShards(ctx context.Context, c Config, plans []sharded) error {
	if err := checkShardParent(c.DB); err != nil {
		return err
	}
	for i := range c.EmbeddingWorkers {
		r := max(c.Replicas, 1)
		k := i / r
		db := embeddingDB(c, i)
		held := holdsShards(db, plans, k)
		for j, p := range plans {
			if held[j] {
				continue
			}
			fmt.Fprintf(c.Stderr, "up: ingesting shard %d of %d of model %q into %s\n", k, p.shards, p.model, db)
			cmd := exec.CommandContext(ctx, c.Exe, append([]string{"ingest", p.dir, "--db", db, "--shard", fmt.Sprint(k)}, c.ingestFlags()...)...)
			cmd.Stdout, cmd.Stderr = c.Stderr, c.Stderr
			// As the tiers (supervise.Exec): an up killed outright
			// takes its ingest along, which would otherwise hold the
			// shard's store lock against the next up.
			cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
			if err := cmd.Run(); err != nil {
				return fmt.Errorf("ingest shard %d of model %q into %s: %w", k, p.model, db, err)
			}
		}
	}
	return nil
}

// holdsPlans says, for each unsharded plan plans[i] of model
// models[i], whether the store in dir, if it holds the model at all,
// holds as its active version the plan's tables (their shapes and
// content): a store that holds another version (the model rebuilt, or
// the store switched by prism store versions) is ingested again, since
// its worker refuses to serve the plan on it. A store without the model
// is left to its worker, which ingests the plan at its start. The store
// is opened once for all the plans (holdsShards).
func holdsPlans(dir string, models []string, plans []*plan.Plan) []bool {
	held := make([]bool, len(plans))
	for i := range held {
		held[i] = true
	}
	if !isStore(dir) {
		return held
	}
	st, err := openStore(dir, &store.Options{HotBytes: -1, ReadOnly: true})
	if err != nil {
		return held // the worker says why
	}
	defer st.Close()
	for i, p := range plans {
		// A model the store lacks: its worker ingests it whole.
		err := st.MatchPlan(models[i], p)
		held[i] = err == nil || errors.Is(err, store.ErrUnknownModel)
	}
	return held
}

// ingestFlags are the flags up passes to each prism ingest it runs.
func (c Config) ingestFlags() []string {
	if c.KeepVersions > 0 {
		return []string{"--keep-versions", fmt.Sprint(c.KeepVersions)}
	}
	return nil
}

// ingestChanged ingests each unsharded plan (dirs[i], plans[i]) into
// every embedding worker's store whose active version of the model holds
// other tables (holdsPlans), one prism ingest child at a time: a new
// version, switched to, which carries the model's updates.
func ingestChanged(ctx context.Context, c Config, dirs []string, plans []*plan.Plan) error {
	var whole []int // the unsharded plans (the others: ingestShards)
	var names []string
	var wholePlans []*plan.Plan
	for k, p := range plans {
		if p.Sharding != nil && p.Sharding.Shards >= 1 {
			continue
		}
		whole = append(whole, k)
		names = append(names, p.ServedName(dirs[k]))
		wholePlans = append(wholePlans, p)
	}
	if len(whole) == 0 {
		return nil
	}
	for i := range c.EmbeddingWorkers {
		db := embeddingDB(c, i)
		held := holdsPlans(db, names, wholePlans)
		for j, k := range whole {
			if held[j] {
				continue
			}
			model := names[j]
			fmt.Fprintf(c.Stderr, "up: the store %s holds another version of model %q than %s: ingesting it\n", db, model, dirs[k])
			cmd := exec.CommandContext(ctx, c.Exe, append([]string{"ingest", dirs[k], "--db", db}, c.ingestFlags()...)...)
			cmd.Stdout, cmd.Stderr = c.Stderr, c.Stderr
			cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
			if err := cmd.Run(); err != nil {
				return fmt.Errorf("ingest model %q into %s: %w", model, db, err)
			}
		}
	}
	return nil
}
