package storecopy

import (
	"encoding/binary"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"google.golang.org/protobuf/proto"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/cpuserve/store"
)

// encodeStream lays chunks out as the fuzzer's input: each a 4-byte
// little-endian length and the message.
func encodeStream(t testing.TB, cs []*prismv1.SnapshotChunk) []byte {
	var out []byte
	for _, c := range cs {
		b, err := proto.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		out = binary.LittleEndian.AppendUint32(out, uint32(len(b)))
		out = append(out, b...)
	}
	return out
}

// decodeStream is encodeStream's inverse; what does not decode ends the
// stream (a sender that stopped).
func decodeStream(b []byte) sliceStream {
	var s sliceStream
	for len(b) >= 4 {
		n := int(binary.LittleEndian.Uint32(b))
		b = b[4:]
		if n > len(b) {
			break
		}
		c := &prismv1.SnapshotChunk{}
		if proto.Unmarshal(b[:n], c) != nil {
			break
		}
		s = append(s, c)
		b = b[n:]
	}
	return s
}

// FuzzReceive: whatever a sender streams, Receive neither panics nor
// writes outside the store folder's staged copy, and a copy it accepts
// is marked complete and opens as a store (the store's next open swaps
// it in). Seeds: a real checkpoint's stream, and that stream cut short.
func FuzzReceive(f *testing.F) {
	good := source(f, vfs.NewMem())
	f.Add(encodeStream(f, good))
	f.Add(encodeStream(f, good[:len(good)/2]))
	f.Add(encodeStream(f, good[:1]))
	f.Fuzz(func(t *testing.T, in []byte) {
		fs := vfs.NewMem()
		s := decodeStream(in)
		if len(s) > 0 && s[0].GetManifest() != nil {
			// A few files: the store is made of small ones.
			if len(s[0].GetManifest().GetFiles()) > 200 {
				return
			}
			for _, f := range s[0].GetManifest().GetFiles() {
				if f.GetSize() > 64<<20 {
					return
				}
			}
		}
		_, err := Receive(fromSlice(&s), "dst", Options{FS: fs, Free: func(string) (uint64, error) { return 1 << 30, nil }})
		names, _ := fs.List("")
		for _, n := range names {
			if n != "dst" {
				t.Fatalf("Receive wrote %q outside the store folder", n)
			}
		}
		top, _ := fs.List("dst")
		for _, n := range top {
			if n != store.StagedDirName {
				t.Fatalf("Receive wrote %q beside the staged copy", n)
			}
		}
		_, cerr := fs.Stat(fs.PathJoin("dst", store.StagedDirName, store.StagedCompleteName))
		if (err == nil) != (cerr == nil) {
			t.Fatalf("Receive: %v, but the complete mark: %v", err, cerr)
		}
		if err != nil {
			return
		}
		st, err := store.Open("dst", &store.Options{FS: fs, HotBytes: -1, MustExist: true})
		if err != nil {
			t.Fatalf("an accepted copy does not open: %v", err)
		}
		st.Close()
	})
}
