package router

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/internal/serve"
)

// TestRecommendOverHTTP: Recommend served on the HTTP/JSON endpoint
// (serve --http-addr) is the router's own: an answer has the scores the
// in-process call gets, and an admission refusal carries the pushback
// the gRPC trailer would (Retry-After in whole seconds, the milliseconds
// in X-Prism-Retry-Pushback-Ms), or says not to retry.
func TestRecommendOverHTTP(t *testing.T) {
	for _, tc := range []struct {
		name        string
		maxInflight int64
		timeout     string
		status      int
		pushback    string // X-Prism-Retry-Pushback-Ms; "" none
		retryAfter  string
	}{
		{name: "answered", maxInflight: 1000, timeout: "5s", status: 200},
		// 10 over the limit of 100 at 1,000 samples/s: 10 ms, spread by
		// half of 0.5: 12.5, so 13 (TestAdmitPushback).
		{name: "in flight: retry", maxInflight: 100, timeout: "1s", status: 429, pushback: "13", retryAfter: "1"},
		// 90 ahead + 20 at 1,000/s: 110 ms, past 100 ms.
		{name: "deadline: do not retry", maxInflight: 1000, timeout: "100ms", status: 429, pushback: "-1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			defer func(j func() float64) { jitter = j }(jitter)
			jitter = func() float64 { return 0.5 }
			cn := &fakeCN{gate: make(chan struct{})}
			r := newRouter(t, Options{MaxInflight: tc.maxInflight}, cn)
			var want *prismv1.RecommendResponse
			if tc.status == 200 {
				close(cn.gate)
				var err error
				if want, err = r.Recommend(context.Background(), request(20)); err != nil {
					t.Fatal(err)
				}
			} else {
				r.preds.get("m").rate = 1000 // samples/s
				held := backlog(r, cn, 90)
				defer func() {
					close(cn.gate)
					if err := <-held; err != nil {
						t.Error(err)
					}
				}()
			}
			s, err := serve.New("router", serve.Options{Addr: "127.0.0.1:0", HTTPAddr: "127.0.0.1:0", MetricsAddr: "off", Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			s.HandleJSON(r.RecommendJSONRoute())
			ctx, cancel := context.WithCancel(context.Background())
			served := make(chan error, 1)
			go func() { served <- s.Serve(ctx) }()
			defer func() { cancel(); <-served }()

			body, _ := protojson.Marshal(request(20))
			hr, _ := http.NewRequest(http.MethodPost, "http://"+s.HTTPAddr()+"/v1/recommend", strings.NewReader(string(body)))
			hr.Header.Set("Content-Type", "application/json")
			hr.Header.Set(serve.TimeoutHeader, tc.timeout)
			resp, err := http.DefaultClient.Do(hr)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.status, b)
			}
			if got := resp.Header.Get(serve.PushbackHeader); got != tc.pushback {
				t.Errorf("%s %q, want %q", serve.PushbackHeader, got, tc.pushback)
			}
			if got := resp.Header.Get("Retry-After"); got != tc.retryAfter {
				t.Errorf("Retry-After %q, want %q", got, tc.retryAfter)
			}
			if tc.status != 200 {
				var e struct{ Code, Message string }
				if err := json.Unmarshal(b, &e); err != nil || e.Code != "RESOURCE_EXHAUSTED" {
					t.Fatalf("error body %s (%v), want RESOURCE_EXHAUSTED", b, err)
				}
				return
			}
			var got prismv1.RecommendResponse
			if err := protojson.Unmarshal(b, &got); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got.GetScores(), want.GetScores()) || len(got.GetScores()) != 20 {
				t.Fatalf("scores over HTTP %v, in process %v", got.GetScores(), want.GetScores())
			}
		})
	}
}
