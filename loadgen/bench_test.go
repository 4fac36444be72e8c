package loadgen

import (
	"context"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/prism-serve/prism/models"
)

func kaggleSig(b *testing.B) models.Signature {
	p, err := models.Lookup("dlrm-kaggle")
	if err != nil {
		b.Fatal(err)
	}
	c, err := p.Resolve(models.ScaleOptions{})
	if err != nil {
		b.Fatal(err)
	}
	return c.Signature()
}

// BenchmarkBuildRequest: drawing and marshalling one dlrmv2-sized
// request of dlrm-kaggle inputs (27 inputs, about 270 candidates).
func BenchmarkBuildRequest(b *testing.B) {
	q, err := NewRequests(RequestOptions{Model: "m", Sig: kaggleSig(b), Seed: 1})
	if err != nil {
		b.Fatal(err)
	}
	var samples int64
	for b.Loop() {
		req, err := q.Next()
		if err != nil {
			b.Fatal(err)
		}
		if _, err := proto.Marshal(req); err != nil {
			b.Fatal(err)
		}
		samples += int64(req.NumCandidates)
	}
	b.ReportMetric(float64(samples)/b.Elapsed().Seconds(), "samples/s")
}

// BenchmarkGeneratorLoopback: whole runs against a Fake that answers at
// once, over loopback gRPC in this process (server cost included).
func BenchmarkGeneratorLoopback(b *testing.B) {
	sig := kaggleSig(b)
	addr, stop, err := ServeFake("127.0.0.1:0", &Fake{})
	if err != nil {
		b.Fatal(err)
	}
	defer stop()
	s := dialAddr(b, addr)
	var sum *Summary
	for b.Loop() {
		q, _ := NewRequests(RequestOptions{Model: "m", Sig: sig, Seed: 1})
		sum, err = Run(context.Background(), Options{Clients: 8, Duration: 2 * time.Second, MaxRequests: 1e6}, q, s)
		if err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(sum.RPS, "req/s")
	b.ReportMetric(sum.SamplesPS, "samples/s")
	b.ReportMetric(sum.GeneratorCPU/sum.DurationS, "cores")
}
