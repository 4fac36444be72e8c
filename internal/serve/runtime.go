package serve

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
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
//
// What keeps collections rare is the headroom, the bytes allocated
// between two of them, and 400% of a small heap is lightHeadroom or
// less. A router's live heap is not always small, though: its update
// log keeps up to --update-log-bytes (256 MiB) of each model's recent
// embedding updates, and at 400% the heap grew to five times that (267
// MB live, 1.6 GB resident under a steady stream of updates). So after
// each collection the target is set for a headroom of lightHeadroom,
// between 100% (a large live heap: twice it at most) and 400%.
func LightHeapGC() {
	if os.Getenv("GOGC") != "" {
		return
	}
	lightGCOnce.Do(func() {
		last := lightGCPercent(0)
		debug.SetGCPercent(last)
		sample := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
		afterGC(func() {
			metrics.Read(sample)
			if sample[0].Value.Kind() != metrics.KindUint64 {
				return
			}
			if p := lightGCPercent(sample[0].Value.Uint64()); p != last {
				last = p
				debug.SetGCPercent(p)
			}
		})
	})
}

// lightGCOnce: one process sets its collector once (a test may start
// several servers).
var lightGCOnce sync.Once

// lightHeadroom is the headroom LightHeapGC keeps: 400% of 64 MiB.
const lightHeadroom = 256 << 20

// lightGCPercent is the GC target giving a heap of live bytes
// lightHeadroom of headroom, within 100% and 400% (0: not known yet,
// 400%), in steps of 25% so that a live heap moving a little does not
// change it after every collection.
func lightGCPercent(live uint64) int {
	if live == 0 {
		return 400
	}
	p := int(min(lightHeadroom*100/live, 400))
	return max(100, p/25*25)
}

// afterGC calls f after every collection, on the finalizer goroutine
// (f must not block): the finalizer of an unreachable object runs once
// a collection has found it so, and each call arms the next.
func afterGC(f func()) {
	type sentinel struct{ _ *int }
	runtime.SetFinalizer(&sentinel{}, func(*sentinel) {
		f()
		afterGC(f)
	})
}
