package server

import (
	"context"
	"errors"
	"io"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/cpuserve/store"
	"github.com/prism-serve/prism/cpuserve/storecopy"
	"github.com/prism-serve/prism/internal/auth"
)

// snapshotChunk is the most file bytes a SnapshotChunk carries.
const snapshotChunk = 1 << 20

// Snapshot streams a checkpoint of the whole store (store.Checkpoint):
// the manifest, then each file in chunks, each file's last chunk with
// its CRC-32C. The checkpoint is removed when the stream ends, whichever
// way. prism store copy is its client.
func (s *Server) Snapshot(req *prismv1.SnapshotRequest, stream prismv1.EmbeddingTier_SnapshotServer) error {
	ctx := stream.Context()
	if err := ctxErr(ctx, "on arrival"); err != nil {
		return err
	}
	if r := req.GetRate(); r < 0 || (r > 0 && r < storecopy.MinRate) {
		return status.Errorf(codes.InvalidArgument, "snapshot rate %d bytes a second: want 0 (unpaced) or at least %d", r, storecopy.MinRate)
	}
	if f := s.st.Damaged(); f != "" {
		// Its files would carry the damage to the copy (each file's
		// checksum is of its bytes as they are now), and opening a store
		// does not read every block.
		return status.Errorf(codes.FailedPrecondition, "this worker's store has a damaged file (%s): copy from another worker", f)
	}
	c, err := s.st.Checkpoint()
	switch {
	case errors.Is(err, store.ErrCheckpointBusy):
		return status.Error(codes.ResourceExhausted, err.Error())
	case errors.Is(err, store.ErrClosed):
		return status.Error(codes.Unavailable, "the store is closing")
	case err != nil:
		return status.Errorf(codes.Internal, "%v", err)
	}
	defer c.Close()
	m := &prismv1.SnapshotManifest{Store: s.st.Dir()}
	var total int64
	for _, f := range c.Files {
		m.Files = append(m.Files, &prismv1.SnapshotFile{Name: f.Name, Size: f.Size})
		total += f.Size
	}
	_, who, _ := auth.Peer(ctx)
	if p, ok := peer.FromContext(ctx); ok && who == "" && p.Addr != nil {
		who = p.Addr.String() // plaintext: no certificate to name the caller
	}
	start := time.Now()
	s.log.Info("sending a copy of the store", "store", s.st.Dir(), "files", len(c.Files), "bytes", total, "to", who)
	if err := stream.Send(&prismv1.SnapshotChunk{Manifest: m}); err != nil {
		return err
	}
	have := make(map[string]*prismv1.SnapshotFile, len(req.GetHave()))
	for _, h := range req.GetHave() {
		have[h.GetName()] = h
	}
	buf := make([]byte, snapshotChunk)
	pace := storecopy.NewPacer(req.GetRate())
	var reused int
	var reusedBytes int64
	for i, f := range c.Files {
		if h := have[f.Name]; h != nil && h.GetSize() == f.Size {
			// The caller's may be this file (an earlier copy it did not
			// finish): read here, not sent, when the checksums agree.
			sum, err := fileCRC(ctx, c, f.Name, buf, pace)
			if err != nil {
				return status.Errorf(codes.Internal, "copy of the store: %v", err)
			}
			if sum == h.GetCrc32C() {
				if err := stream.Send(&prismv1.SnapshotChunk{File: int32(i), Eof: true, Crc32C: sum, Reused: true}); err != nil {
					return err
				}
				reused++
				reusedBytes += f.Size
				continue
			}
		}
		if err := s.sendFile(stream, c, int32(i), f, buf, pace); err != nil {
			s.log.Warn("copy of the store not sent", "store", s.st.Dir(), "file", f.Name, "err", err)
			return err
		}
	}
	s.log.Info("sent a copy of the store", "store", s.st.Dir(), "files", len(c.Files), "bytes", total, "reused_files", reused, "reused_bytes", reusedBytes, "to", who, "elapsed", time.Since(start).Round(time.Millisecond))
	return nil
}

func (s *Server) sendFile(stream prismv1.EmbeddingTier_SnapshotServer, c *store.Checkpoint, i int32, f store.CheckpointFile, buf []byte, pace *storecopy.Pacer) error {
	r, err := c.Open(f.Name)
	if err != nil {
		return status.Errorf(codes.Internal, "copy of the store: %v", err)
	}
	defer r.Close()
	var off int64
	var sum uint32
	for {
		n, err := io.ReadFull(r, buf)
		pace.Read(stream.Context(), n)
		if n > 0 {
			sum = storecopy.CRC32C(sum, buf[:n])
			if off+int64(n) > f.Size {
				return status.Errorf(codes.Internal, "copy of the store: %s grew past its %d bytes (a checkpoint's files do not change)", f.Name, f.Size)
			}
		}
		last := errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
		if err != nil && !last {
			return status.Errorf(codes.Internal, "copy of the store: read %s: %v", f.Name, err)
		}
		if last && off+int64(n) != f.Size {
			return status.Errorf(codes.Internal, "copy of the store: %s has %d bytes, listed with %d", f.Name, off+int64(n), f.Size)
		}
		msg := &prismv1.SnapshotChunk{File: i, Offset: off, Data: buf[:n], Eof: last}
		if last {
			msg.Crc32C = sum
		}
		if err := stream.Send(msg); err != nil {
			return err
		}
		off += int64(n)
		if last {
			return nil
		}
	}
}

// fileCRC is the CRC-32C of the checkpoint's file name, read at pace.
func fileCRC(ctx context.Context, c *store.Checkpoint, name string, buf []byte, pace *storecopy.Pacer) (uint32, error) {
	r, err := c.Open(name)
	if err != nil {
		return 0, err
	}
	defer r.Close()
	sum, _, err := storecopy.Checksum(r, buf, func(n int) { pace.Read(ctx, n) })
	return sum, err
}
