package main

import (
	"fmt"
	"os"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/spf13/cobra"

	"github.com/prism-serve/prism/cpuserve/store"
	"github.com/prism-serve/prism/internal/pebblecheck"
	"github.com/prism-serve/prism/internal/progress"
)

func newStoreCheckCmd() *cobra.Command {
	var db string
	cmd := &cobra.Command{
		Use:   "check --db DIR",
		Short: "Read every block of a store and check it against its checksum",
		Long: `check reads every block of every table file of the store in DIR (and of a
complete copy staged in it, which its next open swaps in) and checks each
against its checksum, as well as the MANIFEST that lists them. A serving
worker finds a damaged block only when a lookup reaches it; check finds them
all, with the worker running or not (a file a running worker's compaction
removes meanwhile is passed over). It names each damaged file and the tables
whose rows it holds, and ends with status 1 when it found any: replace the
store with a copy of a serving worker's (prism store copy; a worker serving
with --mend does) or ingest the plan into a new --db.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fs := vfs.Default
			if st, err := os.Stat(db); err != nil {
				return fmt.Errorf("--db %s: %w", db, err)
			} else if !st.IsDir() {
				return fmt.Errorf("--db %s: not a folder", db)
			}
			if desc, err := pebble.Peek(db, fs); err != nil {
				return fmt.Errorf("--db %s: %w", db, err)
			} else if !desc.Exists {
				if err := pebblecheck.Check(fs, db); err != nil {
					return fmt.Errorf("--db %s: %w", db, err)
				}
				return fmt.Errorf("--db %s holds no store (prism ingest makes one)", db)
			}
			if err := pebblecheck.Check(fs, db); err != nil {
				return fmt.Errorf("--db %s: %w", db, err)
			}
			dirs := []string{db}
			staged := fs.PathJoin(db, store.StagedDirName)
			if _, err := fs.Stat(fs.PathJoin(staged, store.StagedCompleteName)); err == nil {
				dirs = append(dirs, staged)
			}
			var damaged []*pebblecheck.DamagedError
			for _, dir := range dirs {
				label := "check blocks"
				if dir == staged {
					label = "check the staged copy's blocks"
				}
				var bar *progress.Bar
				d, err := pebblecheck.Tables(cmd.Context(), fs, dir, func(done, total int64) {
					if bar == nil {
						bar = progress.New(cmd.ErrOrStderr(), label, total, true)
					}
					bar.Set(done)
				})
				if bar != nil {
					bar.Done()
				}
				if err != nil {
					return fmt.Errorf("check %s: %w", dir, err)
				}
				damaged = append(damaged, d...)
			}
			out := cmd.OutOrStdout()
			if len(damaged) == 0 {
				fmt.Fprintf(out, "%s: every block of its table files checks\n", db)
				return nil
			}
			// The tables each damaged file holds rows of, when the store
			// opens (not while its worker holds it).
			var names func(string) string
			if s, err := store.Open(db, &store.Options{HotBytes: -1, MustExist: true, ReadOnly: true, Logger: discardLogger{}}); err == nil {
				defer s.Close()
				names = func(path string) string { return s.FileTables(fs.PathBase(path)) }
			} else {
				fmt.Fprintf(out, "(the tables each file holds rows of are not named: the store did not open: %v)\n", err)
			}
			for _, d := range damaged {
				fmt.Fprintf(out, "DAMAGED %s: %v", d.Path, d.Err)
				if names != nil && fs.PathDir(d.Path) == db {
					if t := names(d.Path); t != "" {
						fmt.Fprintf(out, " (rows of %s)", t)
					}
				}
				fmt.Fprintln(out)
			}
			return fmt.Errorf("%d damaged table file(s) in %s: lookups of their rows fail; replace the store with a copy of a serving worker's (prism store copy; a worker serving with --mend does) or ingest the plan into a new --db", len(damaged), db)
		},
	}
	cmd.Flags().StringVar(&db, "db", "", "store directory")
	_ = cmd.MarkFlagRequired("db")
	return cmd
}

// discardLogger drops Pebble's log (check reports what it found itself).
type discardLogger struct{}

func (discardLogger) Infof(string, ...any)  {}
func (discardLogger) Errorf(string, ...any) {}
func (discardLogger) Fatalf(format string, args ...any) {
	pebble.DefaultLogger.Fatalf(format, args...)
}
