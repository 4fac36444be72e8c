package partitioner

// flowNet is a directed graph with int64 capacities; maxFlow runs Dinic's
// algorithm, exact for integer capacities.
type flowNet struct {
	head []int
	to   []int
	cap  []int64
	next []int
}

func newFlowNet(n int) *flowNet {
	h := make([]int, n)
	for i := range h {
		h[i] = -1
	}
	return &flowNet{head: h}
}

func (f *flowNet) addNode() int {
	f.head = append(f.head, -1)
	return len(f.head) - 1
}

// addEdge adds u->v with capacity c (and its residual twin).
func (f *flowNet) addEdge(u, v int, c int64) {
	f.to = append(f.to, v)
	f.cap = append(f.cap, c)
	f.next = append(f.next, f.head[u])
	f.head[u] = len(f.to) - 1
	f.to = append(f.to, u)
	f.cap = append(f.cap, 0)
	f.next = append(f.next, f.head[v])
	f.head[v] = len(f.to) - 1
}

// maxFlow pushes the maximum flow from s to t and returns its value.
func (f *flowNet) maxFlow(s, t int) int64 {
	n := len(f.head)
	level := make([]int, n)
	iter := make([]int, n)
	var total int64
	for {
		for i := range level {
			level[i] = -1
		}
		level[s] = 0
		q := []int{s}
		for len(q) > 0 {
			u := q[0]
			q = q[1:]
			for e := f.head[u]; e >= 0; e = f.next[e] {
				if f.cap[e] > 0 && level[f.to[e]] < 0 {
					level[f.to[e]] = level[u] + 1
					q = append(q, f.to[e])
				}
			}
		}
		if level[t] < 0 {
			return total
		}
		copy(iter, f.head)
		var dfs func(u int, limit int64) int64
		dfs = func(u int, limit int64) int64 {
			if u == t {
				return limit
			}
			for ; iter[u] >= 0; iter[u] = f.next[iter[u]] {
				e := iter[u]
				v := f.to[e]
				if f.cap[e] > 0 && level[v] == level[u]+1 {
					if d := dfs(v, min(limit, f.cap[e])); d > 0 {
						f.cap[e] -= d
						f.cap[e^1] += d
						return d
					}
				}
			}
			return 0
		}
		for {
			d := dfs(s, 1<<62)
			if d == 0 {
				break
			}
			total += d
		}
	}
}

// sourceSide returns the nodes reachable from s in the residual graph:
// after maxFlow, the source side of a minimum cut.
func (f *flowNet) sourceSide(s int) []bool {
	seen := make([]bool, len(f.head))
	seen[s] = true
	q := []int{s}
	for len(q) > 0 {
		u := q[0]
		q = q[1:]
		for e := f.head[u]; e >= 0; e = f.next[e] {
			if f.cap[e] > 0 && !seen[f.to[e]] {
				seen[f.to[e]] = true
				q = append(q, f.to[e])
			}
		}
	}
	return seen
}
