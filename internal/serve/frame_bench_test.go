package serve

import (
	"context"
	"crypto/tls"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/peer"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/internal/auth"
)

// frameBytes is the cut-tensor frame the embedding worker sends per
// micro-batch of 512 samples (dlrm-kaggle).
const frameBytes = 463 << 10

// scoreEcho is a dense tier that answers at once: what is measured is
// the hop, not the model.
type scoreEcho struct {
	prismv1.UnimplementedDenseTierServer
	scores []float32
	mu     sync.Mutex
	suite  string // the TLS version, suite and ALPN protocol seen
}

func (e *scoreEcho) Score(ctx context.Context, r *prismv1.ScoreRequest) (*prismv1.ScoreResponse, error) {
	if len(r.Tensors) != frameBytes {
		return nil, fmt.Errorf("frame of %d bytes", len(r.Tensors))
	}
	if p, ok := peer.FromContext(ctx); ok {
		if ti, ok := p.AuthInfo.(credentials.TLSInfo); ok {
			e.mu.Lock()
			e.suite = fmt.Sprintf("%s %s %s", tls.VersionName(ti.State.Version), tls.CipherSuiteName(ti.State.CipherSuite), ti.State.NegotiatedProtocol)
			e.mu.Unlock()
		}
	}
	return &prismv1.ScoreResponse{Scores: e.scores}, nil
}

// hop is one embedding-to-dense connection over real loopback TCP, as
// the two tiers run it (internal/serve's server options, the embedding
// worker's dial options), with or without mutual TLS.
type hop struct {
	client prismv1.DenseTierClient
	echo   *scoreEcho
	server *Server
	close  func()
}

type hopConfig struct {
	tls bool
	// server and dial add options after the tiers' own.
	server []grpc.ServerOption
	dial   []grpc.DialOption
	// client, when set, makes the client's credentials from its TLS
	// configuration.
	client func(*tls.Config) credentials.TransportCredentials
	// clientRole is the client's certificate (default embedding).
	clientRole auth.Role
}

func newHop(tb testing.TB, dir string, hc hopConfig) *hop {
	tb.Helper()
	o := Options{Addr: "127.0.0.1:0", MetricsAddr: "off", Logger: quiet()}
	clientCreds := insecure.NewCredentials()
	if hc.tls {
		sc, err := auth.ServerTLS(auth.FilesFor(dir, auth.Dense), auth.ServerTLSOptions{})
		if err != nil {
			tb.Fatal(err)
		}
		role := hc.clientRole
		if role == "" {
			role = auth.Embedding
		}
		o.TLS = sc
		// The tiers' own client credentials (authflag).
		if clientCreds, err = auth.ClientCredentials(auth.FilesFor(dir, role), auth.Dense); err != nil {
			tb.Fatal(err)
		}
		if hc.client != nil {
			cc, err := auth.ClientTLS(auth.FilesFor(dir, role), auth.Dense)
			if err != nil {
				tb.Fatal(err)
			}
			clientCreds = hc.client(cc)
		}
	}
	s, err := New("dense", o, hc.server...)
	if err != nil {
		tb.Fatal(err)
	}
	echo := &scoreEcho{scores: make([]float32, 512)}
	prismv1.RegisterDenseTierServer(s.GRPC, echo)
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx) }()
	// The embedding worker's own dial options (cpuserve/server).
	opts := append([]grpc.DialOption{
		grpc.WithTransportCredentials(clientCreds),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20), grpc.MaxRetryRPCBufferSize(0)),
	}, append(DialOptions(), hc.dial...)...)
	conn, err := grpc.NewClient(s.Addr(), opts...)
	if err != nil {
		tb.Fatal(err)
	}
	return &hop{client: prismv1.NewDenseTierClient(conn), echo: echo, server: s, close: func() { conn.Close(); cancel(); <-served }}
}

// cpuTime is the process's user and system CPU time.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkScoreFrame sends 463 KB cut-tensor frames over one loopback
// connection, plaintext and mutual TLS, and each transport change under
// test, in one run (compare within it: the machine's load drifts). Both
// ends are in this process, so cpu-ns/op is the CPU the hop costs the
// two tiers together per frame, what limits throughput when every tier
// shares the cores; 4 frames are in flight, as from an embedding
// worker's concurrent lookups.
//
//	go test ./internal/serve -run '^$' -bench ScoreFrame -benchtime 400x -count 3
func BenchmarkScoreFrame(b *testing.B) {
	dir := b.TempDir()
	if err := auth.InitCerts(dir, auth.CertOptions{}); err != nil {
		b.Fatal(err)
	}
	frame := make([]byte, frameBytes)
	for i := range frame {
		frame[i] = byte(i * 7)
	}
	for _, v := range frameVariants() {
		b.Run(v.name, func(b *testing.B) {
			h := newHop(b, dir, v.hopConfig)
			defer h.close()
			ctx := context.Background()
			req := &prismv1.ScoreRequest{Model: "m", Version: 1, NumSamples: 512, Tensors: frame}
			// Warm: connection, windows, record sizes, pools.
			for range 20 {
				if _, err := h.client.Score(ctx, req); err != nil {
					b.Fatal(err)
				}
			}
			b.SetBytes(frameBytes)
			b.SetParallelism(2) // x GOMAXPROCS (2 here): 4 in flight
			cpu0 := cpuTime()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := h.client.Score(ctx, req); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.StopTimer()
			b.ReportMetric(float64(cpuTime()-cpu0)/float64(b.N), "cpu-ns/op")
			h.echo.mu.Lock()
			if h.echo.suite != "" {
				b.Logf("negotiated: %s", h.echo.suite)
			}
			h.echo.mu.Unlock()
		})
	}
}

type frameVariant struct {
	name string
	hopConfig
}

// frameVariants are the transports compared: plaintext and mTLS as the
// tiers run them, then each change tried.
func frameVariants() []frameVariant {
	return []frameVariant{
		{"plain", hopConfig{}},
		{"tls", hopConfig{tls: true}},
		// Per-syscall cost: plaintext written 16 KiB (a TLS record) and
		// 256 KiB at a time instead of gRPC's 32 KiB.
		{"plain-wbuf16k", hopConfig{dial: []grpc.DialOption{grpc.WithWriteBufferSize(16 << 10)}}},
		{"plain-wbuf256k", hopConfig{dial: []grpc.DialOption{grpc.WithWriteBufferSize(256 << 10)}}},
		{"tls-wbuf256k", hopConfig{tls: true, dial: []grpc.DialOption{grpc.WithWriteBufferSize(256 << 10)}}},
		{"tls-shared-wbuf", hopConfig{tls: true, dial: []grpc.DialOption{grpc.WithSharedWriteBuffer(true)}}},
		// crypto/tls's own connection, each 16 KiB record its own
		// write (auth's client credentials write a Write's records at once).
		{"tls-per-record", hopConfig{tls: true, client: func(c *tls.Config) credentials.TransportCredentials {
			return credentials.NewTLS(c)
		}}},
	}
}

// BenchmarkScoreFrameTLSWrites: 463 KB frames over plaintext, mutual TLS
// as the tiers run it (auth's client credentials: each Write's records
// in one write) and crypto/tls's own connection (a write per record),
// the three connections up at once and sent chunks of 40 frames in turn
// (4 in flight), so the machine's drift falls on all three alike;
// process CPU per frame, both ends together, and the ratios.
//
//	go test ./internal/serve -run '^$' -bench ScoreFrameTLSWrites -benchtime 800x -count 5
func BenchmarkScoreFrameTLSWrites(b *testing.B) {
	dir := b.TempDir()
	if err := auth.InitCerts(dir, auth.CertOptions{}); err != nil {
		b.Fatal(err)
	}
	frame := make([]byte, frameBytes)
	for i := range frame {
		frame[i] = byte(i * 7)
	}
	perRecord := func(c *tls.Config) credentials.TransportCredentials { return credentials.NewTLS(c) }
	var hops []*hop
	for _, hc := range []hopConfig{{}, {tls: true}, {tls: true, client: perRecord}} {
		h := newHop(b, dir, hc)
		defer h.close()
		hops = append(hops, h)
	}
	ctx := context.Background()
	req := &prismv1.ScoreRequest{Model: "m", Version: 1, NumSamples: 512, Tensors: frame}
	send := func(h *hop, n int) {
		var wg sync.WaitGroup
		for w := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for k := w; k < n; k += 4 {
					if _, err := h.client.Score(ctx, req); err != nil {
						b.Error(err)
						return
					}
				}
			}()
		}
		wg.Wait()
	}
	for _, h := range hops {
		send(h, 20) // warm: connections, windows, record sizes, pools
	}
	var spent [3]time.Duration
	const chunk = 40
	b.SetBytes(frameBytes)
	b.ResetTimer()
	for done := 0; done < b.N; done += chunk {
		for i, h := range hops {
			cpu0 := cpuTime()
			send(h, min(chunk, b.N-done))
			spent[i] += cpuTime() - cpu0
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(spent[0])/float64(b.N), "plain-cpu-ns/op")
	b.ReportMetric(float64(spent[1])/float64(b.N), "tls-cpu-ns/op")
	b.ReportMetric(float64(spent[2])/float64(b.N), "per-record-cpu-ns/op")
	b.ReportMetric(float64(spent[1])/float64(spent[2]), "tls/per-record")
	b.ReportMetric(float64(spent[1])/float64(spent[0]), "tls/plain")
}
