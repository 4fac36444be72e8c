package router

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prism-serve/prism/api/prismv1"
)

// BenchmarkPick1000Workers is one Pick and its release with 1,000
// embedding workers registered: spread over 10 models (100 serve the
// model picked), and all serving one model.
func BenchmarkPick1000Workers(b *testing.B) {
	for _, models := range []int{10, 1} {
		b.Run(fmt.Sprintf("models=%d", models), func(b *testing.B) {
			reg := NewRegistry(time.Second, nil)
			for i := range 1000 {
				reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{
					Id: fmt.Sprintf("w%04d", i), Addr: fmt.Sprintf("10.0.%d.%d:1", i/250, i%250), Role: prismv1.Role_ROLE_EMBEDDING,
					Models: []string{fmt.Sprintf("m%d", i%models)}, Healthy: true, Outstanding: int64(i % 7),
				}})
			}
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				_, release, err := reg.Pick(prismv1.Role_ROLE_EMBEDDING, "m0", 1, nil)
				if err != nil {
					b.Fatal(err)
				}
				release()
			}
		})
	}
}

// BenchmarkPickPaired is the embedding pick of an unsharded
// micro-batch as the router makes it (PickEmbedding, Paired: of a
// content some dense worker serves) among 500 embedding and 500 dense
// workers announcing content, against the plain Pick of the same
// workers: what pairing by content costs each micro-batch.
func BenchmarkPickPaired(b *testing.B) {
	reg := NewRegistry(time.Second, nil)
	content := map[string]string{"m0": "0123456789abcdef"}
	for i := range 1000 {
		role := prismv1.Role_ROLE_EMBEDDING
		if i%2 == 1 {
			role = prismv1.Role_ROLE_DENSE
		}
		reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{
			Id: fmt.Sprintf("w%04d", i), Addr: fmt.Sprintf("10.0.%d.%d:1", i/250, i%250), Role: role,
			Models: []string{"m0"}, Healthy: true, Outstanding: int64(i % 7), Content: content,
		}})
	}
	for _, c := range []struct {
		name string
		want EmbeddingWant
	}{{"plain", EmbeddingWant{}}, {"paired", EmbeddingWant{Paired: true}}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for range b.N {
				_, release, err := reg.PickEmbedding("m0", 1, nil, c.want)
				if err != nil {
					b.Fatal(err)
				}
				release()
			}
		})
	}
}

// BenchmarkPickShards is one PickShards (a sharded micro-batch's
// replicas) and its release: 3 shards of 2 replicas all of one
// sharding (the path every micro-batch takes), and the same with a
// second sharding's 3x2 workers live beside them (a reshard rolling
// out: each sharding is tried, and the complete one at the least load
// taken).
func BenchmarkPickShards(b *testing.B) {
	for _, shardings := range []int{1, 2} {
		b.Run(fmt.Sprintf("shardings=%d", shardings), func(b *testing.B) {
			reg := NewRegistry(time.Second, nil)
			for f := range shardings {
				for i := range 6 {
					reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{
						Id: fmt.Sprintf("w%d-%d", f, i), Addr: fmt.Sprintf("10.0.%d.%d:1", f, i), Role: prismv1.Role_ROLE_EMBEDDING,
						Models: []string{"m"}, Healthy: true, Outstanding: int64(i % 3),
						Shards: map[string]*prismv1.ShardRef{"m": {Shard: int32(i % 3), Shards: 3, Sharding: fmt.Sprintf("%016x", f+1)}},
					}})
				}
			}
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				_, release, err := reg.PickShards("m", 3, 1, nil)
				if err != nil {
					b.Fatal(err)
				}
				release()
			}
		})
	}
}
