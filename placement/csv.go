package placement

import (
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/prism-serve/prism/internal/csvtab"
)

// ReadNodesCSV reads nodes in the openb layout: sn,cpu_milli,memory_mib,
// gpu,model (an optional rnic column gives RNICs per node).
func ReadNodesCSV(name string, r io.Reader) ([]Node, error) {
	t, err := csvtab.NewReader(name, r)
	if err != nil {
		return nil, err
	}
	if err := t.Require("sn", "cpu_milli", "memory_mib", "gpu", "model"); err != nil {
		return nil, err
	}
	var nodes []Node
	for {
		rw, err := t.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
		n := Node{Name: rw.Str("sn"), Model: rw.Str("model")}
		if n.CPUMilli, err = rw.Uint("cpu_milli"); err != nil {
			return nil, err
		}
		if n.MemMiB, err = rw.Uint("memory_mib"); err != nil {
			return nil, err
		}
		g, err := rw.Uint("gpu")
		if err != nil {
			return nil, err
		}
		if g > MaxGPUsPerNode {
			return nil, rw.Errorf("node %q has %d gpus, at most %d supported", n.Name, g, MaxGPUsPerNode)
		}
		n.GPUs = int(g)
		if rw.Str("rnic") != "" {
			v, err := rw.Uint("rnic")
			if err != nil {
				return nil, err
			}
			n.RNICs = int(v)
		}
		nodes = append(nodes, n)
	}
	if len(nodes) == 0 {
		return nil, fmt.Errorf("%s: no nodes", name)
	}
	return nodes, nil
}

// ReadTasksCSV reads tasks in the openb layout: name,cpu_milli,memory_mib,
// num_gpu,gpu_milli,gpu_spec,... (gpu_spec is a "|"-separated model list;
// other columns are ignored).
func ReadTasksCSV(name string, r io.Reader) ([]Task, error) {
	t, err := csvtab.NewReader(name, r)
	if err != nil {
		return nil, err
	}
	if err := t.Require("cpu_milli", "memory_mib", "num_gpu", "gpu_milli"); err != nil {
		return nil, err
	}
	var tasks []Task
	for {
		rw, err := t.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
		k := Task{Name: rw.Str("name")}
		if k.Name == "" {
			k.Name = fmt.Sprintf("task-%d", len(tasks))
		}
		if k.CPUMilli, err = rw.Uint("cpu_milli"); err != nil {
			return nil, err
		}
		if k.MemMiB, err = rw.Uint("memory_mib"); err != nil {
			return nil, err
		}
		g, err := rw.Uint("num_gpu")
		if err != nil {
			return nil, err
		}
		k.GPUs = int(g)
		if k.GPUMilli, err = rw.Uint("gpu_milli"); err != nil {
			return nil, err
		}
		if spec := rw.Str("gpu_spec"); spec != "" {
			for _, m := range strings.Split(spec, "|") {
				if m = strings.TrimSpace(m); m != "" {
					k.Models = append(k.Models, m)
				}
			}
		}
		if err := k.Validate(); err != nil {
			return nil, rw.Errorf("%v", err)
		}
		tasks = append(tasks, k)
	}
	if len(tasks) == 0 {
		return nil, fmt.Errorf("%s: no tasks", name)
	}
	return tasks, nil
}

// LoadNodes reads a node CSV file.
func LoadNodes(path string) ([]Node, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open nodes %q: %w", path, err)
	}
	defer f.Close()
	return ReadNodesCSV(path, f)
}

// LoadTasks reads a task CSV file.
func LoadTasks(path string) ([]Task, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open tasks %q: %w", path, err)
	}
	defer f.Close()
	return ReadTasksCSV(path, f)
}
