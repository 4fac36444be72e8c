package serve

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime/debug"
)

// Errors of NewLogger, for the caller to say which setting was wrong.
var (
	ErrLogLevel  = errors.New("bad log level")
	ErrLogFormat = errors.New("bad log format")
)

// NewLogger is a tier's structured logger on w: format "text" (or "")
// or "json" (for log collectors), at level ("debug", "info", "warn",
// "error").
func NewLogger(w io.Writer, format, level string) (*slog.Logger, error) {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("%w %q: %w", ErrLogLevel, level, err)
	}
	opts := &slog.HandlerOptions{Level: lv}
	switch format {
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	case "text", "":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("%w %q: want text or json", ErrLogFormat, format)
}

// LightHeapGC sets the garbage collector's target to 400% unless the
// environment sets GOGC. The router and the dense workers keep small live
// heaps (tens of MB) but allocate a request's worth of buffers per call,
// so at Go's default of 100 they collected many times a second: 10% of
// the router's CPU under `make bench-serve`. The embedding tier keeps the
// default: its live heap holds the hot tier (gigabytes), and 400% of that
// is memory a machine does not have.
func LightHeapGC() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(400)
	}
}
