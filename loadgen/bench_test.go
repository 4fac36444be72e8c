package loadgen

import (
	"context"
	"testing"
	"time"

	"google.golang.org/grpc/encoding"
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

// BenchmarkSendMarshal: the generator's per-send cost of a pooled
// request of 270 candidates of dlrm-kaggle inputs up to gRPC's framing:
// the next envelope and its encoding, marshaled at every send as gRPC's
// proto codec does, or passed through as the bytes the pool was built
// with (premarshaled).
func BenchmarkSendMarshal(b *testing.B) {
	sig := kaggleSig(b)
	c := premarshaledCodec{proto: encoding.GetCodecV2("proto")}
	for _, pre := range []bool{false, true} {
		name := "marshal"
		if pre {
			name = "premarshaled"
		}
		b.Run(name, func(b *testing.B) {
			q, err := NewRequests(RequestOptions{Model: "m", Sig: sig, Candidates: Fixed(270), Seed: 1, Pool: 64})
			if err != nil {
				b.Fatal(err)
			}
			if err := q.Prepare(); err != nil {
				b.Fatal(err)
			}
			var bytes int64
			for b.Loop() {
				req, wire, err := q.nextSend()
				if err != nil {
					b.Fatal(err)
				}
				var msg any = req
				if pre {
					msg = wire
				}
				data, err := c.Marshal(msg)
				if err != nil {
					b.Fatal(err)
				}
				bytes += int64(data.Len())
				data.Free()
			}
			b.SetBytes(bytes / int64(b.N))
		})
	}
}

// BenchmarkGeneratorLoopbackPool: whole closed-loop runs over a pool of
// 512 requests of 270 candidates against a Fake in this process, sending
// marshaled at every send (a GRPCSender without Conn) or premarshaled.
// cores counts both sides.
func BenchmarkGeneratorLoopbackPool(b *testing.B) {
	sig := kaggleSig(b)
	addr, stop, err := ServeFake("127.0.0.1:0", &Fake{})
	if err != nil {
		b.Fatal(err)
	}
	defer stop()
	for _, pre := range []bool{false, true} {
		name := "marshal"
		if pre {
			name = "premarshaled"
		}
		b.Run(name, func(b *testing.B) {
			s := dialAddr(b, addr).(GRPCSender)
			if !pre {
				s.Conn = nil
			}
			var sum *Summary
			for b.Loop() {
				q, _ := NewRequests(RequestOptions{Model: "m", Sig: sig, Candidates: Fixed(270), Seed: 1, Pool: 512})
				if err := q.Prepare(); err != nil {
					b.Fatal(err)
				}
				sum, err = Run(context.Background(), Options{Clients: 8, Duration: 2 * time.Second, MaxRequests: 1e6}, q, s)
				if err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(sum.RPS, "req/s")
			b.ReportMetric(sum.GeneratorCPU/sum.DurationS, "cores")
			b.ReportMetric(sum.GeneratorCPU/float64(sum.OK)*1e6, "cpu-µs/req")
		})
	}
}
