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

// BenchmarkReadLogOutcomes: one heartbeat's page for a follower that is
// up to date, from a log of 200,000 one-row updates, with their
// outcomes (ModelLog.outcomes: one refused in every thousand, so 400
// runs) and without (a log restored with none known): what carrying the
// outcomes adds to the driver's lock hold per pull. Run:
//
//	go test -run '^$' -bench ReadLogOutcomes -benchtime 200x ./router/
func BenchmarkReadLogOutcomes(b *testing.B) {
	const n = 200_000
	for _, known := range []bool{false, true} {
		b.Run(map[bool]string{false: "none", true: "known"}[known], func(b *testing.B) {
			s := newSequencer(time.Unix(1000, 0), time.Second, 1<<40, 0, QuorumOne)
			log := make([]*prismv1.ApplyUpdateRequest, n)
			for i := range log {
				log[i] = &prismv1.ApplyUpdateRequest{Seq: int64(i + 1), Update: &prismv1.UpdateRequest{Model: "m", Table: "t", Ids: []int64{int64(i)}, Rows: make([]byte, 64)}}
			}
			s.restore("m", n, n, 0, log)
			if known {
				out := map[int64]int8{}
				for seq := int64(1); seq <= n; seq++ {
					out[seq] = 1
					if seq%1000 == 0 {
						out[seq] = -1
					}
				}
				s.restoreOutcomes("m", out)
			}
			after := map[string]int64{"m": n - 1}
			s.readLog(after, false, 16<<20) // the runs made once, after the restore
			b.ResetTimer()
			for range b.N {
				if models, _ := s.readLog(after, false, 16<<20); len(models["m"].GetEntries()) != 1 {
					b.Fatal("want the last entry")
				}
			}
		})
	}
}
