package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/prism-serve/prism/internal/auth"
	"github.com/prism-serve/prism/internal/serve"
	"github.com/prism-serve/prism/internal/tracing"
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

// signalContextForce is signalContext for a command that stops child
// processes: the second SIGINT or SIGTERM, after the first cancelled
// ctx, closes force (the children are then killed instead of drained).
// With signal.NotifyContext a second Ctrl-C was swallowed: prism up
// whose embedding worker hung took the router's grace and then the
// worker's 15 s whatever the user pressed.
func signalContextForce() (ctx context.Context, force <-chan struct{}, stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan os.Signal, 2)
	signal.Notify(ch, os.Interrupt, syscall.SIGTERM)
	forced, done := make(chan struct{}), make(chan struct{})
	go func() {
		select {
		case <-ch:
			cancel()
		case <-done:
			return
		}
		select {
		case <-ch:
			close(forced)
		case <-done:
		}
	}()
	var once sync.Once
	return ctx, forced, func() {
		once.Do(func() {
			signal.Stop(ch)
			close(done)
			cancel()
		})
	}
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

// startTracing sets up the tier's tracing when the OpenTelemetry
// environment asks for it (internal/tracing), before the tier's servers
// and clients are made, and says so in the log. The returned stop
// flushes the spans not yet sent, for up to 5 s.
func startTracing(service string, log *slog.Logger) (stop func(), err error) {
	shutdown, on, err := tracing.Setup(context.Background(), service, log)
	if err != nil {
		return nil, err
	}
	if on {
		endpoint := os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
		if endpoint == "" {
			endpoint = os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT")
		}
		_, sampler, _ := tracing.Sampler(os.Getenv) // the one in use (Setup warned of one it could not read)
		protocol, _ := tracing.Protocol(os.Getenv)  // Setup refused one it cannot send
		log.Info("tracing: spans to the OTLP collector", "endpoint", endpoint, "protocol", protocol, "sampler", sampler)
	}
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := shutdown(ctx); err != nil {
			log.Warn("tracing: spans not flushed at exit", "err", err)
		}
	}, nil
}
