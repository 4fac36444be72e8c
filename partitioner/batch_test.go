package partitioner

import (
	"fmt"
	"strings"
	"testing"

	"github.com/cockroachdb/datadriven"
)

// TestDebatchDataDriven runs testdata/batch/*: a graph exported with a
// fixed batch (inputs declared with a number as their first dimension)
// in the text form of TestInferShapesDataDriven, and what Debatch makes
// of it: the Reshape/Expand shape constants it rewrites and the nodes
// that tie the graph to the exported batch.
//
//	debatch
//	<graph>
//	----
//	exported B                 (or: symbolic batch: nothing to do)
//	rewritten NODE: [shape]
//	blocker NODE (OP): REASON
//	input NAME [dims]          the inputs as declared after
func TestDebatchDataDriven(t *testing.T) {
	datadriven.Walk(t, "testdata/batch", func(t *testing.T, path string) {
		datadriven.RunTest(t, path, func(t *testing.T, d *datadriven.TestData) string {
			if d.Cmd != "debatch" {
				d.Fatalf(t, "unknown command %q", d.Cmd)
			}
			m, err := parseGraph(d.Input)
			if err != nil {
				d.Fatalf(t, "%v", err)
			}
			info, err := Debatch(m)
			if err != nil {
				return fmt.Sprintf("error: %v\n", err)
			}
			if info == nil {
				return "symbolic batch: nothing to do\n"
			}
			var b strings.Builder
			fmt.Fprintf(&b, "exported %d\n", info.Exported)
			shapes := map[string][]int64{}
			for _, t := range m.GetGraph().GetInitializer() {
				shapes[t.GetName()] = t.GetInt64Data()
			}
			for _, n := range m.GetGraph().GetNode() {
				for _, r := range info.Rewritten {
					if n.GetName() == r {
						fmt.Fprintf(&b, "rewritten %s: %v\n", r, shapes[n.GetInput()[1]])
					}
				}
			}
			for _, x := range info.Blockers {
				fmt.Fprintf(&b, "blocker %s (%s): %s\n", x.Node, x.Op, x.Reason)
			}
			for _, in := range m.GetGraph().GetInput() {
				var dims []string
				for _, d := range in.GetType().GetTensorType().GetShape().GetDim() {
					if p := d.GetDimParam(); p != "" {
						dims = append(dims, p)
					} else {
						dims = append(dims, fmt.Sprint(d.GetDimValue()))
					}
				}
				fmt.Fprintf(&b, "input %s [%s]\n", in.GetName(), strings.Join(dims, ","))
			}
			return b.String()
		})
	})
}
