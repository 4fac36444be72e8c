package storebench

import (
	"fmt"
	"io"
	"path/filepath"

	"github.com/prism-serve/prism/cpuserve/store"
)

// runPreload measures fresh Zipf batches (ids drawn with a new seed, so
// the tail misses a tier filled by admission) on the same data in two
// configurations: the hot tier of --hot-bytes filled by its misses
// (admission, as a store without preload serves), and a tier sized to
// hold every row and preloaded at Open. The raw gather runs beside each.
func runPreload(w io.Writer, e *Env) error {
	db := filepath.Join(e.Cfg.Dir, "db")
	reopen := func(o store.Options) error {
		if err := e.Store.Close(); err != nil {
			return err
		}
		o.CacheBytes, o.NoSync = e.Cfg.CacheBytes, true
		s, err := store.Open(db, &o)
		if err != nil {
			return err
		}
		e.Store = s
		return nil
	}
	warm, err := e.Batches(e.Cfg.warmup(), e.Cfg.Zipf, 21)
	if err != nil {
		return err
	}
	fresh, err := e.Batches(e.Cfg.Batches, e.Cfg.Zipf, 22)
	if err != nil {
		return err
	}

	if err := reopen(store.Options{HotBytes: e.Cfg.HotBytes, Preload: store.PreloadOff}); err != nil {
		return err
	}
	if _, err := e.StoreLookup("warmup", warm); err != nil {
		return err
	}
	if err := compare(w, e, "no preload, admission-filled tier, fresh ids", fresh); err != nil {
		return err
	}

	// HotBytes 0 + a large auto max: the tier is sized to the tables.
	if err := reopen(store.Options{HotBytesAutoMax: 1 << 50, Preload: store.PreloadAuto}); err != nil {
		return err
	}
	pr := e.Store.Preloaded()
	if !pr.Complete {
		return fmt.Errorf("preload: the tier does not hold every row (%+v)", pr)
	}
	fmt.Fprintf(w, "preload at open: %d tables, %d rows, %.0f MiB in %.2fs (%.1f M rows/s)\n",
		pr.Tables, pr.Rows, float64(pr.Bytes)/(1<<20), pr.Elapsed.Seconds(), float64(pr.Rows)/pr.Elapsed.Seconds()/1e6)
	return compare(w, e, "preloaded tier (every row), fresh ids", fresh)
}
