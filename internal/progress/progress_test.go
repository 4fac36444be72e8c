package progress

import (
	"bytes"
	"strings"
	"testing"
)

// TestLinesWhenNotTerminal: off a terminal the bar prints one line per
// 10% from 10% to 100%.
func TestLinesWhenNotTerminal(t *testing.T) {
	var buf bytes.Buffer
	b := New(&buf, "writing", 1000, false)
	for i := int64(0); i <= 1000; i += 7 {
		b.Set(i)
	}
	b.Set(1000)
	b.Done()
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 10 {
		t.Fatalf("%d lines:\n%s", len(lines), buf.String())
	}
	if lines[9] != "writing: 100% 1000/1000" {
		t.Errorf("last line %q", lines[9])
	}
}

func TestBytes(t *testing.T) {
	for _, c := range []struct {
		n    int64
		want string
	}{{12, "12 B"}, {2048, "2.0 KiB"}, {5 << 20, "5.0 MiB"}, {3 << 30, "3.00 GiB"},
		// The unit's edges: what rounds to 1024.0 of one is the next.
		{1023, "1023 B"}, {1024, "1.0 KiB"}, {1<<20 - 52, "1023.9 KiB"}, {1<<20 - 51, "1.0 MiB"}, {1<<20 - 1, "1.0 MiB"},
		{1<<30 - 52<<10, "1023.9 MiB"}, {1<<30 - 51<<10, "1.00 GiB"}, {1<<30 - 1, "1.00 GiB"}, {-5, "-5 B"}} {
		if got := Bytes(c.n); got != c.want {
			t.Errorf("Bytes(%d) = %q, want %q", c.n, got, c.want)
		}
	}
}
