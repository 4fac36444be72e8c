package partitioner

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	pb "github.com/prism-serve/prism/internal/onnxpb"
)

// TestTraceIDsMalformed feeds the id tracing malformed ONNX nodes
// (missing inputs, constants whose values do not fill their dims): each
// answers why the ids are not taken, never a panic. known names the
// tensors typed int64 [batch] (bool for a condition) over what shape
// inference found, as a model declaring its shapes would have them, so
// the tracing reaches the malformed node.
func TestTraceIDsMalformed(t *testing.T) {
	const head = "input e int64 [N]\ninput ids int64 [N,3]\n"
	for _, c := range []struct {
		name, graph, ids string
		known            []string
		reason           string
	}{
		{"where-two-inputs", `
init unk int64 [] = -1
node Equal e,unk -> isunk
node Where isunk,e -> ew`, "ew", []string{"ew"}, `Where (node "ew"): 2 inputs, want 3`},
		{"where-one-input", `
init unk int64 [] = -1
node Equal e,unk -> isunk
node Where isunk -> ew`, "ew", []string{"ew"}, `Where (node "ew"): 1 inputs, want 3`},
		{"equal-one-input", `
init dflt int64 [] = 0
node Equal e -> isunk
node Where isunk,dflt,e -> ew`, "ew", []string{"ew", "isunk"}, "only Where(Equal(ids, c), default, ids)"},
		{"where-scalar-of-two-values", `
init unk int64 [] = -1,-2
init dflt int64 [] = 0
node Equal e,unk -> isunk
node Where isunk,dflt,e -> ew`, "ew", nil, "only Where(Equal(ids, c), default, ids) with scalar constants"},
		{"gather-without-indices", `
node Gather ids -> col axis=1`, "col", []string{"col"}, `Gather (node "col"): 1 inputs, want 2`},
		{"gather-indices-short", `
init k int64 [2] = 1
node Gather ids,k -> col axis=1`, "col", []string{"col"}, "its indices are not a constant"},
		{"clip-bound-of-two-values", `
init lo int64 [] = 0,1
node Clip e,lo -> c`, "c", nil, "its bounds are not scalar constants"},
		{"add-constant-short", `
init offsets int64 [3] = 0,1000
node Add ids,offsets -> fid`, "fid", nil, "one side must be a constant"},
	} {
		t.Run(c.name, func(t *testing.T) {
			m, err := parseGraph(head + c.graph)
			if err != nil {
				t.Fatal(err)
			}
			g, err := NewGraph(m)
			if err != nil {
				t.Fatal(err)
			}
			types, _ := InferShapes(g)
			for _, k := range c.known {
				elem := pb.TensorProto_INT64
				if k == "isunk" {
					elem = pb.TensorProto_BOOL
				}
				types[k] = known(elem, DimBatch)
			}
			var got error
			func() {
				defer func() {
					if r := recover(); r != nil {
						got = fmt.Errorf("panic: %v", r)
					}
				}()
				_, got = traceIDs(g, types, c.ids)
			}()
			var not *notIDs
			if !errors.As(got, &not) || !strings.Contains(not.reason, c.reason) {
				t.Errorf("traceIDs: %v, want the ids not taken because %q", got, c.reason)
			}
		})
	}
}
