package main

import (
	"fmt"
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

// TestUpConfigOtherMachine: up warns when --config's tune.json was tuned
// on a machine of another shape (dense workers per core, batches per
// GPU), and not when it was this one's or says none (earlier releases).
func TestUpConfigOtherMachine(t *testing.T) {
	here, _, _ := hostMachine()
	dir := t.TempDir()
	for _, c := range []struct {
		name, machine string
		warn          bool
	}{
		{"another", `"machine": {"cpus": 4096},`, true},
		{"this one", fmt.Sprintf(`"machine": {"cpus": %d, "devices": %d, "device": %q},`, here.CPUs, here.Devices, here.Device), false},
		{"none recorded", "", false},
	} {
		p := filepath.Join(dir, strings.ReplaceAll(c.name, " ", "-")+".json")
		body := `{"model": "m", ` + c.machine + ` "mode": "search", "trials": [], "best": {"config": {"micro-batch": "256"}}}`
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		// No --model: up stops after reading the config, having warned.
		out, err := run(t, nil, "up", "--config", p)
		if err == nil {
			t.Fatalf("%s: up without --model: no error\n%s", c.name, out)
		}
		got := strings.Contains(out, "was tuned on a machine of 4096 CPUs, and this one has "+here.String())
		if got != c.warn || (!c.warn && strings.Contains(out, "tuned on a machine")) {
			t.Errorf("%s: warned %v, want %v:\n%s", c.name, got, c.warn, out)
		}
	}
}
