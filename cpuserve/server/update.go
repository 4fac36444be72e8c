package server

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/cpuserve/store"
	"github.com/prism-serve/prism/internal/auth"
	"github.com/prism-serve/prism/internal/leview"
)

// Update upserts rows of one table into this worker's store. It answers
// after the store has synced its write-ahead log: an acknowledged update
// survives a crash, and every later lookup reads it. A sequenced update
// (the router's) applies only after the one before it: an update the
// store holds already is acknowledged again, one that comes too early
// gets FailedPrecondition naming the update the worker needs, and one
// sent fresh (ApplyUpdateRequest.fresh) that it holds already
// AlreadyExists. An update from a router whose hold of the sequencing
// Lease ended (ApplyUpdateRequest.epoch earlier than the epoch the store
// keeps, prismv1.EpochStale) gets FailedPrecondition (prismv1.StaleEpochError)
// on every path, nothing written and no number taken. Over TLS an
// unsequenced update (seq 0) is refused to every role but admin.
func (s *Server) Update(ctx context.Context, areq *prismv1.ApplyUpdateRequest) (*prismv1.UpdateResponse, error) {
	req := areq.GetUpdate()
	if err := ctxErr(ctx, "on arrival"); err != nil {
		return nil, err
	}
	if areq.GetSeq() < 0 {
		return nil, status.Errorf(codes.InvalidArgument, "update seq %d: want 0 (unsequenced) or a positive number", areq.GetSeq())
	}
	if areq.GetSeq() == 0 && !auth.Allowed(ctx, auth.Admin) {
		// Unsequenced writes bypass the router's order: operators only.
		role, _, _ := auth.Peer(ctx)
		return nil, status.Errorf(codes.PermissionDenied, "role %q may not send an unsequenced update (seq 0) to %s: only admin may", role, prismv1.EmbeddingTier_Update_FullMethodName)
	}
	if areq.GetSeq() > 0 && !auth.Allowed(ctx, auth.Router) {
		// A number is the router's to give: another caller taking one
		// would make the router's real update with that number look
		// applied here without being written.
		role, _, _ := auth.Peer(ctx)
		return nil, status.Errorf(codes.PermissionDenied, "role %q may not send a sequenced update (seq %d) to %s: only the router numbers updates", role, areq.GetSeq(), prismv1.EmbeddingTier_Update_FullMethodName)
	}
	if s.models[req.GetModel()] == nil {
		return nil, status.Errorf(codes.NotFound, "model %q is not served here (serving %v)", req.GetModel(), s.Models())
	}
	if want := areq.GetSequence(); want != "" {
		if ok, own := s.shards[req.GetModel()].takes(req.GetModel(), want); !ok {
			// Another shard's (or sharding's) number: taking it would stand
			// in for this shard's update of that number.
			return nil, status.Errorf(codes.FailedPrecondition, "update %d of sequence %q: this worker's sequence is %q; nothing applied", areq.GetSeq(), want, own)
		}
	}
	if areq.GetNumberOnly() && areq.GetNumberFrom() != 0 {
		return s.skipRange(areq)
	}
	if areq.GetNumberOnly() {
		// The router sent the rows to the shards holding the table only.
		sr := s.shards[req.GetModel()]
		switch {
		case areq.GetSeq() <= 0:
			return nil, status.Error(codes.InvalidArgument, "update: number_only goes with a sequenced update (seq > 0)")
		case sr != nil && !sr.tables[req.GetTable()]:
			// No shard holds such a table: bad input, refused here as
			// on every worker, and the number taken.
			if err := s.st.SkipSeqsAt(req.GetModel(), areq.GetSeq(), areq.GetSeq(), areq.GetEpoch()); err != nil {
				return nil, storeStatus(fmt.Errorf("update: %w", err))
			}
			return nil, status.Errorf(codes.InvalidArgument, "update: model %q has no table %q (its tables: %s)", req.GetModel(), req.GetTable(), s.tableNames(req.GetModel()))
		case !s.skipsUpdate(req.GetModel(), req.GetTable()):
			return nil, status.Errorf(codes.FailedPrecondition, "update %d of table %q sent without its rows, but this worker's shard holds the table: send it the rows", areq.GetSeq(), req.GetTable())
		}
		if err := s.st.SkipSeqsAt(req.GetModel(), areq.GetSeq(), areq.GetSeq(), areq.GetEpoch()); err != nil {
			return nil, storeStatus(fmt.Errorf("update: %w", err))
		}
		return &prismv1.UpdateResponse{Workers: 1, Shards: s.shards[req.GetModel()].rowShards(req.GetTable(), req.GetIds())}, nil
	}
	if s.skipsUpdate(req.GetModel(), req.GetTable()) {
		// Another shard's table: this worker takes the update's place in
		// the model's one sequence, rows unwritten.
		if seq := areq.GetSeq(); seq > 0 {
			if err := s.st.SkipSeqsAt(req.GetModel(), seq, seq, areq.GetEpoch()); err != nil {
				return nil, storeStatus(fmt.Errorf("update: %w", err))
			}
		}
		return &prismv1.UpdateResponse{Workers: 1, Shards: s.shards[req.GetModel()].rowShards(req.GetTable(), req.GetIds())}, nil
	}
	// Which shards hold the rows, named in every answer (the router
	// holds each to its quorum): taken before ownRows keeps this
	// shard's.
	rowShards := s.shards[req.GetModel()].rowShards(req.GetTable(), req.GetIds())
	ids, raw := req.GetIds(), req.GetRows()
	var bad error
	if len(ids) == 0 {
		bad = status.Error(codes.InvalidArgument, "update: no ids")
	} else if len(raw)%len(ids) != 0 || len(raw)/len(ids)%4 != 0 {
		bad = status.Errorf(codes.InvalidArgument, "update: %d row bytes are not whole float32 rows for %d ids", len(raw), len(ids))
	}
	if bad != nil {
		if seq := areq.GetSeq(); seq > 0 {
			// Every replica rejects it alike: it takes its place in the
			// sequence, so the updates after it are not held up.
			if err := s.st.SkipSeqsAt(req.GetModel(), seq, seq, areq.GetEpoch()); err != nil {
				return nil, storeStatus(fmt.Errorf("update: %w", err))
			}
		}
		return nil, bad
	}
	// Copy: the request's bytes need not be aligned for a float view, and
	// the store keeps nothing of its arguments anyway.
	rows := make([]float32, len(raw)/4)
	copy(rows, leview.Float32s(raw))
	// Rows the model scales before its lookups (a padding_idx row mask:
	// plan.Table.RowFactors) are stored scaled, as the table was.
	if f := s.models[req.GetModel()].rowFactors(req.GetTable()); len(f) > 0 {
		dim := len(rows) / len(ids)
		for i, id := range ids {
			if x, ok := f[id]; ok {
				for j := range rows[i*dim : (i+1)*dim] {
					rows[i*dim+j] *= x
				}
			}
		}
	}
	// A row-wise table's shard writes only the rows it holds (the others
	// are other shards'); an update left with none takes its number.
	ids, rows, inTable := s.shards[req.GetModel()].ownRows(req.GetTable(), ids, rows)
	if !inTable {
		bad := status.Errorf(codes.InvalidArgument, "update of table %q: an id outside the table", req.GetTable())
		if seq := areq.GetSeq(); seq > 0 {
			if err := s.st.SkipSeqsAt(req.GetModel(), seq, seq, areq.GetEpoch()); err != nil {
				return nil, storeStatus(fmt.Errorf("update: %w", err))
			}
		}
		return nil, bad
	}
	if len(ids) == 0 {
		if seq := areq.GetSeq(); seq > 0 {
			if err := s.st.SkipSeqsAt(req.GetModel(), seq, seq, areq.GetEpoch()); err != nil {
				return nil, storeStatus(fmt.Errorf("update: %w", err))
			}
		}
		return &prismv1.UpdateResponse{Workers: 1, Shards: rowShards}, nil
	}
	var err error
	if seq := areq.GetSeq(); seq > 0 {
		var applied bool
		applied, err = s.st.UpsertSeqAt(req.GetModel(), req.GetTable(), ids, rows, seq, areq.GetEpoch())
		if err == nil && !applied && areq.GetFresh() {
			// The router sends this number for the first time, yet the
			// store holds it: another sequencer's update under the same
			// number. Acknowledged as a replay, it would count as this
			// update held here while none of its rows is.
			return nil, status.Errorf(codes.AlreadyExists, "update %d of model %q: this worker holds an update under that number already, which its router never sent it (another router numbered it); nothing applied", seq, req.GetModel())
		}
	} else {
		err = s.st.Upsert(req.GetModel(), req.GetTable(), ids, rows)
	}
	if err != nil {
		if errors.Is(err, store.ErrUnknownTable) {
			// The name the client knows may not be the plan's (a float16
			// table is served as NAME_float): say which it can update.
			err = fmt.Errorf("%w (its tables: %s)", err, s.tableNames(req.GetModel()))
		}
		return nil, storeStatus(fmt.Errorf("update: %w", err))
	}
	return &prismv1.UpdateResponse{Workers: 1, Shards: rowShards}, nil
}

// tableNames lists the tables of model's plan (the first 16, sorted),
// for the answer to an update naming a table the model has not.
func (s *Server) tableNames(model string) string {
	var names []string
	if m := s.models[model]; m != nil {
		for _, t := range m.plan.Tables {
			names = append(names, t.Name)
		}
	}
	slices.Sort(names)
	if n := len(names); n > 16 {
		return strings.Join(names[:16], ", ") + fmt.Sprintf(" and %d more", n-16)
	}
	return strings.Join(names, ", ")
}

// skipRange takes a catch-up's run of other shards' updates
// (ApplyUpdateRequest.number_from .. seq) in one write.
func (s *Server) skipRange(areq *prismv1.ApplyUpdateRequest) (*prismv1.UpdateResponse, error) {
	model, from, seq := areq.GetUpdate().GetModel(), areq.GetNumberFrom(), areq.GetSeq()
	if from < 1 || from > seq {
		return nil, status.Errorf(codes.InvalidArgument, "update: number_from %d with seq %d: want 1 <= number_from <= seq", from, seq)
	}
	sr := s.shards[model]
	if sr == nil {
		return nil, status.Errorf(codes.FailedPrecondition, "updates %d .. %d sent without their rows, but this worker holds the whole model %q: send it the rows", from, seq, model)
	}
	for _, table := range areq.GetSkippedTables() {
		if sr.tables[table] && !s.skipsUpdate(model, table) {
			return nil, status.Errorf(codes.FailedPrecondition, "updates %d .. %d sent without their rows, but this worker's shard holds table %q: send it the rows", from, seq, table)
		}
	}
	if err := s.st.SkipSeqsAt(model, from, seq, areq.GetEpoch()); err != nil {
		return nil, storeStatus(fmt.Errorf("update: %w", err))
	}
	return &prismv1.UpdateResponse{Workers: 1}, nil
}
