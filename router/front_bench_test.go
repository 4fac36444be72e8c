package router

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/internal/serve"
)

// kaggleRequest is a dlrm-kaggle-shaped request of n candidates: 13
// dense features and 26 categorical ids per candidate, drawn from rows
// of millions (as loadgen sends them).
func kaggleRequest(n int) *prismv1.RecommendRequest {
	rng := rand.New(rand.NewPCG(1, 2))
	dense := make([]float32, 13*n)
	for i := range dense {
		dense[i] = rng.Float32() * 10
	}
	inputs := []*prismv1.Input{{Name: "cat_0", Ids: make([]int64, n)}}
	for c := 1; c < 26; c++ {
		inputs = append(inputs, &prismv1.Input{Name: fmt.Sprintf("cat_%d", c), Ids: make([]int64, n)})
	}
	for _, in := range inputs {
		for i := range in.Ids {
			in.Ids[i] = rng.Int64N(10_000_000)
		}
	}
	inputs = append(inputs, &prismv1.Input{Name: "dense", Values: dense})
	return &prismv1.RecommendRequest{Model: "m", NumCandidates: int32(n), Candidates: &prismv1.Features{Inputs: inputs}}
}

// BenchmarkRecommendFront: a Recommend of 270 dlrm-kaggle-shaped
// candidates through the router's gRPC server and through its HTTP/JSON
// endpoint (serve --http-addr), one at a time over loopback, client and
// server in this process, against a fake embedding tier that answers at
// once: what the front end itself costs a request (decoding, encoding,
// the transport), not the model. Plaintext both (TLS costs both alike).
// The HTTP/JSON request is encoded once, before the loop; gRPC's client
// encodes its (binary) request each time. http-json-protojson is the
// same route decoded by protojson alone (DecodeRecommendJSON's
// baseline).
//
//	go test ./router -run '^$' -bench RecommendFront -benchtime 2000x -count 3
func BenchmarkRecommendFront(b *testing.B) {
	r := newRouter(&testing.T{}, Options{MicroBatch: 512}, &fakeCN{})
	s, err := serve.New("router", serve.Options{Addr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", MetricsAddr: "off", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	prismv1.RegisterRecommenderServer(s.GRPC, r)
	s.HandleJSON(r.RecommendJSONRoute())
	// The same route decoded by protojson alone, the baseline of
	// DecodeRecommendJSON.
	slow := r.RecommendJSONRoute()
	slow.Path, slow.Decode = "/v1/recommend-protojson", nil
	s.HandleJSON(slow)
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx) }()
	defer func() { cancel(); <-served }()
	req := kaggleRequest(270)

	b.Run("grpc", func(b *testing.B) {
		conn, err := grpc.NewClient(s.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			b.Fatal(err)
		}
		defer conn.Close()
		c := prismv1.NewRecommenderClient(conn)
		b.ReportAllocs()
		for b.Loop() {
			resp, err := c.Recommend(context.Background(), req)
			if err != nil || len(resp.GetScores()) != 270 {
				b.Fatalf("%v, %d scores", err, len(resp.GetScores()))
			}
		}
		b.ReportMetric(float64(proto.Size(req)), "req-bytes")
	})
	for _, path := range []string{"/v1/recommend", "/v1/recommend-protojson"} {
		name := "http-json"
		if path != "/v1/recommend" {
			name = "http-json-protojson"
		}
		b.Run(name, func(b *testing.B) {
			client := &http.Client{}
			url := "http://" + s.HTTPAddr() + path
			// Encoded once: the server's side is measured (a client
			// encodes its request once, however it does).
			body, err := protojson.Marshal(req)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				resp, err := client.Post(url, "application/json", bytes.NewReader(body))
				if err != nil {
					b.Fatal(err)
				}
				out, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				var got prismv1.RecommendResponse
				if resp.StatusCode != http.StatusOK || protojson.Unmarshal(out, &got) != nil || len(got.GetScores()) != 270 {
					b.Fatalf("status %d: %s", resp.StatusCode, out)
				}
			}
			b.ReportMetric(float64(len(body)), "req-bytes")
		})
	}
}
