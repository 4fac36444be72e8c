package router

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/prism-serve/prism/api/prismv1"
)

// TestStageWait: prism_router_stage_seconds{stage="wait"} is the part of
// the router's call its workers' stages do not cover (a worker paused
// or starved before its handler ran showed in no stage), never
// negative; the workers' stages are recorded as they timed them.
func TestStageWait(t *testing.T) {
	r := New(Options{}, nil)
	t.Cleanup(r.Close)
	sum := func(stage string) (float64, uint64) {
		var m dto.Metric
		if err := r.m.stages.WithLabelValues(stage).(prometheus.Histogram).Write(&m); err != nil {
			t.Fatal(err)
		}
		return m.GetHistogram().GetSampleSum(), m.GetHistogram().GetSampleCount()
	}
	times := &prismv1.StageTimes{DecodeUs: 100, LookupUs: 1000, EncodeUs: 200, TransferUs: 700, DenseUs: 2000}
	r.observe(times, 80*time.Millisecond) // 76 ms of it in no worker's stage
	r.observe(times, 3*time.Millisecond)  // clocks disagree: not below 0
	if s, n := sum("wait"); n != 2 || s < 0.0759 || s > 0.0761 {
		t.Errorf("wait: %d observations summing %v s, want 2 summing 0.076", n, s)
	}
	if s, n := sum("dense"); n != 2 || s < 0.0039 || s > 0.0041 {
		t.Errorf("dense: %d observations summing %v s, want 2 summing 0.004", n, s)
	}
	r.observe(nil, time.Second) // no times (a worker of an earlier release): nothing
	if _, n := sum("wait"); n != 2 {
		t.Errorf("wait observed %d times after a call without times, want 2", n)
	}
}
