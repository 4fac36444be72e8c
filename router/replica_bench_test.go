package router

import (
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/prism-serve/prism/api/prismv1"
)

// BenchmarkUpdateLogCopy: a following router copies a holder's update
// log of 256 MiB (1024 updates of 256 KiB, one model: the default
// --update-log-bytes) over TCP on loopback, plaintext, from nothing:
// how long a router that starts following holds an incomplete copy.
// Run:
//
//	go test -run '^$' -bench UpdateLogCopy -benchtime 3x ./router/
func BenchmarkUpdateLogCopy(b *testing.B) {
	r := New(Options{}, nil)
	defer r.Close()
	var log []*prismv1.ApplyUpdateRequest
	for seq := int64(1); seq <= 1024; seq++ {
		log = append(log, bigEntry("m", seq, 256<<10))
	}
	r.upd.seq.restore("m", 1024, 1024, 0, log)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	s := grpc.NewServer(grpc.MaxSendMsgSize(64<<20), grpc.MaxRecvMsgSize(64<<20))
	prismv1.RegisterRegistryServer(s, r.Reg)
	go s.Serve(lis)
	defer s.Stop()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	b.SetBytes(256 << 20)
	b.ResetTimer()
	for range b.N {
		var c replica
		if err := c.pull(b.Context(), conn, time.Minute, 64); err != nil {
			b.Fatal(err)
		}
		if _, after := c.after(); after["m"] != 1024 {
			b.Fatalf("copy ends at %d", after["m"])
		}
	}
	b.ReportMetric(b.Elapsed().Seconds()/float64(b.N), "s/copy")
}
