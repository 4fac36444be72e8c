package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"

	"github.com/spf13/cobra"
)

func init() { subcommands = append(subcommands, newServeCmd) }

// serveSubcommands holds the tiers; each tier's file adds itself.
var serveSubcommands []func() *cobra.Command

func newServeCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run one serving tier: cpu (embedding tier), gpu (dense tier) or router",
	}
	for _, mk := range serveSubcommands {
		cmd.AddCommand(mk())
	}
	return cmd
}

// signalContext is cancelled by SIGINT or SIGTERM: the tiers then shut
// down gracefully, finishing the requests in flight.
func signalContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
}

// newLogger is the tiers' structured logger on stderr: text by default,
// JSON with --log-format json (for log collectors).
func newLogger(format, level string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level %q: %w", level, err)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "json":
		return slog.New(slog.NewJSONHandler(os.Stderr, opts)), nil
	case "text", "":
		return slog.New(slog.NewTextHandler(os.Stderr, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: want text or json", format)
}

// lightHeapGC sets the garbage collector's target to 400% unless the
// environment sets GOGC. The router and the dense workers keep small live
// heaps (tens of MB) but allocate a request's worth of buffers per call,
// so at Go's default of 100 they collected many times a second: 10% of
// the router's CPU under `make bench-serve`. The embedding tier keeps the
// default: its live heap holds the hot tier (gigabytes), and 400% of that
// is memory a machine does not have.
func lightHeapGC() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(400)
	}
}
