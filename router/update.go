package router

import (
	"context"
	"sync"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
)

// Updater serves Embeddings.Update: it fans an upsert out to every live
// embedding worker of the model. Each worker's store is its own copy of
// the tables, so an update is done only when all of them have it. A worker
// that is down when the update is sent does not get it (its store keeps
// the old rows): resend updates after replacing a worker, or give each
// worker the same store lineage (re-ingest) when it rejoins.
type Updater struct {
	prismv1.UnimplementedEmbeddingsServer
	r *Router
}

// Updater returns the Embeddings service of r.
func (r *Router) Updater() *Updater { return &Updater{r: r} }

// Update applies req on every embedding worker serving req.Model.
func (u *Updater) Update(ctx context.Context, req *prismv1.UpdateRequest) (*prismv1.UpdateResponse, error) {
	r := u.r
	if req.GetModel() == "" || req.GetTable() == "" || len(req.GetIds()) == 0 {
		return nil, status.Error(codes.InvalidArgument, "update needs a model, a table and ids")
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, r.opts.DefaultTimeout)
		defer cancel()
	}
	ws, _ := r.Reg.List(ctx, nil)
	var targets []*prismv1.WorkerInfo
	for _, w := range ws.GetWorkers() {
		if w.GetRole() != RoleCPU {
			continue
		}
		for _, m := range w.GetModels() {
			if m == req.GetModel() {
				targets = append(targets, w)
				break
			}
		}
	}
	if len(targets) == 0 {
		if r.Reg.Known(req.GetModel()) {
			return nil, status.Errorf(codes.Unavailable, "model %q has no live embedding worker right now; retry", req.GetModel())
		}
		return nil, status.Errorf(codes.NotFound, "model %q is not served", req.GetModel())
	}
	errs := make([]error, len(targets))
	var wg sync.WaitGroup
	for i, w := range targets {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := r.conn(w.GetAddr())
			if err != nil {
				errs[i] = err
				return
			}
			_, errs[i] = prismv1.NewEmbeddingTierClient(c).Update(ctx, req)
		}()
	}
	wg.Wait()
	applied, failed := 0, -1
	for i, err := range errs {
		if err == nil {
			applied++
		} else if failed < 0 {
			failed = i
		}
	}
	if failed >= 0 {
		st := status.Convert(errs[failed])
		return nil, status.Errorf(st.Code(), "update applied on %d of %d embedding workers; worker %s: %s (retrying is safe)", applied, len(targets), targets[failed].GetAddr(), st.Message())
	}
	return &prismv1.UpdateResponse{Workers: int32(applied)}, nil
}
