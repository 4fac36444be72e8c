package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestUpConfigChecks: a value out of range in a --config file is refused
// naming the file (it named only the flag, as if typed: "--micro-batch
// 0: want a positive value"), one typed on the command line without it;
// a flag given on the command line that differs from the file's says it
// wins (it did so silently), not where they differ only as written (4ms
// and 0.004s), naming the flag as typed (a deprecated alias); a whole
// number written as a float (1e3, 1000.0) is read as an integer flag's
// value (it was refused). No --model: every case ends before up starts
// anything.
func TestUpConfigChecks(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		args       []string
		err        []string // in the error, in order
		notErr     string   // not in the error
		stderr     string
	}{
		{name: "micro-batch 0", body: `{"micro-batch": 0}`, err: []string{"--config", "--micro-batch 0: want a positive value"}},
		{name: "max-delay 0", body: `{"max-delay": "0s"}`, err: []string{"--config", "--max-delay 0s"}},
		{name: "max-batch -5", body: `{"max-batch": -5}`, err: []string{"--config", "--max-batch -5"}},
		{name: "dense-workers -1", body: `{"dense-workers": -1}`, err: []string{"--config", "--dense-workers -1"}},
		{name: "admit-share 7", body: `{"admit-share": 7}`, err: []string{"--config", "--admit-share 7"}},
		{name: "hot-bytes 12XB", body: `{"hot-bytes": "12XB"}`, err: []string{"--config", "--hot-bytes"}},
		{name: "the command line's own", body: `{"max-batch": 256}`, args: []string{"--micro-batch", "0"}, err: []string{"--micro-batch 0"}, notErr: "--config"},
		{name: "the command line wins, and says so", body: `{"max-batch": 1024, "micro-batch": 64}`, args: []string{"--max-batch", "512", "--micro-batch", "64"},
			err: []string{"at least one --model"}, stderr: "the command line's --max-batch 512 wins over the file's 1024"},
		// Equal values written two ways are not a difference to note:
		// the note compared the strings, so 4ms against the file's 0.004s
		// said the command line won.
		{name: "same values, written two ways", body: `{"max-delay": "0.004s", "admit-share": 0.50, "admit-limit": 1, "max-batch": 1024.0}`,
			args: []string{"--max-delay", "4ms", "--admit-share", ".5", "--admit-limit", "--max-batch", "1024"}, err: []string{"at least one --model"}},
		// A deprecated name is noted as typed, not as the flag it sets
		// (the note said --dense-workers, which the user had not typed).
		{name: "an alias wins as typed", body: `{"dense-workers": 4}`, args: []string{"--gpu-workers", "3"},
			err: []string{"at least one --model"}, stderr: "the command line's --gpu-workers 3 wins over the file's dense-workers 4"},
		{name: "1e3", body: `{"micro-batch": 1e3, "max-batch": 1000.0}`, err: []string{"at least one --model"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "c.json")
			if err := os.WriteFile(path, []byte(tc.body), 0o644); err != nil {
				t.Fatal(err)
			}
			cmd := newUpCmd()
			cmd.SetArgs(append([]string{"--config", path}, tc.args...))
			var stderr strings.Builder
			cmd.SetOut(&strings.Builder{})
			cmd.SetErr(&stderr)
			err := cmd.Execute()
			if err == nil {
				t.Fatal("no error")
			}
			msg := err.Error()
			for _, w := range tc.err {
				i := strings.Index(msg, w)
				if i < 0 {
					t.Fatalf("error %q, want %q in it (in order: %q)", msg, w, tc.err)
				}
				msg = msg[i+len(w):]
			}
			if tc.notErr != "" && strings.Contains(err.Error(), tc.notErr) {
				t.Errorf("error %q names %q", err, tc.notErr)
			}
			if !strings.Contains(stderr.String(), tc.stderr) || tc.stderr == "" && strings.Contains(stderr.String(), "wins") {
				t.Errorf("stderr %q, want %q", stderr.String(), tc.stderr)
			}
		})
	}
}
