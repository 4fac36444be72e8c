package main

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestZeroFlagsRefused: a count or duration given as 0 (or less) that
// the tier would silently replace by its default is refused, naming the
// flag, before anything starts.
func TestZeroFlagsRefused(t *testing.T) {
	dir := t.TempDir()
	for _, args := range [][]string{
		{"up", "--model", dir + "/none", "--micro-batch", "0"},
		{"up", "--model", dir + "/none", "--max-delay", "0"},
		{"up", "--model", dir + "/none", "--dense-sessions", "0"},
		{"serve", "router", "--insecure", "--addr", "127.0.0.1:0", "--shutdown-grace", "0"},
		{"serve", "embedding", "--insecure", "--db", dir + "/db", "--plan", dir + "/none", "--max-samples", "-5"},
		{"serve", "embedding", "--insecure", "--db", dir + "/db", "--plan", dir + "/none", "--max-inflight-samples", "0"},
		// The router took these for their defaults (1 GiB, 256 MiB, 15 s)
		// and served.
		{"serve", "router", "--insecure", "--addr", "127.0.0.1:0", "--max-inflight-bytes", "0"},
		{"serve", "router", "--insecure", "--addr", "127.0.0.1:0", "--max-inflight-bytes", "-5"},
		{"serve", "router", "--insecure", "--addr", "127.0.0.1:0", "--update-log-bytes", "0"},
		{"serve", "router", "--insecure", "--addr", "127.0.0.1:0", "--update-log-total-bytes", "0"},
		{"serve", "router", "--insecure", "--addr", "127.0.0.1:0", "--sequencer-lease-duration", "0"},
		{"status", "--insecure", "--timeout", "0"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		out, err := exec.CommandContext(ctx, prismBin, args...).CombinedOutput()
		timedOut := ctx.Err() != nil
		cancel()
		flag := args[len(args)-2]
		if err == nil || timedOut || !strings.Contains(string(out), flag+" ") || !strings.Contains(string(out), ": want a positive value") {
			t.Errorf("prism %s: %v (timed out: %v), want it refused naming %s:\n%s", strings.Join(args, " "), err, timedOut, flag, out)
		}
	}
}
