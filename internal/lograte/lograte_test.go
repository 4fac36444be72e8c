package lograte

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// syncBuf is a bytes.Buffer the limiter's timers and the test share.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) lines() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strings.Split(strings.TrimSpace(s.b.String()), "\n")
}

func TestLimiter(t *testing.T) {
	const window = 100 * time.Millisecond
	tests := []struct {
		name string
		// run logs through l; the records are checked once it returns
		// and the limiter is closed.
		run  func(l *Limiter)
		want []string // each line's substring, in order
	}{{
		name: "first at once, the rest summed up",
		run: func(l *Limiter) {
			for i := range 1000 {
				l.Warn("a", "worker failed", "i", i)
			}
		},
		want: []string{"msg=\"worker failed\" i=0", "(999 more like this in the last 100ms)\" i=999 suppressed=999"},
	}, {
		name: "each key its own first occurrence",
		run: func(l *Limiter) {
			l.Warn("a", "worker failed", "w", "a")
			l.Warn("b", "worker failed", "w", "b")
		},
		want: []string{"w=a", "w=b"},
	}, {
		name: "a quiet window forgets the key",
		run: func(l *Limiter) {
			l.Warn("a", "worker failed", "n", 1)
			time.Sleep(3 * window)
			l.Warn("a", "worker failed", "n", 2)
		},
		want: []string{"n=1", "n=2"},
	}, {
		// Two windows' summaries, then Close's of the third.
		name: "a summary per window while it repeats",
		run: func(l *Limiter) {
			for end := time.Now().Add(window * 5 / 2); time.Now().Before(end); time.Sleep(time.Millisecond) {
				l.Warn("a", "worker failed")
			}
		},
		want: []string{"msg=\"worker failed\"", "more like this", "more like this", "more like this"},
	}, {
		name: "below the logger's level nothing",
		run: func(l *Limiter) {
			l.Log(slog.LevelDebug, "a", "worker failed")
		},
		want: nil,
	}}
	for _, tc := range tests {
		// In a bubble of fake time (testing/synctest): the windows'
		// timers fire when the loop's sleeps say, not when a loaded
		// machine runs them (a fresh-clone CI run beside other work saw
		// one summary of a 2.5-window run: the timer fired 68 ms late
		// and the loop's last sleeps outlasted the window after it).
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				var buf syncBuf
				l := New(slog.New(slog.NewTextHandler(&buf, nil)), window)
				tc.run(l)
				l.Close()
				got := buf.lines()
				if len(tc.want) == 0 {
					if len(got) != 1 || got[0] != "" {
						t.Fatalf("got %q, want no record", got)
					}
					return
				}
				if len(got) != len(tc.want) {
					t.Fatalf("got %d records %q, want %d", len(got), got, len(tc.want))
				}
				for i, w := range tc.want {
					if !strings.Contains(got[i], w) {
						t.Errorf("record %d: %q lacks %q", i, got[i], w)
					}
				}
			})
		})
	}
}

// TestLimiterKeysBounded: records of ever more keys share one run per
// message beyond maxKeys, so neither the log nor the limiter grows
// with them.
func TestLimiterKeysBounded(t *testing.T) {
	var buf syncBuf
	l := New(slog.New(slog.NewTextHandler(&buf, nil)), time.Hour)
	for i := range 10 * maxKeys {
		l.Warn(strings.Repeat("k", i), "worker failed")
	}
	if n := len(buf.lines()); n != maxKeys+1 {
		t.Errorf("%d records for %d keys, want %d", n, 10*maxKeys, maxKeys+1)
	}
	l.mu.Lock()
	runs := len(l.runs)
	l.mu.Unlock()
	if runs != maxKeys+1 {
		t.Errorf("%d runs tracked, want %d", runs, maxKeys+1)
	}
	l.Close()
}
