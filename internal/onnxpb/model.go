package onnxpb

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"

	"google.golang.org/protobuf/proto"
)

// ReadOptions says how much of a model to materialise.
type ReadOptions struct {
	// SkipExternalData leaves externally stored tensors as references
	// (DataLocation EXTERNAL, no RawData). Their files are still checked
	// to exist and be long enough, so a broken model fails here and not
	// later in ONNX Runtime. Use it to read a model's structure cheaply.
	SkipExternalData bool
}

// ReadModel reads an ONNX model file and, unless opts says otherwise, loads
// every external-data initializer into RawData, so the returned model is
// self-contained. External paths are resolved against the model's folder,
// as ONNX Runtime does.
func ReadModel(path string, opts ReadOptions) (*ModelProto, error) {
	buf, err := os.ReadFile(path)
	if err != nil {
		if st, serr := os.Stat(path); serr == nil && st.IsDir() {
			return nil, fmt.Errorf("read model %q: %s", path, folderHint(path))
		}
		return nil, fmt.Errorf("read model %q: %w", path, err)
	}
	m, err := ParseModel(buf)
	if err != nil {
		return nil, fmt.Errorf("read model %q: %w", path, err)
	}
	if err := resolveExternal(m, filepath.Dir(path), opts); err != nil {
		return nil, fmt.Errorf("read model %q: %w", path, err)
	}
	return m, nil
}

// ParseModel decodes a serialized ModelProto and checks that it is one:
// protobuf happily decodes many non-ONNX byte strings into an empty message.
func ParseModel(buf []byte) (*ModelProto, error) {
	if len(buf) == 0 {
		return nil, errors.New("empty file, not an ONNX model")
	}
	m := &ModelProto{}
	if err := proto.Unmarshal(buf, m); err != nil {
		return nil, fmt.Errorf("not a valid ONNX protobuf (truncated or corrupt?): %w", err)
	}
	if m.GetIrVersion() <= 0 || m.GetGraph() == nil {
		return nil, errors.New("not an ONNX model: no ir_version or no graph")
	}
	if len(m.GetOpsetImport()) == 0 {
		return nil, errors.New("not an ONNX model: no opset_import")
	}
	return m, nil
}

// ExternalRef is one parsed external_data entry set of a tensor.
type ExternalRef struct {
	Location string
	Offset   int64
	Length   int64 // -1: to the end of the file
}

// External returns where t's data lives when it is stored externally. It
// checks what can be checked without the file: a location that is a
// local path (not absolute, no ".."), offset and length non-negative
// decimal integers, each given at most once, whose sum does not overflow.
// OpenExternal checks the rest against the file.
func External(t *TensorProto) (ExternalRef, bool, error) {
	if t.GetDataLocation() != TensorProto_EXTERNAL {
		return ExternalRef{}, false, nil
	}
	ref := ExternalRef{Length: -1}
	vals := map[string]string{}
	var twice string
	for _, kv := range t.GetExternalData() {
		switch k := kv.GetKey(); k {
		case "location", "offset", "length":
			if _, ok := vals[k]; ok && twice == "" {
				twice = k
			}
			if _, ok := vals[k]; !ok {
				vals[k] = kv.GetValue()
			}
		}
	}
	ref.Location = vals["location"]
	bad := func(format string, args ...any) (ExternalRef, bool, error) {
		return ref, true, fmt.Errorf("tensor %q: external data %q: %s", t.GetName(), ref.Location, fmt.Sprintf(format, args...))
	}
	if ref.Location == "" {
		return ref, true, fmt.Errorf("tensor %q: external data without a location", t.GetName())
	}
	if twice != "" {
		return bad("external_data %s given twice", twice)
	}
	if !filepath.IsLocal(ref.Location) {
		return bad("location must be a path inside the model's folder")
	}
	for _, k := range []string{"offset", "length"} {
		s, ok := vals[k]
		if !ok {
			continue
		}
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil || v < 0 {
			return bad("%s=%q is not a non-negative integer", k, s)
		}
		if k == "offset" {
			ref.Offset = v
		} else {
			ref.Length = v
		}
	}
	if ref.Length >= 0 && ref.Offset > math.MaxInt64-ref.Length {
		return bad("offset %d + length %d overflows", ref.Offset, ref.Length)
	}
	return ref, true, nil
}

// Tensors returns every tensor stored in the model: graph initializers and
// the values of Constant nodes (tensor attributes), in file order, and
// those of every subgraph (If branches, Loop and Scan bodies) likewise,
// as onnx.save with save_as_external_data walks them: their tensors go to
// the external data file too.
func Tensors(m *ModelProto) []*TensorProto { return graphTensors(nil, m.GetGraph()) }

func graphTensors(out []*TensorProto, g *GraphProto) []*TensorProto {
	out = append(out, g.GetInitializer()...)
	for _, n := range g.GetNode() {
		for _, a := range n.GetAttribute() {
			if a.GetT() != nil {
				out = append(out, a.GetT())
			}
			out = append(out, a.GetTensors()...)
			if a.GetG() != nil {
				out = graphTensors(out, a.GetG())
			}
			for _, sg := range a.GetGraphs() {
				out = graphTensors(out, sg)
			}
		}
	}
	return out
}

func resolveExternal(m *ModelProto, dir string, opts ReadOptions) error {
	files := map[string]*os.File{}
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	for _, t := range Tensors(m) {
		x, ok, err := openExternal(t, dir, files)
		if err != nil {
			return err
		}
		if !ok || opts.SkipExternalData {
			continue
		}
		raw, err := x.read()
		if err != nil {
			return err
		}
		t.RawData = raw
		t.DataLocation = TensorProto_DEFAULT
		t.ExternalData = nil
	}
	return nil
}

// extent is a checked external-data reference: bytes off..off+length of
// an open regular file inside the model's folder.
type extent struct {
	tensor string
	path   string
	f      *os.File
	off    int64
	length int64
}

func (x extent) read() ([]byte, error) {
	raw := make([]byte, x.length)
	if _, err := x.f.ReadAt(raw, x.off); err != nil && !(errors.Is(err, io.EOF) && x.length == 0) {
		return nil, fmt.Errorf("external data %q: tensor %q: %w", x.path, x.tensor, err)
	}
	return raw, nil
}

// openExternal checks t's external data against its file: the location
// resolved inside dir (a symlink leaving it is refused), a regular file,
// the extent inside it, and its length what t's dims and type need. files
// caches the open files by path (nil: the caller closes x.f). ok is false
// for a tensor stored inline.
func openExternal(t *TensorProto, dir string, files map[string]*os.File) (x extent, ok bool, err error) {
	ref, ext, err := External(t)
	if err != nil || !ext {
		return x, ext, err
	}
	x.tensor = t.GetName()
	x.path = filepath.Join(dir, ref.Location)
	real, err := resolveIn(dir, ref.Location)
	if err != nil {
		return x, true, fmt.Errorf("external data of tensor %q: %w", x.tensor, err)
	}
	if x.f = files[real]; x.f == nil {
		if x.f, err = os.Open(real); err != nil {
			return x, true, fmt.Errorf("external data of tensor %q: %w", x.tensor, err)
		}
		if files != nil {
			files[real] = x.f
		}
	}
	fail := func(err error) (extent, bool, error) {
		if files == nil {
			x.f.Close()
		}
		return extent{}, true, err
	}
	st, err := x.f.Stat()
	if err != nil {
		return fail(fmt.Errorf("external data %q of tensor %q: %w", x.path, x.tensor, err))
	}
	if !st.Mode().IsRegular() {
		return fail(fmt.Errorf("external data %q of tensor %q is not a regular file (%v)", x.path, x.tensor, st.Mode().Type()))
	}
	size := st.Size()
	if ref.Offset > size {
		return fail(fmt.Errorf("external data %q is %d bytes, tensor %q starts at offset %d: file truncated", x.path, size, x.tensor, ref.Offset))
	}
	x.off, x.length = ref.Offset, ref.Length
	if x.length < 0 {
		x.length = size - ref.Offset
	}
	if x.length > size-ref.Offset { // External checked that off+length does not overflow
		return fail(fmt.Errorf("external data %q is %d bytes, tensor %q needs bytes %d..%d: file truncated", x.path, size, x.tensor, ref.Offset, ref.Offset+x.length))
	}
	want, known, err := checkedByteSize(t)
	if err != nil {
		return fail(fmt.Errorf("external data %q: %w", x.path, err))
	}
	if known && x.length != want {
		return fail(fmt.Errorf("external data %q: tensor %q declares %d bytes, its shape needs %d", x.path, x.tensor, x.length, want))
	}
	return x, true, nil
}

// resolveIn resolves rel inside dir and refuses a path that leaves dir,
// lexically or through a symlink. It returns the resolved path.
func resolveIn(dir, rel string) (string, error) {
	if !filepath.IsLocal(rel) {
		return "", fmt.Errorf("%q is not a path inside %q", rel, dir)
	}
	root, err := filepath.EvalSymlinks(dir)
	if err != nil {
		return "", err
	}
	if root, err = filepath.Abs(root); err != nil {
		return "", err
	}
	real, err := filepath.EvalSymlinks(filepath.Join(dir, rel))
	if err != nil {
		return "", err
	}
	if real, err = filepath.Abs(real); err != nil {
		return "", err
	}
	if r, err := filepath.Rel(root, real); err != nil || !filepath.IsLocal(r) {
		return "", fmt.Errorf("%q leaves %q through a symlink (it resolves to %q)", rel, dir, real)
	}
	return real, nil
}

// LoadData loads t's external data (resolved against dir) into RawData,
// if it is stored externally.
func LoadData(t *TensorProto, dir string) error {
	x, ext, err := openExternal(t, dir, nil)
	if err != nil || !ext {
		return err
	}
	defer x.f.Close()
	raw, err := x.read()
	if err != nil {
		return err
	}
	t.RawData, t.DataLocation, t.ExternalData = raw, TensorProto_DEFAULT, nil
	return nil
}

// DataReader returns a reader of t's raw little-endian bytes, inline or
// external (resolved against dir), without loading them all, and their
// length. The caller closes it.
func DataReader(t *TensorProto, dir string) (io.ReadCloser, int64, error) {
	x, ext, err := openExternal(t, dir, nil)
	if err != nil {
		return nil, 0, err
	}
	if !ext {
		if err := ToRaw(t); err != nil {
			return nil, 0, err
		}
		return io.NopCloser(bytes.NewReader(t.RawData)), int64(len(t.RawData)), nil
	}
	return struct {
		io.Reader
		io.Closer
	}{io.NewSectionReader(x.f, x.off, x.length), x.f}, x.length, nil
}

// folderHint says what to give instead of folder dir: the model a
// prism models build folder holds, or for a partition folder (plan.json)
// its source model with --plan.
func folderHint(dir string) string {
	if _, err := os.Stat(filepath.Join(dir, "model.onnx")); err == nil {
		return fmt.Sprintf("a folder, not an ONNX file (give %s)", filepath.Join(dir, "model.onnx"))
	}
	if _, err := os.Stat(filepath.Join(dir, "plan.json")); err == nil {
		return "a partition folder, not an ONNX file (give the model it was partitioned from; prism score takes the folder as --plan)"
	}
	return "a folder, not an ONNX file"
}
