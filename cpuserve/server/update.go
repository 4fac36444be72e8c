package server

import (
	"context"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/internal/onnxpb"
)

// Update upserts rows of one table into this worker's store. It answers
// after the store has synced its write-ahead log: an acknowledged update
// survives a crash, and every later lookup reads it.
func (s *Server) Update(ctx context.Context, req *prismv1.UpdateRequest) (*prismv1.UpdateResponse, error) {
	if err := ctxErr(ctx, "on arrival"); err != nil {
		return nil, err
	}
	if s.models[req.GetModel()] == nil {
		return nil, status.Errorf(codes.NotFound, "model %q is not served here (serving %v)", req.GetModel(), s.Models())
	}
	ids, raw := req.GetIds(), req.GetRows()
	if len(ids) == 0 {
		return nil, status.Error(codes.InvalidArgument, "update: no ids")
	}
	if len(raw)%4 != 0 || len(raw)%len(ids) != 0 {
		return nil, status.Errorf(codes.InvalidArgument, "update: %d row bytes are not whole float32 rows for %d ids", len(raw), len(ids))
	}
	// Copy: the request's bytes need not be aligned for a float view, and
	// the store keeps nothing of its arguments anyway.
	rows := make([]float32, len(raw)/4)
	copy(rows, onnxpb.BytesAsFloat32(raw))
	if err := s.st.Upsert(req.GetModel(), req.GetTable(), ids, rows); err != nil {
		return nil, storeStatus(fmt.Errorf("update: %w", err))
	}
	return &prismv1.UpdateResponse{Workers: 1}, nil
}
