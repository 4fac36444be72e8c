package partitioner_test

import (
	"fmt"
	"path/filepath"
	"runtime/debug"
	"testing"

	"google.golang.org/protobuf/proto"

	pb "github.com/prism-serve/prism/internal/onnxpb"
	"github.com/prism-serve/prism/models/exporters"
	"github.com/prism-serve/prism/partitioner"
)

// TestMutatedModelsDoNotPanic truncates one node's inputs/outputs/attributes at a
// time (outer graph and bodies) and partitions the result: an error is
// fine, a panic is not.
func TestMutatedModelsDoNotPanic(t *testing.T) {
	var all []*exporters.Model
	all = append(all, exporters.Corpus(5)...)
	all = append(all, exporters.Broken(5)...)
	all = append(all, exporters.FixedBatch(5)...)
	all = append(all, exporters.Fallback(5)...)
	dir := t.TempDir()
	seen := map[string]bool{}
	for _, m := range all {
		var nodes []*pb.NodeProto
		var walk func(g *pb.GraphProto)
		walk = func(g *pb.GraphProto) {
			for _, n := range g.GetNode() {
				nodes = append(nodes, n)
				for _, a := range n.GetAttribute() {
					if a.GetG() != nil {
						walk(a.GetG())
					}
				}
			}
		}
		walk(m.Proto.GetGraph())
		for ni := range nodes {
			for mut := 0; mut < 11; mut++ {
				c := proto.Clone(m.Proto).(*pb.ModelProto)
				var cn []*pb.NodeProto
				var w2 func(g *pb.GraphProto)
				w2 = func(g *pb.GraphProto) {
					for _, n := range g.GetNode() {
						cn = append(cn, n)
						for _, a := range n.GetAttribute() {
							if a.GetG() != nil {
								w2(a.GetG())
							}
						}
					}
				}
				w2(c.GetGraph())
				n := cn[ni]
				switch {
				case mut < 4:
					if mut >= len(n.Input) {
						continue
					}
					n.Input = n.Input[:mut]
				case mut == 4:
					n.Output = nil
				case mut == 5:
					n.Attribute = nil
				case mut == 6:
					if len(n.Input) == 0 {
						continue
					}
					n.Input = append(n.Input, n.Input[0], n.Input[0])
				case mut == 8:
					if len(n.Input) == 0 {
						continue
					}
					n.Input[0] = ""
				case mut == 9:
					if len(n.Input) < 2 {
						continue
					}
					n.Input[1] = ""
				case mut == 10:
					if len(n.Output) == 0 {
						continue
					}
					n.Output[0] = ""
				case mut == 7:
					for _, a := range n.Attribute {
						a.I = 99
						a.Ints = []int64{99}
					}
				}
				key := fmt.Sprintf("%s/%s/%d", m.Name, n.GetOpType(), mut)
				p := filepath.Join(dir, "m.onnx")
				if err := pb.WriteModel(p, c, pb.WriteOptions{}); err != nil {
					t.Fatal(err)
				}
				func() {
					defer func() {
						if r := recover(); r != nil {
							if !seen[key] {
								seen[key] = true
								t.Errorf("%s node %d (%s %s) mutation %d: panic %v\n%s", m.Name, ni, n.GetOpType(), n.GetName(), mut, r, debug.Stack())
							}
						}
					}()
					partitioner.Partition(p, filepath.Join(dir, "out"), partitioner.Options{ReportOnly: true})
				}()
			}
		}
	}
}
