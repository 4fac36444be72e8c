package server_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/cpuserve/storecopy"
)

// chunkSink is the server side of a Snapshot stream held in memory: it
// keeps every chunk the handler sends.
type chunkSink struct {
	grpc.ServerStream
	ctx    context.Context
	chunks []*prismv1.SnapshotChunk
}

func (s *chunkSink) Context() context.Context { return s.ctx }

func (s *chunkSink) Send(c *prismv1.SnapshotChunk) error {
	s.chunks = append(s.chunks, proto.Clone(c).(*prismv1.SnapshotChunk))
	return nil
}

// checkSnapshot checks chunks as prism store copy's receiver reads them:
// the manifest first, then every file in order, each either sent whole
// (contiguous chunks, the last with eof and the CRC-32C of the bytes
// sent) or marked reused, and reused only where the request's have named
// the same name, size and checksum. It returns each file's checksum by
// name, or what a receiver would refuse.
func checkSnapshot(req *prismv1.SnapshotRequest, chunks []*prismv1.SnapshotChunk) (map[string]*prismv1.SnapshotFile, error) {
	if len(chunks) == 0 || chunks[0].GetManifest() == nil {
		return nil, fmt.Errorf("a snapshot stream of %d chunks without its manifest first", len(chunks))
	}
	files := chunks[0].GetManifest().GetFiles()
	have := map[string][]*prismv1.SnapshotFile{}
	for _, h := range req.GetHave() {
		have[h.GetName()] = append(have[h.GetName()], h)
	}
	sums := make(map[string]*prismv1.SnapshotFile, len(files))
	next := 0 // the file whose chunks come now
	var off int64
	var sum uint32
	for _, c := range chunks[1:] {
		if c.GetManifest() != nil {
			return nil, errors.New("a second manifest")
		}
		if int(c.GetFile()) != next || next >= len(files) {
			return nil, fmt.Errorf("a chunk of file %d while file %d of %d is due", c.GetFile(), next, len(files))
		}
		f := files[next]
		if c.GetOffset() != off {
			return nil, fmt.Errorf("%s: a chunk at %d, want %d", f.GetName(), c.GetOffset(), off)
		}
		if c.GetReused() {
			if off != 0 || len(c.GetData()) != 0 || !c.GetEof() {
				return nil, fmt.Errorf("%s: reused after %d bytes, or with data, or without eof", f.GetName(), off)
			}
			ok := false
			for _, h := range have[f.GetName()] {
				ok = ok || (h.GetSize() == f.GetSize() && h.GetCrc32C() == c.GetCrc32C())
			}
			if !ok {
				return nil, fmt.Errorf("%s (%d bytes, crc %08x) marked reused; the caller named %v", f.GetName(), f.GetSize(), c.GetCrc32C(), have[f.GetName()])
			}
			sums[f.GetName()] = &prismv1.SnapshotFile{Name: f.GetName(), Size: f.GetSize(), Crc32C: c.GetCrc32C()}
			next++
			continue
		}
		sum = storecopy.CRC32C(sum, c.GetData())
		off += int64(len(c.GetData()))
		if !c.GetEof() {
			continue
		}
		if off != f.GetSize() || c.GetCrc32C() != sum {
			return nil, fmt.Errorf("%s: %d bytes with crc %08x sent, listed with %d bytes, crc %08x said", f.GetName(), off, sum, f.GetSize(), c.GetCrc32C())
		}
		sums[f.GetName()] = &prismv1.SnapshotFile{Name: f.GetName(), Size: f.GetSize(), Crc32C: sum}
		next, off, sum = next+1, 0, 0
	}
	if next != len(files) {
		return nil, fmt.Errorf("the stream ended at file %d of %d", next, len(files))
	}
	return sums, nil
}

// FuzzSnapshotRequest sends EmbeddingTier.Snapshot requests built from arbitrary
// bytes (the files the caller says it holds, the rate) to the fuzz
// fixture's worker: a documented status, never a panic; when it answers,
// a stream prism store copy would take, in which no file is skipped as
// reused unless the caller named it with its size and checksum; and a
// second snapshot right after is not refused as busy (the checkpoint of
// the first is gone whichever way it ended).
func FuzzSnapshotRequest(f *testing.F) {
	fx := fuzzSetup(f)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	first := &chunkSink{ctx: ctx}
	if err := fx.srv.Snapshot(&prismv1.SnapshotRequest{}, first); err != nil {
		f.Fatal(err)
	}
	sums, err := checkSnapshot(&prismv1.SnapshotRequest{}, first.chunks)
	if err != nil {
		f.Fatal(err)
	}
	var all []*prismv1.SnapshotFile // every file of the checkpoint, with its checksum
	for _, s := range sums {
		all = append(all, s)
	}
	slices.SortFunc(all, func(a, b *prismv1.SnapshotFile) int { return strings.Compare(a.Name, b.Name) })
	if len(all) < 2 {
		f.Fatalf("a checkpoint of %d files", len(all))
	}
	wrongSum := proto.Clone(all[0]).(*prismv1.SnapshotFile)
	wrongSum.Crc32C ^= 1
	wrongSize := proto.Clone(all[1]).(*prismv1.SnapshotFile)
	wrongSize.Size++
	for _, r := range []*prismv1.SnapshotRequest{
		{},
		{Have: all},                    // every file kept: nothing sent
		{Have: all[:1], Rate: 1 << 30}, // one kept, paced
		{Have: []*prismv1.SnapshotFile{wrongSum, wrongSize}},         // a changed file of the same size, a file grown
		{Have: []*prismv1.SnapshotFile{wrongSum, wrongSize, all[0]}}, // the same name twice, one wrong
		{Have: []*prismv1.SnapshotFile{{Name: "../../../etc/passwd", Size: 1}, {Name: "copy-out-1/MANIFEST", Size: -1}, {Name: "", Size: 1 << 62}}},
		{Rate: storecopy.MinRate - 1},
		{Rate: -1},
		{Rate: 1 << 62},
	} {
		b, err := proto.Marshal(r)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var req prismv1.SnapshotRequest
		if err := proto.Unmarshal(b, &req); err != nil {
			t.Skip()
		}
		if r := req.GetRate(); r >= storecopy.MinRate && r < 256<<20 {
			// A rate the handler takes is run at 256 MiB/s: the pace is
			// the handler's to check, not this test's to wait out.
			req.Rate = 256 << 20
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		sink := &chunkSink{ctx: ctx}
		err := fx.srv.Snapshot(&req, sink)
		if c := status.Code(err); !documented(c) {
			t.Fatalf("status %v: %v", c, err)
		}
		if err == nil {
			if _, err := checkSnapshot(&req, sink.chunks); err != nil {
				t.Fatal(err)
			}
		}
		again := &chunkSink{ctx: ctx}
		if err := fx.srv.Snapshot(&prismv1.SnapshotRequest{Have: all}, again); err != nil {
			t.Fatalf("a snapshot after the fuzzed one: %v", err)
		}
	})
}
