package placement

import (
	"testing"

	"github.com/prism-serve/prism/internal/shareddata/sharedtest"
)

// openbTrace loads the FGD paper's default trace or skips.
func openbTrace(tb testing.TB) ([]Node, []Task) {
	tb.Helper()
	nodes, err := LoadNodes(sharedtest.Path(tb, "openb/openb_node_list_gpu_node.csv"))
	if err != nil {
		tb.Fatalf("openb nodes: %v", err)
	}
	tasks, err := LoadTasks(sharedtest.Path(tb, "openb/openb_pod_list_default.csv"))
	if err != nil {
		tb.Fatalf("openb tasks: %v", err)
	}
	return nodes, tasks
}
