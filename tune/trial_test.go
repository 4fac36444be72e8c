package tune

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestTrialNotReadyStopsUpGracefully: a prism up not ready within
// --ready-timeout is stopped as at the end of a trial, SIGTERM first,
// so that it stops its own children (the router, the workers holding
// the store and the update log) before the next trial's prism up opens
// them. It was killed outright: its children, orphaned, still held the
// store's lock when the next trial started, which then failed "in use
// by another process" and ended the whole search. The fake prism here
// is never ready and notes the SIGTERM it exits on.
func TestTrialNotReadyStopsUpGracefully(t *testing.T) {
	dir := t.TempDir()
	exe := filepath.Join(dir, "prism")
	mark := filepath.Join(dir, "stopped")
	script := "#!/bin/sh\ntrap 'echo stopped > " + mark + "; exit 0' TERM\nwhile :; do sleep 0.05; done\n"
	if err := os.WriteFile(exe, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	tr := &ProcessTrialer{Exe: exe, Plan: dir, DB: filepath.Join(dir, "db"), Insecure: true, Model: "m", LogDir: dir, ReadyTimeout: 200 * time.Millisecond}
	res, err := tr.Trial(context.Background(), 1, Config{"micro-batch": "256"}, 10)
	if err != nil {
		t.Fatal(err)
	}
	if !res.NotStarted || !strings.Contains(res.Error, "prism up: up not ready after 200ms") {
		t.Errorf("result %+v, want not started: not ready after 200ms", res)
	}
	if _, err := os.Stat(mark); err != nil {
		t.Errorf("prism up was not stopped by SIGTERM (killed, its children left running): %v", err)
	}
}
