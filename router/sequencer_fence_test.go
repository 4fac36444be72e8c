package router

import (
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/prism-serve/prism/api/prismv1"
)

// TestStamped: a replayed entry goes out with the replaying sequencer's
// epoch and every other field as logged (a shallow copy), the log's
// entry untouched; a sequencer of no known epoch sends it as logged.
func TestStamped(t *testing.T) {
	entry := &prismv1.ApplyUpdateRequest{Update: &prismv1.UpdateRequest{Model: "m", Table: "t", Ids: []int64{1}, Rows: make([]byte, 4)},
		Seq: 7, NumberOnly: true, NumberFrom: 3, SkippedTables: []string{"u"}, Sequence: "m#shard1@00aa", Fresh: true, Epoch: 4}
	logged := proto.Clone(entry).(*prismv1.ApplyUpdateRequest)
	for _, tc := range []struct {
		epoch uint64
		same  bool // the entry itself is sent
	}{{0, true}, {4, true}, {9, false}} {
		s := &sequencer{epoch: tc.epoch}
		got := s.stamped(entry)
		if (got == entry) != tc.same {
			t.Errorf("epoch %d: sent the logged entry itself: %v, want %v", tc.epoch, got == entry, tc.same)
		}
		want := proto.Clone(logged).(*prismv1.ApplyUpdateRequest)
		if tc.epoch != 0 {
			want.Epoch = tc.epoch
		}
		if !proto.Equal(got, want) {
			t.Errorf("epoch %d: sent %v, want %v", tc.epoch, got, want)
		}
		if !proto.Equal(entry, logged) {
			t.Fatalf("epoch %d: the logged entry changed: %v", tc.epoch, entry)
		}
	}
}
