package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/prism-serve/prism/cpuserve/store"
	"github.com/prism-serve/prism/internal/progress"
)

func init() { subcommands = append(subcommands, newIngestCmd) }

// newIngestCmd is `prism ingest PLAN_DIR --db DIR`: bulk-load a plan's
// tables into the embedding store as a new model version.
func newIngestCmd() *cobra.Command {
	var (
		db, dtype, model, hotBytes, sstBytes string
		noActivate                           bool
	)
	cmd := &cobra.Command{
		Use:   "ingest PLAN_DIR --db DIR",
		Short: "Load a plan's embedding tables into the store (SST ingestion; re-run to resume)",
		Long: `Ingest loads the tables of a partition plan into the embedding store at
--db as a new version of the model and switches to it (unless
--no-activate). It is resumable: after a crash or ^C, running the same
command again goes on where it stopped; a table is served only once all
its rows are in.

--dtype sets the stored dtype: float32 (default, exact), float16 or int8
(a per-row scale), for every table ("int8") or per table
("emb_l.2.weight=int8,float16" : the bare one is the default). The
accuracy lost is reported per table.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if db == "" {
				return fmt.Errorf("--db is required")
			}
			hot, err := parseBytes(hotBytes)
			if err != nil {
				return fmt.Errorf("--hot-bytes: %w", err)
			}
			sst, err := parseBytes(sstBytes)
			if err != nil {
				return fmt.Errorf("--sst-bytes: %w", err)
			}
			io := store.IngestOptions{Model: model, NoActivate: noActivate, HotBytes: hot, SSTBytes: sst, TableDTypes: map[string]store.DType{}}
			for _, part := range strings.Split(dtype, ",") {
				if part = strings.TrimSpace(part); part == "" {
					continue
				}
				name, dt, ok := strings.Cut(part, "=")
				if !ok {
					name, dt = "", part
				}
				d, err := store.ParseDType(dt)
				if err != nil {
					return fmt.Errorf("--dtype: %w", err)
				}
				if name == "" {
					io.DType = d
				} else {
					io.TableDTypes[name] = d
				}
			}
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
			defer stop()
			s, err := store.Open(db, &store.Options{HotBytes: -1})
			if err != nil {
				return err
			}
			defer s.Close()
			var bar *progress.Bar
			io.Progress = func(done, total int64) {
				if bar == nil {
					bar = progress.New(cmd.ErrOrStderr(), "ingest", total, true)
				}
				bar.Set(done)
			}
			rep, err := s.Ingest(ctx, args[0], io)
			if bar != nil {
				bar.Done()
			}
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			for _, t := range rep.Tables {
				how := "ingested"
				switch {
				case t.Shared:
					how = "shared (same content already stored)"
				case t.ResumedAt > 0:
					how = fmt.Sprintf("resumed at row %d", t.ResumedAt)
				}
				fmt.Fprintf(w, "table %-24s %10d x %-4d %-8s phys %-4d %s\n", t.Name, t.Rows, t.Dim, t.DType, t.Phys, how)
				if t.Loss != nil {
					fmt.Fprintf(w, "    accuracy loss %s\n", t.Loss)
				}
			}
			sec := rep.Elapsed.Seconds()
			fmt.Fprintf(w, "model %q version %d (active: %v): %d rows, %s in %.1fs: %.0f rows/s, %.1f MB/s\n",
				rep.Model, rep.Version, rep.Activated, rep.Rows, progress.Bytes(rep.Bytes), sec, float64(rep.Rows)/sec, float64(rep.Bytes)/sec/1e6)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&db, "db", "", "store directory (created if missing)")
	f.StringVar(&dtype, "dtype", "", "stored dtype: float32|float16|int8, or NAME=DTYPE,... per table")
	f.StringVar(&model, "model", "", "model name (default: the plan's)")
	f.StringVar(&hotBytes, "hot-bytes", "", "hot tier size to record as the store's default (e.g. 512MiB)")
	f.StringVar(&sstBytes, "sst-bytes", "", "bytes per ingested SST (default 64MiB)")
	f.BoolVar(&noActivate, "no-activate", false, "add the version without switching to it")
	return cmd
}

// parseBytes reads "1234", "64MiB", "2GB", "512k" ("" is 0).
func parseBytes(s string) (int64, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return 0, nil
	}
	mult := int64(1)
	low := strings.ToLower(s)
	for _, u := range []struct {
		suffix string
		m      int64
	}{{"kib", 1 << 10}, {"mib", 1 << 20}, {"gib", 1 << 30}, {"kb", 1e3}, {"mb", 1e6}, {"gb", 1e9}, {"k", 1 << 10}, {"m", 1 << 20}, {"g", 1 << 30}, {"b", 1}} {
		if strings.HasSuffix(low, u.suffix) {
			mult, low = u.m, strings.TrimSuffix(low, u.suffix)
			break
		}
	}
	n, err := strconv.ParseFloat(strings.TrimSpace(low), 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%q is not a size", s)
	}
	return int64(n * float64(mult)), nil
}
