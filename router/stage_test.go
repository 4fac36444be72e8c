package router

import (
	"context"
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

// TestStageShardedCriticalPath: a sharded micro-batch's stages are those
// of the shard whose part reached the dense worker last. Shard 0's part
// came first and its dense stage (48 ms) is mostly its wait for shard
// 2's, whose lookup took 40 ms: recorded as shard 0's (the times taken
// before), a starved embedding shard read as a slow dense tier.
func TestStageShardedCriticalPath(t *testing.T) {
	r := testRouter(Options{MicroBatch: 100})
	r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{Id: "gpu", Role: prismv1.Role_ROLE_DENSE, Addr: "dense:a", Models: []string{"m"}, Healthy: true}})
	early := &prismv1.StageTimes{LookupUs: 500, EncodeUs: 100, TransferUs: 300, DenseUs: 48000}
	middle := &prismv1.StageTimes{LookupUs: 5000, EncodeUs: 100, TransferUs: 300, DenseUs: 43000}
	last := &prismv1.StageTimes{LookupUs: 40000, EncodeUs: 100, TransferUs: 300, DenseUs: 2000}
	for k, times := range []*prismv1.StageTimes{early, middle, last} {
		announceShard(t, r, string(rune('a'+k)), &shardCN{times: times}, k, 3, 0)
	}
	if _, err := r.Recommend(context.Background(), request(10)); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		stage string
		want  float64 // seconds
	}{{"lookup", 0.040}, {"dense", 0.002}, {"encode", 0.0001}, {"transfer", 0.0003}} {
		var m dto.Metric
		if err := r.m.stages.WithLabelValues(c.stage).(prometheus.Histogram).Write(&m); err != nil {
			t.Fatal(err)
		}
		if h := m.GetHistogram(); h.GetSampleCount() != 1 || h.GetSampleSum() < c.want*0.999 || h.GetSampleSum() > c.want*1.001 {
			t.Errorf("stage %s: %d observations summing %v s, want one of %v s (the last part's)", c.stage, h.GetSampleCount(), h.GetSampleSum(), c.want)
		}
	}
}
