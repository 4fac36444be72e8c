package serve

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// answerer answers every Check with code (OK: SERVING), or, with hold,
// blocks until the call is cut.
type answerer struct {
	healthpb.UnimplementedHealthServer
	code    codes.Code
	entered chan struct{}
	hold    bool
}

func (a *answerer) Check(ctx context.Context, _ *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	if a.hold {
		a.entered <- struct{}{}
		<-ctx.Done()
		return nil, ctx.Err()
	}
	if a.code != codes.OK {
		return nil, status.Errorf(a.code, "answered %v", a.code)
	}
	return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
}

// TestTransportFailed: a call's failure counts as the transport's only
// when the server sent no status: a server on loopback that answers
// Unavailable (or anything else) is answering; a server stopped before
// the call (connection refused) or under it (connection lost) is a
// transport failure; the caller's deadline, an unwatched call and a
// connection without AnswerStats are not.
func TestTransportFailed(t *testing.T) {
	for _, tc := range []struct {
		name    string
		srv     answerer
		stop    string // "", "before" the call, "under" it
		noStats bool   // the connection lacks AnswerStats
		watch   bool
		timeout time.Duration
		want    bool
	}{
		{name: "answered OK", srv: answerer{code: codes.OK}, watch: true},
		{name: "answered Unavailable", srv: answerer{code: codes.Unavailable}, watch: true},
		{name: "answered InvalidArgument", srv: answerer{code: codes.InvalidArgument}, watch: true},
		{name: "answered ResourceExhausted", srv: answerer{code: codes.ResourceExhausted}, watch: true},
		{name: "stopped before the call", stop: "before", watch: true, want: true},
		{name: "stopped under the call", srv: answerer{hold: true}, stop: "under", watch: true, want: true},
		{name: "caller's deadline", srv: answerer{hold: true}, watch: true, timeout: 50 * time.Millisecond},
		{name: "not watched", stop: "before"},
		{name: "connection without AnswerStats", stop: "before", watch: true, noStats: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			srv := tc.srv
			srv.entered = make(chan struct{}, 1)
			s := grpc.NewServer()
			healthpb.RegisterHealthServer(s, &srv)
			go s.Serve(lis)
			defer s.Stop()
			opts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
			if !tc.noStats {
				opts = append(opts, AnswerStats())
			}
			conn, err := grpc.NewClient(lis.Addr().String(), opts...)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			if tc.stop == "before" {
				s.Stop()
			}
			ctx := context.Background()
			if tc.timeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tc.timeout)
				defer cancel()
			}
			if tc.watch {
				ctx = WatchAnswer(ctx)
			}
			if tc.stop == "under" {
				go func() {
					<-srv.entered
					s.Stop()
				}()
			}
			_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
			if got := TransportFailed(ctx, err); got != tc.want {
				t.Errorf("call failed with %v: transport failure %v, want %v", err, got, tc.want)
			}
		})
	}
}
