package server_test

import (
	"context"
	"slices"
	"testing"

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
	stream, err := f.client.Snapshot(context.Background(), &prismv1.SnapshotRequest{})
	if err != nil {
		t.Fatal(err)
	}
	dst := t.TempDir()
	var chunks int
	res, err := storecopy.Receive(stream, dst, storecopy.Options{Progress: func(done, total int64) { chunks++ }})
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
	// A second copy right after: the first's checkpoint is gone.
	stream, err = f.client.Snapshot(context.Background(), &prismv1.SnapshotRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := storecopy.Receive(stream, t.TempDir(), storecopy.Options{}); err != nil {
		t.Fatalf("a second copy: %v", err)
	}
}
