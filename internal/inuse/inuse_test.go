package inuse

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"

	"github.com/cockroachdb/pebble/v2"
)

// TestMain: with INUSE_HOLD set, the test binary is the other process,
// holding that Pebble folder open until its stdin closes.
func TestMain(m *testing.M) {
	if dir := os.Getenv("INUSE_HOLD"); dir != "" {
		db, err := pebble.Open(dir, &pebble.Options{Logger: quiet{}})
		if err != nil {
			fmt.Println(err)
			os.Exit(1)
		}
		fmt.Println("holding")
		io.Copy(io.Discard, os.Stdin)
		db.Close()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

type quiet struct{}

func (quiet) Infof(string, ...any)  {}
func (quiet) Errorf(string, ...any) {}
func (quiet) Fatalf(f string, a ...any) {
	panic(fmt.Sprintf(f, a...))
}

// TestExplain: a Pebble folder another process holds fails to open with
// an error that says the folder is in use; the lock's own error is kept.
func TestExplain(t *testing.T) {
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run", "^$")
	cmd.Env = append(os.Environ(), "INUSE_HOLD="+dir)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { stdin.Close(); cmd.Wait() }()
	if line, _ := bufio.NewReader(out).ReadString('\n'); line != "holding\n" {
		t.Fatalf("the other process: %q", line)
	}
	_, err = pebble.Open(dir, &pebble.Options{Logger: quiet{}})
	err = Explain(err)
	if err == nil || !strings.Contains(err.Error(), "in use by another process") || !errors.Is(err, syscall.EAGAIN) {
		t.Fatalf("opening a folder another process holds: %v", err)
	}
	if other := errors.New("disk on fire"); Explain(other) != other || Explain(nil) != nil {
		t.Fatal("Explain changed an error that is not a lock")
	}
}
