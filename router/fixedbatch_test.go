package router

import (
	"context"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
)

func TestFixedBatches(t *testing.T) {
	for _, c := range []struct {
		n, b int
		want [][2]int
	}{
		{1, 4, [][2]int{{0, 1}}},
		{4, 4, [][2]int{{0, 4}}},
		{13, 4, [][2]int{{0, 4}, {4, 8}, {8, 12}, {12, 13}}},
		{270, 256, [][2]int{{0, 256}, {256, 270}}},
	} {
		if got := fixedBatches(c.n, c.b); !slices.Equal(got, c.want) {
			t.Errorf("fixedBatches(%d, %d) = %v, want %v", c.n, c.b, got, c.want)
		}
	}
}

// padFeatures repeats the last candidate of every input (values, ids,
// weights of any width) and leaves the original untouched.
func TestPadFeatures(t *testing.T) {
	f := &prismv1.Features{Inputs: []*prismv1.Input{
		{Name: "packed", Ids: []int64{1, 2, 3, 4, 5, 6}},  // 2 per candidate
		{Name: "dense", Values: []float32{0.5, 1.5, 2.5}}, // 1 per candidate
		{Name: "bag", Ids: []int64{7, 8, 9}, Weights: []float32{1, 2, 3}},
	}}
	got, err := padFeatures(f, 3, 5)
	if err != nil {
		t.Fatal(err)
	}
	want := []*prismv1.Input{
		{Name: "packed", Ids: []int64{1, 2, 3, 4, 5, 6, 5, 6, 5, 6}},
		{Name: "dense", Values: []float32{0.5, 1.5, 2.5, 2.5, 2.5}},
		{Name: "bag", Ids: []int64{7, 8, 9, 9, 9}, Weights: []float32{1, 2, 3, 3, 3}},
	}
	for i, in := range got.GetInputs() {
		w := want[i]
		if in.GetName() != w.Name || !slices.Equal(in.GetIds(), w.Ids) || !slices.Equal(in.GetValues(), w.Values) || !slices.Equal(in.GetWeights(), w.Weights) {
			t.Errorf("input %d: %v, want %v", i, in, w)
		}
	}
	if !slices.Equal(f.Inputs[0].Ids, []int64{1, 2, 3, 4, 5, 6}) || len(f.Inputs[1].Values) != 3 {
		t.Error("padFeatures changed its input")
	}
	if same, _ := padFeatures(f, 3, 3); same != f {
		t.Error("a full micro-batch was copied")
	}
	for _, m := range []int{0, 6} {
		if _, err := padFeatures(f, m, 5); err == nil {
			t.Errorf("padding %d candidates to 5 accepted", m)
		}
	}
}

// The registry believes a fixed batch only in range.
func TestRegistryFixedBatch(t *testing.T) {
	for _, c := range []struct {
		announced int64
		want      int
	}{{0, 0}, {-4, 0}, {4, 4}, {maxFixedBatch, maxFixedBatch}, {maxFixedBatch + 1, 0}} {
		reg := NewRegistry(time.Second, nil)
		if _, err := reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{
			Id: "e1", Role: prismv1.Role_ROLE_EMBEDDING, Addr: "127.0.0.1:1", Models: []string{"m"}, Healthy: true,
			FixedBatch: map[string]int64{"m": c.announced}}}); err != nil {
			t.Fatal(err)
		}
		if got := reg.FixedBatch("m"); got != c.want {
			t.Errorf("announced %d: FixedBatch %d, want %d", c.announced, got, c.want)
		}
		if got := reg.FixedBatch("other"); got != 0 {
			t.Errorf("another model: %d", got)
		}
	}
}

// onlyInputs keeps the inputs a shard reads, in the request's order,
// and passes everything when the shard names none.
func TestOnlyInputs(t *testing.T) {
	f := &prismv1.Features{Inputs: []*prismv1.Input{{Name: "a"}, {Name: "b"}, {Name: "c"}}}
	names := func(f *prismv1.Features) (out []string) {
		for _, in := range f.GetInputs() {
			out = append(out, in.GetName())
		}
		return out
	}
	if got := names(onlyInputs(f, []string{"c", "a", "x"})); !slices.Equal(got, []string{"a", "c"}) {
		t.Errorf("onlyInputs: %v", got)
	}
	if onlyInputs(f, nil) != f {
		t.Error("no inputs named: the features were copied")
	}
	if onlyInputs(nil, []string{"a"}) != nil {
		t.Error("nil features (no context) became some")
	}
}

// TestFixedBatchAdmission: admission predicts a fixed-batch model's
// requests in the samples its workers run (each micro-batch padded to
// the batch), the unit its rate is measured in. Counted as the client's
// candidates, a request of 4 behind another of 4, at batch 64, was
// predicted to take 8 of the 64-sample batches' samples at the
// measured rate, a sixteenth of the two batches it waits for.
func TestFixedBatchAdmission(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cn := &fakeCN{gate: make(chan struct{})}
		release := sync.OnceFunc(func() { close(cn.gate) })
		held := make(chan error, 1)
		defer func() { // a failure still lets the backlog go, and waits for it
			release()
			<-held
		}()
		r := testRouter(Options{})
		t.Cleanup(r.Close)
		addr := startCN(t, cn)
		r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{Id: "cpu", Role: prismv1.Role_ROLE_EMBEDDING, Addr: addr, Models: []string{"m"}, Healthy: true, FixedBatch: map[string]int64{"m": 64}}})
		r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{Id: "gpu", Role: prismv1.Role_ROLE_DENSE, Addr: "dense:a", Models: []string{"m"}, Healthy: true}})
		mp := r.preds.get("m")
		mp.rate = 6400 // a batch of 64: 10 ms
		go func() { _, err := r.Recommend(context.Background(), request(4)); held <- err }()
		for cn.running.Load() == 0 {
			time.Sleep(time.Millisecond)
		}
		// Two batches, the backlog's and its own: 20 ms, past 15 ms.
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Millisecond)
		defer cancel()
		_, err := r.Recommend(ctx, request(4))
		if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "predicted to finish in 20.0 ms") {
			t.Fatalf("4 candidates at batch 64 behind another 4: %v, want ResourceExhausted predicting 20 ms", err)
		}
		release()
		if err := <-held; err != nil {
			t.Fatal(err)
		}
		held <- nil
		if got := mp.inflight.Load(); got != 0 {
			t.Fatalf("%d samples of the model in flight after every answer", got)
		}
	})
}
