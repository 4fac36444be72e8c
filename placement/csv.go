package placement

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// csvTable reads a CSV with a header row and resolves columns by name, so
// errors can name the file, line and column.
type csvTable struct {
	name string
	r    *csv.Reader
	cols map[string]int
}

func newCSVTable(name string, r io.Reader, required ...string) (*csvTable, error) {
	cr := csv.NewReader(r)
	cr.ReuseRecord = true
	cr.FieldsPerRecord = -1
	head, err := cr.Read()
	if err == io.EOF {
		return nil, fmt.Errorf("%s: empty file, want a header row", name)
	}
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	t := &csvTable{name: name, r: cr, cols: map[string]int{}}
	for i, h := range head {
		t.cols[strings.TrimSpace(strings.TrimPrefix(h, "\ufeff"))] = i
	}
	for _, c := range required {
		if _, ok := t.cols[c]; !ok {
			return nil, fmt.Errorf("%s:1: missing column %q", name, c)
		}
	}
	return t, nil
}

// row is one record with its line number.
type row struct {
	t    *csvTable
	rec  []string
	line int
}

func (t *csvTable) next() (*row, error) {
	rec, err := t.r.Read()
	if err == io.EOF {
		return nil, io.EOF
	}
	if err != nil {
		var pe *csv.ParseError
		if errors.As(err, &pe) {
			return nil, fmt.Errorf("%s:%d: %w", t.name, pe.Line, pe.Err)
		}
		return nil, fmt.Errorf("%s: %w", t.name, err)
	}
	line, _ := t.r.FieldPos(0)
	return &row{t: t, rec: rec, line: line}, nil
}

func (r *row) str(col string) string {
	i, ok := r.t.cols[col]
	if !ok || i >= len(r.rec) {
		return ""
	}
	return strings.TrimSpace(r.rec[i])
}

func (r *row) errf(format string, a ...any) error {
	return fmt.Errorf("%s:%d: %s", r.t.name, r.line, fmt.Sprintf(format, a...))
}

func (r *row) int(col string) (int64, error) {
	s := r.str(col)
	if s == "" {
		return 0, r.errf("column %q is empty", col)
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		// Some exports write integers as floats ("12000.0").
		f, ferr := strconv.ParseFloat(s, 64)
		if ferr != nil || f != float64(int64(f)) {
			return 0, r.errf("column %q: %q is not an integer", col, s)
		}
		v = int64(f)
	}
	if v < 0 {
		return 0, r.errf("column %q: negative value %d", col, v)
	}
	return v, nil
}

// ReadNodesCSV reads nodes in the openb layout: sn,cpu_milli,memory_mib,
// gpu,model (an optional rnic column gives RNICs per node).
func ReadNodesCSV(name string, r io.Reader) ([]Node, error) {
	t, err := newCSVTable(name, r, "sn", "cpu_milli", "memory_mib", "gpu", "model")
	if err != nil {
		return nil, err
	}
	var nodes []Node
	for {
		rw, err := t.next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
		n := Node{Name: rw.str("sn"), Model: rw.str("model")}
		if n.CPUMilli, err = rw.int("cpu_milli"); err != nil {
			return nil, err
		}
		if n.MemMiB, err = rw.int("memory_mib"); err != nil {
			return nil, err
		}
		g, err := rw.int("gpu")
		if err != nil {
			return nil, err
		}
		if g > MaxGPUsPerNode {
			return nil, rw.errf("node %q has %d gpus, at most %d supported", n.Name, g, MaxGPUsPerNode)
		}
		n.GPUs = int(g)
		if rw.str("rnic") != "" {
			v, err := rw.int("rnic")
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
	t, err := newCSVTable(name, r, "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
	if err != nil {
		return nil, err
	}
	var tasks []Task
	for {
		rw, err := t.next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
		k := Task{Name: rw.str("name")}
		if k.Name == "" {
			k.Name = fmt.Sprintf("task-%d", len(tasks))
		}
		if k.CPUMilli, err = rw.int("cpu_milli"); err != nil {
			return nil, err
		}
		if k.MemMiB, err = rw.int("memory_mib"); err != nil {
			return nil, err
		}
		g, err := rw.int("num_gpu")
		if err != nil {
			return nil, err
		}
		k.GPUs = int(g)
		if k.GPUMilli, err = rw.int("gpu_milli"); err != nil {
			return nil, err
		}
		if spec := rw.str("gpu_spec"); spec != "" {
			for _, m := range strings.Split(spec, "|") {
				if m = strings.TrimSpace(m); m != "" {
					k.Models = append(k.Models, m)
				}
			}
		}
		if err := k.Validate(); err != nil {
			return nil, rw.errf("%v", err)
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
