package plan

import (
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

// FuzzRead reads arbitrary bytes as plan.json. Read answers a plan or an
// error, never panics; a plan it accepts keeps every file inside the
// folder and every size within the bounds the tiers rely on, and writes
// and reads back unchanged.
func FuzzRead(f *testing.F) {
	// Valid plans of every kind the tests build (each must read, or the
	// seed would be refused at the first check and reach nothing):
	// plain, sharded, jagged, with pre-lookup ops, multi-task.
	packed := valid()
	packedWeights(packed, "w_1")
	packed.Tables[0].Lookups[0].Input, packed.Tables[0].Lookups[0].Pre = "packed", packedPre(3)
	tasks := valid()
	tasks.Outputs[0].Shape = []int64{3}
	for _, p := range []*Plan{valid(), shardedPlan(), jaggedPlan(), packed, tasks} {
		good, err := json.Marshal(p)
		if err != nil {
			f.Fatal(err)
		}
		dir := f.TempDir()
		if err := os.WriteFile(filepath.Join(dir, File), good, 0o644); err != nil {
			f.Fatal(err)
		}
		if _, err := Read(dir); err != nil {
			f.Fatalf("seed plan %s: %v", good, err)
		}
		f.Add(good)
	}
	f.Add([]byte(`{"version":1}`))
	f.Add([]byte(`{"version":1,"dense_model":"../dense.onnx"}`))
	f.Add([]byte(`{"version":1,"dense_model":"/etc/passwd"}`))
	f.Add([]byte(`{"version":1,"dense_model":"d.onnx","inputs":[{"name":"x","dtype":"float32","shape":[4294967296,4294967296]}],"outputs":[{"name":"y","dtype":"float32"}]}`))
	f.Add([]byte(`{"version":1,"dense_model":"d.onnx","inputs":[{"name":"x","dtype":"int64"}],"outputs":[{"name":"y","dtype":"float32"}],"tables":[{"name":"t","file":"t.arrow","rows":9223372036854775807,"dim":8,"lookups":[{"input":"x","bag":1,"pooling":"sum","output":"e"}]}]}`))
	f.Add([]byte(`null`))
	f.Add([]byte(`[]`))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, File), b, 0o644); err != nil {
			t.Fatal(err)
		}
		p, err := Read(dir)
		if err != nil {
			return
		}
		for _, rel := range append([]string{p.DenseModel, p.CPUModel}, tableFiles(p)...) {
			if rel != "" && !filepath.IsLocal(rel) {
				t.Fatalf("accepted file %q outside the plan folder", rel)
			}
		}
		for _, tab := range p.Tables {
			if tab.Dim <= 0 || tab.Rows <= 0 || tab.Rows > math.MaxInt64/4/int64(tab.Dim) {
				t.Fatalf("accepted table %q of %d x %d", tab.Name, tab.Rows, tab.Dim)
			}
		}
		for _, ti := range tensors(p) {
			n := int64(1)
			for _, d := range ti.Shape {
				if d < -1 {
					t.Fatalf("accepted tensor %q of shape %v", ti.Name, ti.Shape)
				}
				if d > 0 {
					n *= d
				}
				if n > MaxSampleElements {
					t.Fatalf("accepted tensor %q of shape %v", ti.Name, ti.Shape)
				}
			}
		}
		out := t.TempDir()
		if err := Write(out, p); err != nil {
			t.Fatalf("a plan Read accepts, Write refuses: %v", err)
		}
		q, err := Read(out)
		if err != nil {
			t.Fatalf("a plan Write wrote, Read refuses: %v", err)
		}
		if !reflect.DeepEqual(normalize(t, p), normalize(t, q)) {
			t.Fatalf("plan changed in a write and read:\n%+v\n%+v", p, q)
		}
	})
}

func tableFiles(p *Plan) []string {
	var out []string
	for _, t := range p.Tables {
		out = append(out, t.File)
	}
	return out
}

func tensors(p *Plan) []TensorInfo {
	out := append(append([]TensorInfo(nil), p.Inputs...), p.Outputs...)
	for _, c := range p.Cut {
		out = append(out, c.TensorInfo)
	}
	return out
}

// normalize is p as JSON decoded into a generic value, so that nil and
// empty slices (which JSON does not tell apart after omitempty) compare
// equal.
func normalize(t *testing.T, p *Plan) any {
	b, err := json.Marshal(p)
	if err != nil {
		t.Fatal(err)
	}
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	return v
}
