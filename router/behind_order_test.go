package router

import (
	"context"
	"log/slog"
	"testing"
	"time"
)

// blockingHandler blocks Handle of a record with message at until
// release is closed, telling entered first.
type blockingHandler struct {
	at               string
	entered, release chan struct{}
}

func (h blockingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h blockingHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Message == h.at {
		close(h.entered)
		<-h.release
	}
	return nil
}
func (h blockingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h blockingHandler) WithGroup(string) slog.Handler      { return h }

// TestBehindGaugeFollowsSequencerOrder: the behind gauge ends at the
// sequencer's last word for a sequence, whatever order concurrent steps
// finish in. A step that counted a sequence's workers behind and then
// was slow after unlocking (its log records, its update log write)
// published that count after a later step dropped the sequence: the
// dropped sequence's gauge came back and stayed (no step speaks of it
// again), and PrismEmbeddingWorkersBehind paged for a model no longer
// there. Concurrent steps also lost each other's counts (each cloned
// the map the other had not stored yet).
func TestBehindGaugeFollowsSequencerOrder(t *testing.T) {
	h := blockingHandler{at: "slow", entered: make(chan struct{}), release: make(chan struct{})}
	d := newUpdateDriver(newSequencer(time.Now(), time.Second, 0, 0, 0), time.Now, slog.New(h), time.Second, 0, nil)
	done := make(chan struct{})
	go func() {
		defer close(done)
		d.step(func(time.Time) {
			d.seq.send(message{Type: msgLog, Level: slog.LevelInfo, Text: "slow"})
			d.seq.send(message{Type: msgBehind, Model: "m", Behind: 1})
		})
	}()
	<-h.entered
	// The sequence is dropped by a later step.
	d.step(func(time.Time) { d.seq.send(message{Type: msgBehind, Model: "m", Behind: -1}) })
	close(h.release)
	<-done
	if p := d.behindN.Load(); p != nil {
		if n, ok := (*p)["m"]; ok {
			t.Fatalf("behind gauge of the dropped sequence m = %d after the drop, want none", n)
		}
	}
}
