package router

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/plan"
)

// TestMultiTaskReassembly: a multi-task model's micro-batches answer k
// scores a candidate (LookupResponse.tasks); the router puts them back
// in request order, candidate-major, in task_scores with tasks k, and
// task 0's in scores, one a candidate, as for a model of one score. A
// fixed batch's padding is dropped for every task. A model of one score
// answers as before: no tasks, no task_scores.
func TestMultiTaskReassembly(t *testing.T) {
	for _, tc := range []struct {
		name         string
		n, micro     int
		fixed, tasks int32
	}{
		{"one task", 50, 7, 0, 0},
		{"one task said", 50, 7, 0, 1},
		{"two tasks", 50, 7, 0, 2},
		{"two tasks one micro-batch", 5, 64, 0, 2},
		{"three tasks", 270, 64, 0, 3},
		{"two tasks fixed batch padded", 13, 64, 4, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cn := &fakeCN{tasks: tc.tasks}
			var names []string
			for k := range tc.tasks {
				names = append(names, fmt.Sprintf("task%d", k))
			}
			if tc.tasks > 1 {
				cn.taskNames = names
			}
			r := testRouter(Options{MicroBatch: tc.micro})
			addr := startCN(t, cn)
			emb := &prismv1.WorkerInfo{Id: "c", Role: prismv1.Role_ROLE_EMBEDDING, Addr: addr, Models: []string{"m"}, Healthy: true}
			if tc.fixed > 0 {
				emb.FixedBatch = map[string]int64{"m": int64(tc.fixed)}
			}
			r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: emb})
			r.Reg.Announce(context.Background(), &prismv1.AnnounceRequest{Worker: &prismv1.WorkerInfo{Id: "g", Role: prismv1.Role_ROLE_DENSE, Addr: "d", Models: []string{"m"}, Healthy: true}})
			resp, err := r.Recommend(context.Background(), request(tc.n))
			if err != nil {
				t.Fatal(err)
			}
			if len(resp.GetScores()) != tc.n {
				t.Fatalf("%d scores for %d candidates", len(resp.GetScores()), tc.n)
			}
			for i, s := range resp.GetScores() {
				if s != float32(i) {
					t.Fatalf("score %d = %v, want task 0's %d", i, s, i)
				}
			}
			if tc.tasks <= 1 {
				if resp.GetTasks() != 0 || len(resp.GetTaskScores()) != 0 || len(resp.GetTaskNames()) != 0 {
					t.Fatalf("a model of one score answered tasks %d, %d task scores, task names %q", resp.GetTasks(), len(resp.GetTaskScores()), resp.GetTaskNames())
				}
				return
			}
			k := int(tc.tasks)
			if resp.GetTasks() != tc.tasks || len(resp.GetTaskScores()) != tc.n*k {
				t.Fatalf("tasks %d, %d task scores; want %d, %d", resp.GetTasks(), len(resp.GetTaskScores()), tc.tasks, tc.n*k)
			}
			if !slices.Equal(resp.GetTaskNames(), names) {
				t.Errorf("task names %q, want the workers' %q", resp.GetTaskNames(), names)
			}
			for i, s := range resp.GetTaskScores() {
				if want := float32(i/k) + 1000*float32(i%k); s != want {
					t.Fatalf("task_scores[%d] (candidate %d, task %d) = %v, want %v", i, i/k, i%k, s, want)
				}
			}
		})
	}
}

// TestMultiTaskScoreCountChecked: a micro-batch of a multi-task model
// answered with another count than tasks values a sample, or with more
// tasks than a plan may have, is Internal.
func TestMultiTaskScoreCountChecked(t *testing.T) {
	for _, tc := range []struct {
		tasks int32
		extra int
		want  string
	}{
		{2, -1, "15 scores for a micro-batch of 8 samples of 2 tasks"},
		{2, 1, "17 scores for a micro-batch of 8 samples of 2 tasks"},
		{2, -8, "8 scores for a micro-batch of 8 samples of 2 tasks"},
		{65, 0, "answered with 65 tasks a sample (at most 64)"},
		{-1, 0, "answered with -1 tasks a sample"},
	} {
		r := newRouter(t, Options{MicroBatch: 8}, &fakeCN{tasks: tc.tasks, extra: tc.extra})
		_, err := r.Recommend(context.Background(), request(8))
		if status.Code(err) != codes.Internal || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("tasks %d, %+d scores: %v, want Internal with %q", tc.tasks, tc.extra, err, tc.want)
		}
	}
}

// TestJoinScoresMixedTasks: micro-batches of one request answering
// different numbers of tasks are not put together (Internal).
func TestJoinScoresMixedTasks(t *testing.T) {
	parts := [][2]int{{0, 2}, {2, 4}}
	outs := [][]float32{{1, 2}, {3, 30, 4, 40}}
	_, _, _, err := joinScores("m", parts, outs, []answer{{}, {tasks: 2}}, 4)
	if status.Code(err) != codes.Internal || !strings.Contains(err.Error(), "answered 1 and 2 tasks a candidate") {
		t.Fatalf("mixed tasks: %v, want Internal", err)
	}
	scores, ts, k, err := joinScores("m", parts, [][]float32{{1, 10, 2, 20}, {3, 30, 4, 40}}, []answer{{tasks: 2}, {tasks: 2}}, 4)
	if err != nil || k != 2 || len(scores) != 4 || scores[3] != 4 || len(ts) != 8 || ts[5] != 30 {
		t.Fatalf("joinScores: %v %v %d %v", scores, ts, k, err)
	}
}

// TestJoinTaskNames: a request's task names are its micro-batches'
// (LookupResponse.task_names), those that give them (workers of earlier
// releases give none); names that are not one a task, too long, or
// differ between micro-batches are Internal, never passed on.
func TestJoinTaskNames(t *testing.T) {
	ab := namesOf([]string{"ctr", "cvr"})
	for _, tc := range []struct {
		name    string
		answers []answer
		k       int
		want    []string
		err     string
	}{
		{"one task", []answer{{taskNames: ab}}, 1, nil, ""},
		{"every micro-batch", []answer{{taskNames: ab}, {taskNames: ab}}, 2, []string{"ctr", "cvr"}, ""},
		{"an earlier release's among them", []answer{{}, {taskNames: ab}}, 2, []string{"ctr", "cvr"}, ""},
		{"none named", []answer{{}, {}}, 2, nil, ""},
		{"not one a task", []answer{{taskNames: ab}}, 3, nil, "a micro-batch of 3 tasks a candidate named 2"},
		{"named otherwise", []answer{{taskNames: ab}, {taskNames: namesOf([]string{"cvr", "ctr"})}}, 2, nil, `named its tasks ["ctr" "cvr"] and ["cvr" "ctr"]`},
		{"too long", []answer{{taskNames: namesOf([]string{"ctr", strings.Repeat("x", plan.MaxTaskName+1)})}}, 2, nil, "a task of 257 bytes"},
	} {
		got, err := joinTaskNames("m", tc.answers, tc.k)
		switch {
		case tc.err != "" && (status.Code(err) != codes.Internal || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%s: %v, want Internal with %q", tc.name, err, tc.err)
		case tc.err == "" && (err != nil || !slices.Equal(got, tc.want)):
			t.Errorf("%s: %q, %v; want %q", tc.name, got, err, tc.want)
		}
	}
}
