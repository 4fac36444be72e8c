// Package lograte keeps a repeated log record from flooding a log: the
// first of a run of like records (same key) is written at once, the
// ones after it within a window are counted, and at the end of each
// window that counted any, one record says how many ("N more like this
// in the last 10s") with the attributes of the last of them. A key
// quiet for a whole window is forgotten, so its next record is again a
// first occurrence, written at once.
//
// For a record a persistent condition repeats per request or per retry
// (a dead worker every micro-batch meets until it expires); state
// changes (a worker gone, a worker back) are logged plainly.
package lograte

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"
)

// DefaultWindow is the window of a Limiter made with a zero one.
const DefaultWindow = 10 * time.Second

// maxKeys bounds the runs tracked at once; records of further keys
// share one run per message.
const maxKeys = 256

// Limiter rate-limits records by key. The zero value is not usable;
// make one with New. Safe for concurrent use.
type Limiter struct {
	log    *slog.Logger
	window time.Duration

	mu     sync.Mutex
	runs   map[string]*run
	closed bool
}

// run is one key's current window.
type run struct {
	level      slog.Level
	msg        string
	args       []any // of the last record counted
	suppressed int
	timer      *time.Timer
}

// New returns a Limiter writing to log with windows of window
// (DefaultWindow when 0).
func New(log *slog.Logger, window time.Duration) *Limiter {
	if window <= 0 {
		window = DefaultWindow
	}
	if log == nil {
		log = slog.Default()
	}
	return &Limiter{log: log, window: window, runs: map[string]*run{}}
}

// Warn is Log at slog.LevelWarn.
func (l *Limiter) Warn(key, msg string, args ...any) { l.Log(slog.LevelWarn, key, msg, args...) }

// Log writes the record at once when it is the first of key in the
// current window, and otherwise counts it for the window's summary.
// The key names what makes records alike (the message and the workers
// concerned, say), not what varies among them (an error's text).
func (l *Limiter) Log(level slog.Level, key, msg string, args ...any) {
	if l == nil || !l.log.Enabled(context.Background(), level) {
		return
	}
	key = msg + "\x00" + key
	l.mu.Lock()
	if r, ok := l.runs[key]; ok {
		r.suppressed++
		r.args = args
		l.mu.Unlock()
		return
	}
	if l.closed {
		l.mu.Unlock()
		l.log.Log(context.Background(), level, msg, args...)
		return
	}
	if len(l.runs) >= maxKeys {
		// Too many distinct keys at once: they share a run per message.
		key = msg + "\x00\x00overflow"
		if r, ok := l.runs[key]; ok {
			r.suppressed++
			r.args = args
			l.mu.Unlock()
			return
		}
	}
	r := &run{level: level, msg: msg}
	r.timer = time.AfterFunc(l.window, func() { l.flush(key) })
	l.runs[key] = r
	l.mu.Unlock()
	l.log.Log(context.Background(), level, msg, args...)
}

// flush ends key's window: a summary of the records counted, and a new
// window, or, none counted, the key forgotten.
func (l *Limiter) flush(key string) {
	l.mu.Lock()
	r, ok := l.runs[key]
	if !ok {
		l.mu.Unlock()
		return
	}
	n, args := r.suppressed, r.args
	if n == 0 || l.closed {
		delete(l.runs, key)
	} else {
		r.suppressed, r.args = 0, nil
		r.timer.Reset(l.window)
	}
	l.mu.Unlock()
	if n > 0 {
		l.log.Log(context.Background(), r.level, summary(r.msg, n, l.window), append(append([]any(nil), args...), "suppressed", n)...)
	}
}

func summary(msg string, n int, window time.Duration) string {
	return fmt.Sprintf("%s (%d more like this in the last %s)", msg, n, window)
}

// Close writes the summaries of the windows under way and stops the
// timers; records after it are written as they come.
func (l *Limiter) Close() {
	if l == nil {
		return
	}
	l.mu.Lock()
	l.closed = true
	keys := make([]string, 0, len(l.runs))
	for k, r := range l.runs {
		r.timer.Stop()
		keys = append(keys, k)
	}
	l.mu.Unlock()
	for _, k := range keys {
		l.flush(k)
	}
}
