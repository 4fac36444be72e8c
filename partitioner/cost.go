package partitioner

import (
	"errors"
	"math"

	pb "github.com/prism-serve/prism/internal/onnxpb"
)

// CostModel prices a placement in nanoseconds per sample: the network
// time of every tensor that crosses the cut (sent once, however many
// dense nodes read it) plus each node's compute on the side it lands on.
type CostModel struct {
	// NetGbps is the CPU-to-GPU tier bandwidth (default 100, one RNIC
	// share of Prism's 200 Gb/s NICs).
	NetGbps float64 `json:"net_gbps"`
	// CPUGFlops is sustained CPU throughput per sample stream (default 20).
	CPUGFlops float64 `json:"cpu_gflops"`
	// GPUGFlops is sustained GPU throughput (default 20000).
	GPUGFlops float64 `json:"gpu_gflops"`
	// GPULaunchMicros is the fixed cost of one GPU kernel (default 5).
	GPULaunchMicros float64 `json:"gpu_launch_us"`
	// Batch amortises the launch cost over samples (default 256).
	Batch int `json:"batch"`
	// UnknownBytes is charged per sample for a tensor whose shape cannot
	// be inferred, and UnknownFLOPs for such a node (defaults 1 MiB and
	// 1 GFLOP: conservatively, so the cut avoids them).
	UnknownBytes int64 `json:"unknown_bytes"`
	UnknownFLOPs int64 `json:"unknown_flops"`
}

// EnsureDefaults fills zero fields with the defaults.
func (c *CostModel) EnsureDefaults() {
	if c.NetGbps == 0 {
		c.NetGbps = 100
	}
	if c.CPUGFlops == 0 {
		c.CPUGFlops = 20
	}
	if c.GPUGFlops == 0 {
		c.GPUGFlops = 20000
	}
	if c.GPULaunchMicros == 0 {
		c.GPULaunchMicros = 5
	}
	if c.Batch == 0 {
		c.Batch = 256
	}
	if c.UnknownBytes == 0 {
		c.UnknownBytes = 1 << 20
	}
	if c.UnknownFLOPs == 0 {
		c.UnknownFLOPs = 1 << 30
	}
}

// Validate reports a field out of range.
func (c *CostModel) Validate() error {
	if !(c.NetGbps > 0) || !(c.CPUGFlops > 0) || !(c.GPUGFlops > 0) || c.GPULaunchMicros < 0 || c.Batch <= 0 || math.IsInf(c.NetGbps+c.CPUGFlops+c.GPUGFlops, 0) {
		return errors.New("cost model: bandwidth, FLOP rates and batch must be positive")
	}
	return nil
}

// costScale turns nanoseconds into the integer capacities of the flow
// network (picoseconds), so max-flow is exact.
const costScale = 1000

// bytesCost is the network time of sending b bytes per sample.
func (c *CostModel) bytesCost(b int64) int64 {
	return int64(math.Ceil(float64(b) * 8 / c.NetGbps * costScale))
}

// cpuCost and gpuCost are a node's compute time per sample on each side.
func (c *CostModel) cpuCost(flops int64, view bool) int64 {
	if view {
		return 0
	}
	return int64(math.Ceil(float64(flops) / c.CPUGFlops * costScale))
}

func (c *CostModel) gpuCost(flops int64, view bool) int64 {
	if view {
		return 0
	}
	launch := c.GPULaunchMicros * 1000 / float64(c.Batch)
	return int64(math.Ceil((float64(flops)/c.GPUGFlops + launch) * costScale))
}

// viewOps change only a tensor's shape metadata: free on either side.
var viewOps = map[string]bool{"Identity": true, "Reshape": true, "Flatten": true, "Squeeze": true, "Unsqueeze": true, "Constant": true, "Shape": true, "Dropout": true}

// heavyOps are pinned to the dense (GPU) side.
var heavyOps = map[string]bool{"MatMul": true, "Gemm": true, "Conv": true, "ConvTranspose": true, "Attention": true, "MultiHeadAttention": true, "Einsum": true, "LSTM": true, "GRU": true, "RNN": true, "MatMulInteger": true, "QLinearMatMul": true}

// nodeFLOPs estimates one node's floating-point work per sample and
// whether the estimate rests on known shapes.
func nodeFLOPs(g *Graph, n *pb.NodeProto, types map[string]TensorType) (int64, bool) {
	outT := types[firstOutput(n)]
	outN, ok := outT.PerSample()
	if !ok {
		return 0, false
	}
	inN := func(i int) (int64, bool) {
		if i >= len(n.GetInput()) {
			return 0, false
		}
		return types[n.GetInput()[i]].PerSample()
	}
	switch op := n.GetOpType(); {
	case op == "Gemm":
		a := types[n.GetInput()[0]]
		if !a.Known || len(a.Dims) != 2 {
			return 0, false
		}
		k := a.Dims[1]
		if attrInt(n, "transA", 0) == 1 {
			k = a.Dims[0]
		}
		if k < 0 {
			return 0, false
		}
		return 2*outN*k + outN, true
	case op == "MatMul":
		a := types[n.GetInput()[0]]
		if !a.Known || len(a.Dims) == 0 {
			return 0, false
		}
		k := a.Dims[len(a.Dims)-1]
		if k < 0 {
			return 0, false
		}
		return 2 * outN * k, true
	case viewOps[op]:
		return 0, true
	case op == "Sigmoid" || op == "Tanh" || op == "Exp" || op == "Log" || op == "Erf" || op == "Gelu" || op == "Softmax" || op == "LogSoftmax" || op == "LayerNormalization":
		return 4 * outN, true
	case len(op) > 6 && op[:6] == "Reduce":
		in, ok := inN(0)
		return in, ok
	case op == "Gather" || op == "Concat" || op == "Transpose" || op == "Slice" || op == "Cast":
		// Data movement: an element copied costs about one FLOP here.
		return outN, true
	default:
		// Element-wise ops and anything else with a known output.
		return outN, true
	}
}

func firstOutput(n *pb.NodeProto) string {
	if len(n.GetOutput()) == 0 {
		return ""
	}
	return n.GetOutput()[0]
}

// paramBytes is the size of the initializers a node reads.
func paramBytes(g *Graph, n *pb.NodeProto, seen map[string]bool) int64 {
	var b int64
	for _, in := range n.GetInput() {
		if t, ok := g.Inits[in]; ok && !seen[in] {
			seen[in] = true
			if s, ok := pb.ByteSize(t); ok {
				b += s
			}
		}
	}
	return b
}
