// Package progress draws a progress bar for long jobs: redrawn in place on
// a terminal, a plain line every 10% otherwise (logs, CI).
package progress

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"
)

// Bar reports progress of a job of known size in bytes or items.
type Bar struct {
	mu       sync.Mutex
	w        io.Writer
	label    string
	total    int64
	bytes    bool
	tty      bool
	start    time.Time
	lastDraw time.Time
	lastPct  int
	done     bool
}

// New starts a bar on w for a job of total units; bytes says whether the
// units are bytes (shown as MiB/GiB).
func New(w io.Writer, label string, total int64, bytes bool) *Bar {
	return &Bar{w: w, label: label, total: total, bytes: bytes, tty: IsTerminal(w), start: time.Now(), lastPct: -1}
}

// IsTerminal says whether w is a character device (an interactive terminal).
func IsTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// Set records that done units of the total are finished.
func (b *Bar) Set(done int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.done || b.total <= 0 {
		return
	}
	pct := int(100 * done / b.total)
	now := time.Now()
	if b.tty {
		if now.Sub(b.lastDraw) < 100*time.Millisecond && done < b.total {
			return
		}
		const width = 30
		fill := width * int(min(done, b.total)) / int(b.total)
		fmt.Fprintf(b.w, "\r%s [%s%s] %3d%% %s", b.label, strings.Repeat("=", fill), strings.Repeat(" ", width-fill), pct, b.amount(done, now))
	} else {
		if pct/10 == b.lastPct/10 && done < b.total {
			return
		}
		fmt.Fprintf(b.w, "%s: %d%% %s\n", b.label, pct, b.amount(done, now))
	}
	b.lastDraw, b.lastPct = now, pct
	if done >= b.total {
		b.finish()
	}
}

func (b *Bar) amount(done int64, now time.Time) string {
	el := now.Sub(b.start).Seconds()
	if !b.bytes {
		return fmt.Sprintf("%d/%d", done, b.total)
	}
	rate := ""
	if el > 0 {
		rate = fmt.Sprintf(" %s/s", Bytes(int64(float64(done)/el)))
	}
	return fmt.Sprintf("%s/%s%s", Bytes(done), Bytes(b.total), rate)
}

func (b *Bar) finish() {
	if b.tty {
		fmt.Fprintln(b.w)
	}
	b.done = true
}

// Done ends the bar (a newline on a terminal).
func (b *Bar) Done() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.done && b.lastPct >= 0 {
		b.finish()
	}
	b.done = true
}

// Bytes formats a byte count for people. A count that would round to
// 1024.0 of a unit is written in the next one ("1.00 GiB", not "1024.0
// MiB").
func Bytes(n int64) string {
	switch x := float64(n); {
	case x >= 1023.95*(1<<20):
		return fmt.Sprintf("%.2f GiB", x/(1<<30))
	case x >= 1023.95*(1<<10):
		return fmt.Sprintf("%.1f MiB", x/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
