package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/prism-serve/prism/internal/auth"
	"github.com/prism-serve/prism/internal/serve"
)

func init() { subcommands = append(subcommands, newServeCmd) }

// serveSubcommands holds the tiers; each tier's file adds itself.
var serveSubcommands []func() *cobra.Command

func newServeCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run one serving tier: embedding, dense or router",
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

// newLogger is the tiers' logger on stderr, with the flag named in errors.
func newLogger(format, level string) (*slog.Logger, error) {
	log, err := serve.NewLogger(os.Stderr, format, level)
	if err != nil {
		flag := "--log-format"
		if errors.Is(err, serve.ErrLogLevel) {
			flag = "--log-level"
		}
		return nil, fmt.Errorf("%w (check %s)", err, flag)
	}
	// Certificate reloads and approaching expiry in the tier's log.
	auth.SetLogger(log)
	return log, nil
}
