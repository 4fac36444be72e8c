package partitioner

import (
	"cmp"
	"math"
	"slices"

	"google.golang.org/protobuf/proto"

	pb "github.com/prism-serve/prism/internal/onnxpb"
	"github.com/prism-serve/prism/plan"
)

// inputKeys works out, for each integer model input whose ids reach a
// lookup through a key map (pre.onnx's Gather on a 1-D integer constant:
// HugeCTR's key_to_indice_hash_all_tables, a vocabulary), the keys that
// map to valid rows of every table the input reaches (plan.TensorInfo
// Keys): drawing ids in [0, rows) for such an input, as for a plain
// one, sends keys of other tables, or past the map, to rows out of
// bounds. An input some lookup reads through native pre-lookup ops or
// as a jagged bag gets none (their ranges come from the ops), nor does
// one no key map reads, nor one whose valid keys are the ids drawn
// without them, [0, the fewest rows). dir resolves a map's external data.
func (pl *Placement) inputKeys(dir string) map[string][]plan.KeyRange {
	sets := map[string][]plan.KeyRange{}
	mapped := map[string]bool{}
	skip := map[string]bool{}
	minRows := map[string]int64{} // the ids a plain draw takes: [0, the fewest rows)
	narrow := func(in string, s []plan.KeyRange) {
		if cur, ok := sets[in]; ok {
			s = intersectKeys(cur, s)
		}
		sets[in] = s
	}
	for _, l := range pl.Lookups {
		rows := []plan.KeyRange{{Lo: 0, Hi: l.table.rows}}
		for _, in := range append([]string{l.ids}, l.preInputs...) {
			if r, ok := minRows[in]; !ok || l.table.rows < r {
				minRows[in] = l.table.rows
			}
		}
		switch {
		case l.offsets != "" || len(l.pre) > 0:
			skip[l.ids] = true
		case l.preOut == "":
			narrow(l.ids, rows)
		default:
			in, s, ok := pl.keyChain(dir, l.preOut, rows)
			if !ok {
				// Work the walk does not follow: every input it reads is
				// drawn as ids of the table, as PlanSignature does.
				for _, in := range l.preInputs {
					narrow(in, rows)
				}
				continue
			}
			narrow(in, s)
			mapped[in] = true
		}
	}
	out := map[string][]plan.KeyRange{}
	for in, s := range sets {
		if !mapped[in] || skip[in] || len(s) == 0 || !isInt(pl.Types[in].Elem) {
			continue
		}
		if len(s) == 1 && s[0] == (plan.KeyRange{Lo: 0, Hi: minRows[in]}) {
			continue // what the input's ids are drawn from without keys
		}
		out[in] = trimKeys(s, plan.MaxKeyRanges)
	}
	return out
}

// keyChain walks back from the ids tensor name to the one model input
// they come from, through ops that move values (a column pick, slices,
// reshapes, transposes), integer casts and key maps, and returns that
// input and the set of its values that end in valid, the ids wanted.
// ok is false for any other op on the way, or when no key map is on it.
func (pl *Placement) keyChain(dir, name string, valid []plan.KeyRange) (string, []plan.KeyRange, bool) {
	g := pl.G
	mapped := false
	for depth := 0; depth <= 64; depth++ {
		if g.IsInput(name) {
			return name, valid, mapped && len(valid) > 0
		}
		i, ok := g.Producer[name]
		if !ok {
			return "", nil, false
		}
		n := g.Nodes[i]
		ins := n.GetInput()
		if len(ins) == 0 {
			return "", nil, false
		}
		for _, in := range ins[1:] {
			if in != "" && !g.isConst(in) && n.GetOpType() != "Gather" {
				return "", nil, false
			}
		}
		switch n.GetOpType() {
		case "Identity", "Squeeze", "Unsqueeze", "Reshape", "Flatten", "Slice", "Transpose", "Split":
			name = ins[0]
		case "Cast":
			if !isInt(pl.Types[ins[0]].Elem) {
				return "", nil, false
			}
			switch pb.TensorProto_DataType(attrInt(n, "to", 0)) {
			case pb.TensorProto_INT64:
			case pb.TensorProto_INT32:
				valid = intersectKeys(valid, []plan.KeyRange{{Lo: math.MinInt32, Hi: math.MaxInt32 + 1}})
			default:
				return "", nil, false
			}
			name = ins[0]
		case "Gather":
			if len(ins) != 2 {
				return "", nil, false
			}
			data, idx := ins[0], ins[1]
			switch {
			case g.isConst(data) && !g.isConst(idx):
				m, ok := pl.keyMap(dir, data)
				if !ok || attrInt(n, "axis", 0) != 0 {
					return "", nil, false
				}
				valid, mapped = preimage(m, valid), true
				name = idx
			case !g.isConst(data) && g.isConst(idx):
				name = data // a column pick (axis past the batch's: pre.onnx checked)
			default:
				return "", nil, false
			}
		default:
			return "", nil, false
		}
	}
	return "", nil, false
}

// keyMap reads a 1-D integer constant, from external data (resolved
// against dir) if need be.
func (pl *Placement) keyMap(dir, name string) ([]int64, bool) {
	g := pl.G
	if t, ok := g.Inits[name]; ok && t.GetDataLocation() == pb.TensorProto_EXTERNAL {
		if len(t.GetDims()) != 1 || !isInt(pb.TensorProto_DataType(t.GetDataType())) {
			return nil, false
		}
		c := proto.Clone(t).(*pb.TensorProto)
		if err := pb.LoadData(c, dir); err != nil {
			return nil, false
		}
		v, err := pb.Int64s(c)
		return v, err == nil
	}
	v, dims, ok := g.constTensor(name)
	if !ok || len(dims) != 1 {
		return nil, false
	}
	return v, true
}

// preimage is the keys k in [0, len(m)) with m[k] in s, as sorted,
// disjoint ranges (negative keys, which Gather also takes, left out).
func preimage(m []int64, s []plan.KeyRange) []plan.KeyRange {
	var out []plan.KeyRange
	for k, v := range m {
		if !plan.HasKey(s, v) {
			continue
		}
		if n := len(out); n > 0 && out[n-1].Hi == int64(k) {
			out[n-1].Hi++
		} else {
			out = append(out, plan.KeyRange{Lo: int64(k), Hi: int64(k) + 1})
		}
	}
	return out
}

// intersectKeys is the keys in both a and b (each sorted, disjoint).
func intersectKeys(a, b []plan.KeyRange) []plan.KeyRange {
	var out []plan.KeyRange
	for i, j := 0, 0; i < len(a) && j < len(b); {
		lo, hi := max(a[i].Lo, b[j].Lo), min(a[i].Hi, b[j].Hi)
		if lo < hi {
			out = append(out, plan.KeyRange{Lo: lo, Hi: hi})
		}
		if a[i].Hi < b[j].Hi {
			i++
		} else {
			j++
		}
	}
	return out
}

// trimKeys keeps the n largest ranges of s (the earliest among equals),
// in order: a sample of the valid keys that keeps the most of them.
func trimKeys(s []plan.KeyRange, n int) []plan.KeyRange {
	if len(s) <= n {
		return s
	}
	idx := make([]int, len(s))
	for i := range idx {
		idx[i] = i
	}
	slices.SortStableFunc(idx, func(a, b int) int { return cmp.Compare(s[b].Len(), s[a].Len()) })
	idx = idx[:n]
	slices.Sort(idx)
	out := make([]plan.KeyRange, n)
	for k, i := range idx {
		out[k] = s[i]
	}
	return out
}
