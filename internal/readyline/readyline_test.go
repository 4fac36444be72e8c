package readyline

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"
)

// The scripts sed these exact lines: their bytes must not change.
func TestLinesAreByteIdentical(t *testing.T) {
	var b bytes.Buffer
	WriteRouter(&b, "127.0.0.1:8500", "127.0.0.1:9100", "")
	WriteRouter(&b, "127.0.0.1:8500", "127.0.0.1:9100", "127.0.0.1:8080")
	WriteEmbedding(&b, "127.0.0.1:1")
	WriteDense(&b, "127.0.0.1:2")
	WriteUp(&b, "127.0.0.1:8500", []string{"a", "b"}, 2, 1)
	want := "router listening on 127.0.0.1:8500 (metrics 127.0.0.1:9100)\n" +
		"router listening on 127.0.0.1:8500 (metrics 127.0.0.1:9100) (http 127.0.0.1:8080)\n" +
		"embedding tier listening on 127.0.0.1:1\n" +
		"dense tier listening on 127.0.0.1:2\n" +
		"Prism is up: Recommend at 127.0.0.1:8500 (models a, b; 2 dense, 1 embedding workers). Ctrl-C stops it.\n"
	if b.String() != want {
		t.Fatalf("got\n%s\nwant\n%s", b.String(), want)
	}
}

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		l        Line
		line     string
		addr     string
		ok, find bool
	}{
		{Router, "router listening on 1.2.3.4:5 (metrics 1.2.3.4:6)", "1.2.3.4:5", true, true},
		{Router, "[router] router listening on 1.2.3.4:5 (metrics x)", "", false, true},
		{Dense, "dense tier listening on [::1]:7", "[::1]:7", true, true},
		{Dense, "embedding tier listening on 1:2", "", false, false},
		{Up, "Prism is up: Recommend at 127.0.0.1:1 (models m; 1 dense, 1 embedding workers). Ctrl-C stops it.", "127.0.0.1:1", true, true},
		{New("ready"), "ready", "", true, true},
		{New("ready"), "ack 3", "", false, false},
	} {
		addr, ok := tc.l.Parse(tc.line)
		if ok != tc.ok || (ok && addr != tc.addr) {
			t.Errorf("%q.Parse(%q) = %q, %v; want %q, %v", tc.l.Prefix(), tc.line, addr, ok, tc.addr, tc.ok)
		}
		if _, ok := tc.l.Find(tc.line); ok != tc.find {
			t.Errorf("%q.Find(%q) = %v, want %v", tc.l.Prefix(), tc.line, ok, tc.find)
		}
	}
}

// TestRouterHTTP: the HTTP/JSON address is read from a router's line
// (tagged by prism up's supervisor too), and only from one.
func TestRouterHTTP(t *testing.T) {
	for _, tc := range []struct{ line, want string }{
		{"router listening on 1.2.3.4:5 (metrics 1.2.3.4:6) (http 1.2.3.4:7)", "1.2.3.4:7"},
		{"[router] router listening on 1.2.3.4:5 (metrics 1.2.3.4:6) (http [::1]:8)", "[::1]:8"},
		{"router listening on 1.2.3.4:5 (metrics 1.2.3.4:6)", ""},
		{"dense tier listening on 1.2.3.4:5 (http 1.2.3.4:7)", ""},
		{"router listening on 1.2.3.4:5 (http 1.2.3.4:7", ""},
	} {
		if got := RouterHTTP(tc.line); got != tc.want {
			t.Errorf("RouterHTTP(%q) = %q, want %q", tc.line, got, tc.want)
		}
	}
}

func TestWatch(t *testing.T) {
	ctx := context.Background()
	t.Run("ready", func(t *testing.T) {
		var echoed []string
		w := Start(strings.NewReader("loading\ndense tier listening on 127.0.0.1:9\nserving\n"), Dense, WatchOptions{Echo: func(l string) { echoed = append(echoed, l) }})
		addr, err := w.Await(ctx, time.Minute)
		if err != nil || addr != "127.0.0.1:9" {
			t.Fatalf("Await = %q, %v", addr, err)
		}
		<-w.Done()
		if len(echoed) != 3 {
			t.Errorf("echoed %q, want every line", echoed)
		}
	})
	t.Run("tagged", func(t *testing.T) {
		w := Start(strings.NewReader("[up] Prism is up: Recommend at 1.1.1.1:1 (models m)\n"), Up, WatchOptions{Anywhere: true})
		if addr, err := w.Await(ctx, time.Minute); err != nil || addr != "1.1.1.1:1" {
			t.Fatalf("Await = %q, %v", addr, err)
		}
	})
	t.Run("exited", func(t *testing.T) {
		w := Start(strings.NewReader("error: no store\n"), Embedding, WatchOptions{})
		if _, err := w.Await(ctx, time.Minute); !errors.Is(err, ErrExited) {
			t.Fatalf("Await: %v, want ErrExited", err)
		}
	})
	t.Run("timeout", func(t *testing.T) {
		pr, pw := io.Pipe()
		defer pw.Close()
		w := Start(pr, Embedding, WatchOptions{})
		if _, err := w.Await(ctx, 20*time.Millisecond); !errors.Is(err, ErrTimeout) {
			t.Fatalf("Await: %v, want ErrTimeout", err)
		}
	})
	t.Run("long line drained", func(t *testing.T) {
		// A line past the scanner's limit must not leave the writer blocked.
		long := strings.Repeat("x", 2<<20) + "\n"
		pr, pw := io.Pipe()
		go func() { io.WriteString(pw, long+"more\n"); pw.Close() }()
		w := Start(pr, Dense, WatchOptions{})
		select {
		case <-w.Done():
		case <-time.After(10 * time.Second):
			t.Fatal("output not drained")
		}
	})
}
