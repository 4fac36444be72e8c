package server_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/cpuserve/store"
	"github.com/prism-serve/prism/cpuserve/storecopy"
)

// TestSnapshotCopy: a worker's Snapshot stream, received by prism store
// copy's code into another folder, is a store holding every model the
// worker serves at the version it serves, and the worker's store is
// left without the checkpoint's folder.
func TestSnapshotCopy(t *testing.T) {
	f := setup(t)
	open := func(req *prismv1.SnapshotRequest) (storecopy.Stream, error) {
		return f.client.Snapshot(context.Background(), req)
	}
	dst := t.TempDir()
	var chunks int
	res, err := storecopy.Receive(open, dst, storecopy.Options{Progress: func(done, total int64) { chunks++ }})
	if err != nil {
		t.Fatal(err)
	}
	if res.Files == 0 || res.Bytes == 0 || chunks == 0 {
		t.Fatalf("result %+v after %d chunks", res, chunks)
	}
	var got []string
	for _, m := range res.Models {
		got = append(got, m.Name)
		if m.Version < 1 || m.Diverged != 0 {
			t.Errorf("copy of %s: %+v", m.Name, m)
		}
	}
	want := f.srv.Models()
	slices.Sort(want)
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Fatalf("the copy holds %v; the worker serves %v", got, want)
	}
	s, err := store.Open(dst, &store.Options{HotBytes: -1, MustExist: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, ok := s.Swapped(); !ok {
		t.Fatal("the complete copy was not swapped in")
	}
	if held := s.Models(); !slices.Equal(slices.Sorted(slices.Values(held)), want) {
		t.Fatalf("the store after the swap holds %v", held)
	}
	// A pace that would hold the one copy at a time for hours, or none
	// at all, is bad input.
	for _, rate := range []int64{-1, 1, storecopy.MinRate - 1} {
		stream, err := f.client.Snapshot(context.Background(), &prismv1.SnapshotRequest{Rate: rate})
		if err == nil {
			_, err = stream.Recv()
		}
		if status.Code(err) != codes.InvalidArgument {
			t.Errorf("snapshot at rate %d: %v, want InvalidArgument", rate, err)
		}
	}
	// A second copy right after: the first's checkpoint is gone.
	if _, err := storecopy.Receive(open, t.TempDir(), storecopy.Options{}); err != nil {
		t.Fatalf("a second copy: %v", err)
	}
}

// cutStream passes on a Snapshot stream's chunks until left runs out,
// then fails as a dropped connection does.
type cutStream struct {
	storecopy.Stream
	left   int
	cancel context.CancelFunc
}

func (c *cutStream) Recv() (*prismv1.SnapshotChunk, error) {
	if c.left == 0 {
		c.cancel() // as the process that called exits
		return nil, status.Error(codes.Unavailable, "connection dropped (test)")
	}
	c.left--
	return c.Stream.Recv()
}

// TestSnapshotResumes: a copy cut short goes on where it stopped: the
// files it wrote whole, and the sender still has unchanged, are kept
// (checked by their checksum on both sides), not sent again; one of them
// damaged meanwhile is sent again; the copy is whole either way.
func TestSnapshotResumes(t *testing.T) {
	f := setup(t)
	dst := t.TempDir()
	var cut bool
	open := func(req *prismv1.SnapshotRequest) (storecopy.Stream, error) {
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		s, err := f.client.Snapshot(ctx, req)
		if err != nil || cut {
			return s, err
		}
		cut = true
		return &cutStream{Stream: s, left: 60, cancel: cancel}, nil // the manifest and some files
	}
	_, err := storecopy.Receive(open, dst, storecopy.Options{})
	if status.Code(errors.Unwrap(err)) != codes.Unavailable && (err == nil || !strings.Contains(err.Error(), "connection dropped")) {
		t.Fatalf("a copy cut short: %v", err)
	}
	staged := filepath.Join(dst, store.StagedDirName)
	left, _ := os.ReadDir(staged)
	var damaged string
	var bad []byte
	for _, e := range left {
		if fi, _ := e.Info(); fi != nil && fi.Size() > 100 && strings.HasSuffix(e.Name(), ".sst") {
			damaged = filepath.Join(staged, e.Name())
			b, _ := os.ReadFile(damaged)
			b[50] ^= 0xff
			bad = b
			if err := os.WriteFile(damaged, b, 0o644); err != nil {
				t.Fatal(err)
			}
			break
		}
	}
	if damaged == "" {
		t.Fatalf("the copy cut short left no SST to damage: %v", left)
	}
	var res storecopy.Result
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		// The sender sees the first call's end a moment after it.
		res, err = storecopy.Receive(open, dst, storecopy.Options{})
		if err == nil || !strings.Contains(err.Error(), "ResourceExhausted") || time.Now().After(deadline) {
			break
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	if res.Reused == 0 || res.Reused >= res.Files || res.ReusedBytes >= res.Bytes {
		t.Fatalf("resumed copy kept %d files (%d bytes) of %d (%d bytes): want some, not all", res.Reused, res.ReusedBytes, res.Files, res.Bytes)
	}
	s, err := store.Open(dst, &store.Options{HotBytes: -1, MustExist: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if b, err := os.ReadFile(filepath.Join(dst, filepath.Base(damaged))); err != nil || bytes.Equal(b, bad) {
		t.Fatalf("the damaged %s was kept, not sent again (%v)", filepath.Base(damaged), err)
	}
	if got, want := slices.Sorted(slices.Values(s.Models())), slices.Sorted(slices.Values(f.srv.Models())); !slices.Equal(got, want) {
		t.Fatalf("the resumed copy holds %v, want %v", got, want)
	}
	t.Logf("resumed: %d of %d files kept (%d of %d bytes)", res.Reused, res.Files, res.ReusedBytes, res.Bytes)
}
