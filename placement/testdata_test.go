package placement

import (
	"os"
	"path/filepath"
	"testing"
)

// sharedDataDir finds ../shared/data beside the repository root (the
// directory with go.mod) or skips the test.
func sharedDataDir(tb testing.TB) string {
	tb.Helper()
	dir, err := os.Getwd()
	if err != nil {
		tb.Skip("no working directory")
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			p := filepath.Join(filepath.Dir(dir), "shared", "data")
			if st, err := os.Stat(p); err == nil && st.IsDir() {
				return p
			}
			tb.Skipf("no shared data beside %s", dir)
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			tb.Skip("no repository root above the package")
		}
		dir = parent
	}
}

// openbTrace loads the FGD paper's default trace or skips.
func openbTrace(tb testing.TB) ([]Node, []Task) {
	tb.Helper()
	d := sharedDataDir(tb)
	nodes, err := LoadNodes(filepath.Join(d, "openb", "openb_node_list_gpu_node.csv"))
	if err != nil {
		tb.Skipf("openb nodes: %v", err)
	}
	tasks, err := LoadTasks(filepath.Join(d, "openb", "openb_pod_list_default.csv"))
	if err != nil {
		tb.Skipf("openb tasks: %v", err)
	}
	return nodes, tasks
}
