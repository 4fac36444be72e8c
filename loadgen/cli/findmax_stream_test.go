package cli

import (
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/prism-serve/prism/api/prismv1"
	"github.com/prism-serve/prism/loadgen"
)

// TestFindMaxRunsSendNewRequests: find-max's warm-up and each trial draw
// requests of their own. Each run rebuilt the request stream from the
// same --seed and --stream, so the first trial replayed the warm-up's
// requests (and every trial the previous ones'), finding their rows in
// the embedding tier's hot tier: the bias fbc4125 removed between runs.
// The schedule, from the same seed every trial, was one shape rescaled.
func TestFindMaxRunsSendNewRequests(t *testing.T) {
	var mu sync.Mutex
	seen := map[string]string{} // payload -> request id that first carried it
	var repeats []string
	addr, stop, err := loadgen.ServeFake("127.0.0.1:0", &loadgen.Fake{Delay: func(req *prismv1.RecommendRequest) time.Duration {
		b, _ := protojson.Marshal(req.Candidates)
		mu.Lock()
		defer mu.Unlock()
		if first, ok := seen[string(b)]; ok {
			repeats = append(repeats, first+" again as "+req.RequestId)
		} else {
			seen[string(b)] = req.RequestId
		}
		return 0
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	out, err := runCLI(t, "--target", addr, "--insecure", "--model", "dlrm-tiny", "--find-max", "--rate", "40",
		"--find-max-trial", "500ms", "--find-max-trials", "2", "--find-max-warmup", "500ms", "--candidates", "3", "--slo", "1s", "--quiet")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) < 20 || len(repeats) > 0 {
		t.Fatalf("%d distinct requests; %d sent again by a later run: %s\n%s", len(seen), len(repeats), strings.Join(repeats[:min(5, len(repeats))], ", "), out)
	}
}
