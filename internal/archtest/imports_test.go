// Package archtest holds the import rules of docs/architecture.md as a
// test, so the layering cannot rot unnoticed: it lists every package of
// the module with `go list` and checks what each imports (test files
// excluded: tests may reach across to set up real peers).
package archtest

import (
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/prism-serve/prism/"

type pkg struct {
	ImportPath string
	Imports    []string
}

// imports maps each package of the module (short path) to the packages
// of the module it imports, directly and through others.
func imports(t *testing.T) map[string][]string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("go command not found: cannot list packages")
	}
	out, err := exec.Command(goBin, "list", "-deps=false", "-json", module+"...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	direct := map[string][]string{}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for {
		var p pkg
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		name := strings.TrimPrefix(p.ImportPath, module)
		for _, imp := range p.Imports {
			if strings.HasPrefix(imp, module) {
				direct[name] = append(direct[name], strings.TrimPrefix(imp, module))
			}
		}
		if _, ok := direct[name]; !ok {
			direct[name] = nil
		}
	}
	all := map[string][]string{}
	var walk func(p string, seen map[string]bool)
	walk = func(p string, seen map[string]bool) {
		for _, d := range direct[p] {
			if !seen[d] {
				seen[d] = true
				walk(d, seen)
			}
		}
	}
	for p := range direct {
		seen := map[string]bool{}
		walk(p, seen)
		for d := range seen {
			all[p] = append(all[p], d)
		}
		slices.Sort(all[p])
	}
	return all
}

func under(p string, roots ...string) bool {
	for _, r := range roots {
		if p == r || strings.HasPrefix(p, r+"/") {
			return true
		}
	}
	return false
}

func TestImportRules(t *testing.T) {
	deps := imports(t)
	if len(deps) < 20 {
		t.Fatalf("go list found %d packages; expected the whole module", len(deps))
	}
	tiers := []string{"router", "cpuserve/server", "gpuserve"}
	isTier := func(p string) bool { return slices.Contains(tiers, p) }
	rules := []struct {
		name string
		// applies says which packages the rule constrains.
		applies func(p string) bool
		// banned says which dependencies break it.
		banned func(p, dep string) bool
	}{
		{"the tiers meet only through api/prismv1", isTier,
			func(p, dep string) bool { return isTier(dep) }},
		{"only commands import a tier", func(p string) bool { return !under(p, "cmd") },
			func(p, dep string) bool { return isTier(dep) }},
		{"no tier links the partitioner", func(p string) bool { return !under(p, "cmd", "partitioner") },
			func(p, dep string) bool { return under(dep, "partitioner") }},
		{"plan imports only leaves of Prism (packages importing nothing of Prism: internal/atomicfile)", func(p string) bool { return p == "plan" },
			func(p, dep string) bool { return len(deps[dep]) > 0 }},
		{"the zoo, the compiler and placement import no server", func(p string) bool { return under(p, "models", "partitioner", "placement") },
			func(p, dep string) bool { return under(dep, "internal/serve", "router", "cpuserve", "gpuserve") }},
		{"internal/ort is free of the zoo", func(p string) bool { return p == "internal/ort" },
			func(p, dep string) bool { return under(dep, "models") }},
		{"byte formats do not link the ONNX protobuf", func(p string) bool { return p == "internal/arrowframe" || p == "internal/tablefile" },
			func(p, dep string) bool { return dep == "internal/onnxpb" }},
		{"the capacity controller imports nothing of Prism", func(p string) bool { return p == "capacity" },
			func(p, dep string) bool { return true }},
		{"capacity loaning imports no server and no tier", func(p string) bool { return under(p, "capacity") },
			func(p, dep string) bool {
				return under(dep, "internal/serve", "router", "cpuserve", "gpuserve", "partitioner")
			}},
		{"tune drives prism as processes: no server linked", func(p string) bool { return p == "tune" },
			func(p, dep string) bool {
				return under(dep, "internal/serve", "internal/up", "router", "cpuserve", "gpuserve", "partitioner")
			}},
		{"only commands link client-go (internal/kubelease, capacity/kube)", func(p string) bool { return !under(p, "cmd", "internal/kubelease", "capacity/kube") },
			func(p, dep string) bool { return dep == "internal/kubelease" || dep == "capacity/kube" }},
		{"the kubernetes lender is a lender: the controller and nothing of the serving path", func(p string) bool { return p == "capacity/kube" },
			func(p, dep string) bool { return dep != "capacity" }},
		{"the load generator speaks the public API only", func(p string) bool { return p == "loadgen" },
			func(p, dep string) bool {
				return under(dep, "internal/serve", "router", "cpuserve", "gpuserve", "partitioner")
			}},
	}
	for _, r := range rules {
		var broken []string
		for p, ds := range deps {
			if !r.applies(p) {
				continue
			}
			for _, d := range ds {
				if r.banned(p, d) {
					broken = append(broken, fmt.Sprintf("%s -> %s", p, d))
				}
			}
		}
		slices.Sort(broken)
		if len(broken) > 0 {
			t.Errorf("%s: broken by %s", r.name, strings.Join(broken, ", "))
		}
	}
}
