package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// prism up --config: the file's flags apply, the command line wins, an
// unknown key is an error.
func TestUpConfig(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tuned := write("tune.json", `{"mode": "grid", "trials": [], "best": {"config": {"micro-batch": "256", "threads": "2", "max-delay": "4ms"}}}`)
	cmd := newUpCmd()
	if err := cmd.Flags().Parse([]string{"--threads", "1", "--config", tuned}); err != nil {
		t.Fatal(err)
	}
	if _, err := applyConfig(cmd.Flags(), tuned); err != nil {
		t.Fatal(err)
	}
	for flag, want := range map[string]string{"micro-batch": "256", "threads": "1", "max-delay": "4ms", "max-batch": "0"} {
		if got := cmd.Flags().Lookup(flag).Value.String(); got != want {
			t.Errorf("--%s = %s, want %s", flag, got, want)
		}
	}
	// A deprecated name on the command line wins too: --gpu-workers 3
	// served with the file's dense-workers 4.
	cmd = newUpCmd()
	if err := cmd.Flags().Parse([]string{"--gpu-workers", "3", "--cpu-workers", "2"}); err != nil {
		t.Fatal(err)
	}
	workers := write("workers.json", `{"dense-workers": "4", "embedding-workers": "5", "micro-batch": "128"}`)
	if _, err := applyConfig(cmd.Flags(), workers); err != nil {
		t.Fatal(err)
	}
	for flag, want := range map[string]string{"dense-workers": "3", "embedding-workers": "2", "micro-batch": "128"} {
		if got := cmd.Flags().Lookup(flag).Value.String(); got != want {
			t.Errorf("given --gpu-workers 3 --cpu-workers 2: --%s = %s, want %s", flag, got, want)
		}
	}
	for body, want := range map[string]string{
		`{"micro-batch": 256, "turbo": true}`: `unknown key "turbo"`,
		`{"config": "other.json"}`:            `unknown key "config"`,
		`{"threads": "two"}`:                  "threads",
	} {
		bad := write("bad.json", body)
		cmd := newUpCmd()
		cmd.SetArgs([]string{"--model", dir, "--config", bad})
		cmd.SetOut(&strings.Builder{})
		cmd.SetErr(&strings.Builder{})
		err := cmd.Execute()
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %v, want %q", body, err, want)
		}
	}
}
