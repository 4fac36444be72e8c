package models

import (
	"strings"
	"testing"
)

func TestHumanCount(t *testing.T) {
	for n, want := range map[int64]string{0: "0", 999: "999", 1500: "1.5k", 540_680_000: "540.68M", 2_500_000_000: "2.50G"} {
		if got := HumanCount(n); got != want {
			t.Errorf("HumanCount(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestWriteList(t *testing.T) {
	var b strings.Builder
	if err := WriteList(&b); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != len(Presets())+1 || !strings.HasPrefix(lines[0], "NAME") {
		t.Errorf("list:\n%s", b.String())
	}
}
