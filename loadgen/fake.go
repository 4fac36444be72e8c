package loadgen

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"time"

	rpccode "google.golang.org/genproto/googleapis/rpc/code"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/prism-serve/prism/api/prismv1"
)

// Fake is a Recommender that answers at once with zero scores, for
// measuring the generator itself and for tests. Delay, if set, is waited
// before each answer (return 0 for none); it may be called concurrently.
type Fake struct {
	prismv1.UnimplementedRecommenderServer
	Delay func(req *prismv1.RecommendRequest) time.Duration
}

var _ prismv1.RecommenderServer = (*Fake)(nil)

// ServiceTimes is a Fake.Delay that serves each model named in service
// as one server would: its requests one at a time, in the order they
// come, each taking the model's service time. A model offered more than
// 1/service requests a second queues without bound (its latency grows
// through a run), as a model whose one worker falls behind; one offered
// less waits little. Models not named answer at once. For tests of a
// mix of models of different capacity.
func ServiceTimes(service map[string]time.Duration) func(*prismv1.RecommendRequest) time.Duration {
	var mu sync.Mutex
	free := map[string]time.Time{} // when each model's server is next free
	return func(req *prismv1.RecommendRequest) time.Duration {
		d, ok := service[req.Model]
		if !ok {
			return 0
		}
		mu.Lock()
		defer mu.Unlock()
		now := time.Now()
		start := now
		if f := free[req.Model]; f.After(now) {
			start = f
		}
		free[req.Model] = start.Add(d)
		return free[req.Model].Sub(now)
	}
}

func (f *Fake) Recommend(ctx context.Context, req *prismv1.RecommendRequest) (*prismv1.RecommendResponse, error) {
	if req.NumCandidates < 1 {
		return nil, status.Errorf(codes.InvalidArgument, "num_candidates %d: want at least 1", req.NumCandidates)
	}
	if f.Delay != nil {
		if d := f.Delay(req); d > 0 {
			t := time.NewTimer(d)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return nil, status.FromContextError(ctx.Err()).Err()
			}
		}
	}
	return &prismv1.RecommendResponse{Scores: make([]float32, req.NumCandidates), Model: req.Model, Version: req.Version, RequestId: req.RequestId}, nil
}

func (f *Fake) RecommendStream(st grpc.BidiStreamingServer[prismv1.RecommendRequest, prismv1.RecommendResponse]) error {
	for {
		req, err := st.Recv()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		resp, err := f.Recommend(st.Context(), req)
		if err != nil {
			return err
		}
		if err := st.Send(resp); err != nil {
			return err
		}
	}
}

// FakeEmbeddings is an Embeddings service that acknowledges every well
// formed update at once and writes nothing, for measuring the update
// stream's generator and for tests.
type FakeEmbeddings struct {
	prismv1.UnimplementedEmbeddingsServer
}

func (FakeEmbeddings) Update(_ context.Context, req *prismv1.UpdateRequest) (*prismv1.UpdateResponse, error) {
	if len(req.Ids) == 0 || len(req.Rows) == 0 || len(req.Rows)%(4*len(req.Ids)) != 0 {
		return nil, status.Errorf(codes.InvalidArgument, "%d bytes of rows for %d ids: want a whole float32 row per id", len(req.Rows), len(req.Ids))
	}
	return &prismv1.UpdateResponse{Workers: 1}, nil
}

// ServeFake serves f (and FakeEmbeddings) on addr (use "127.0.0.1:0" for a free port) and
// returns the address it listens on and a stop function the caller owns.
func ServeFake(addr string, f *Fake) (string, func(), error) {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, fmt.Errorf("fake server: %w", err)
	}
	srv := grpc.NewServer()
	prismv1.RegisterRecommenderServer(srv, f)
	prismv1.RegisterEmbeddingsServer(srv, FakeEmbeddings{})
	go func() { _ = srv.Serve(lis) }()
	return lis.Addr().String(), srv.Stop, nil
}

// HTTPHandler serves f's Recommend over HTTP/JSON as the router does
// (POST RecommendPath, protojson both ways, TimeoutHeader as the call's
// deadline, errors as google.rpc.Status JSON), for tests of an
// HTTPSender.
func (f *Fake) HTTPHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, hr *http.Request) {
		fail := func(httpStatus int, c codes.Code, msg string) {
			b, _ := json.Marshal(map[string]string{"code": rpccode.Code_name[int32(c)], "message": msg})
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(httpStatus)
			w.Write(b)
		}
		if hr.URL.Path != RecommendPath || hr.Method != http.MethodPost {
			fail(http.StatusNotFound, codes.NotFound, "POST "+RecommendPath)
			return
		}
		ctx := hr.Context()
		if v := hr.Header.Get(TimeoutHeader); v != "" {
			d, err := time.ParseDuration(v)
			if err != nil || d <= 0 {
				fail(http.StatusBadRequest, codes.InvalidArgument, TimeoutHeader+" "+v)
				return
			}
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, d)
			defer cancel()
		}
		body, err := io.ReadAll(hr.Body)
		req := new(prismv1.RecommendRequest)
		if err == nil {
			err = protojson.Unmarshal(body, req)
		}
		if err != nil {
			fail(http.StatusBadRequest, codes.InvalidArgument, err.Error())
			return
		}
		resp, err := f.Recommend(ctx, req)
		if err != nil {
			st := status.Convert(err)
			httpStatus := http.StatusInternalServerError
			switch st.Code() {
			case codes.InvalidArgument:
				httpStatus = http.StatusBadRequest
			case codes.DeadlineExceeded:
				httpStatus = http.StatusGatewayTimeout
			}
			fail(httpStatus, st.Code(), st.Message())
			return
		}
		out, _ := protojson.Marshal(resp)
		w.Header().Set("Content-Type", "application/json")
		w.Write(out)
	})
}
