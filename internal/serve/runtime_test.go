package serve

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

func TestNewLogger(t *testing.T) {
	var b bytes.Buffer
	log, err := NewLogger(&b, "json", "warn")
	if err != nil {
		t.Fatal(err)
	}
	log.Info("hidden")
	log.Warn("shown", "tier", "dense")
	if s := b.String(); strings.Contains(s, "hidden") || !strings.Contains(s, `"tier":"dense"`) {
		t.Errorf("logged %q", s)
	}
	if _, err := NewLogger(&b, "xml", "info"); !errors.Is(err, ErrLogFormat) {
		t.Error("xml format accepted")
	}
	if _, err := NewLogger(&b, "text", "loud"); !errors.Is(err, ErrLogLevel) {
		t.Error("level loud accepted")
	}
}
