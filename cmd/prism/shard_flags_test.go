package main

import (
	"strings"
	"testing"
)

// TestShardZeroFlagsRefused: prism shard's --tolerance, --zipf and
// --shard-bytes given as 0 were silently taken as their defaults (10%,
// the Criteo sample or Zipf 1.05, the fair share plus 25%).
func TestShardZeroFlagsRefused(t *testing.T) {
	dir := t.TempDir()
	for _, args := range [][]string{
		{"shard", dir, "--shards", "2", "--tolerance", "0"},
		{"shard", dir, "--shards", "2", "--zipf", "0"},
		{"shard", dir, "--shards", "2", "--shard-bytes", "0"},
		{"shard", dir, "--shards", "2", "--shard-bytes", "0.4"},
	} {
		out, err := run(t, nil, args...)
		flag := args[len(args)-2]
		if err == nil || !strings.Contains(out, flag+" ") || !strings.Contains(out, "want a positive value") {
			t.Errorf("prism %s: %v, want it refused naming %s:\n%s", strings.Join(args, " "), err, flag, out)
		}
	}
}
