package onnxpb

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

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

// External returns where t's data lives when it is stored externally.
func External(t *TensorProto) (ExternalRef, bool, error) {
	if t.GetDataLocation() != TensorProto_EXTERNAL {
		return ExternalRef{}, false, nil
	}
	ref := ExternalRef{Length: -1}
	for _, kv := range t.GetExternalData() {
		switch kv.GetKey() {
		case "location":
			ref.Location = kv.GetValue()
		case "offset", "length":
			v, err := strconv.ParseInt(kv.GetValue(), 10, 64)
			if err != nil || v < 0 {
				return ref, true, fmt.Errorf("tensor %q: external_data %s=%q is not a non-negative integer", t.GetName(), kv.GetKey(), kv.GetValue())
			}
			if kv.GetKey() == "offset" {
				ref.Offset = v
			} else {
				ref.Length = v
			}
		}
	}
	if ref.Location == "" {
		return ref, true, fmt.Errorf("tensor %q: external data without a location", t.GetName())
	}
	if filepath.IsAbs(ref.Location) || strings.Contains(filepath.ToSlash(filepath.Clean(ref.Location)), "..") {
		return ref, true, fmt.Errorf("tensor %q: external data location %q must be a path inside the model's folder", t.GetName(), ref.Location)
	}
	return ref, true, nil
}

// Tensors returns every tensor stored in the model: graph initializers and
// the values of Constant nodes (tensor attributes), in file order.
func Tensors(m *ModelProto) []*TensorProto {
	g := m.GetGraph()
	out := append([]*TensorProto(nil), g.GetInitializer()...)
	for _, n := range g.GetNode() {
		for _, a := range n.GetAttribute() {
			if a.GetT() != nil {
				out = append(out, a.GetT())
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
		ref, ok, err := External(t)
		if err != nil {
			return err
		}
		if !ok {
			continue
		}
		path := filepath.Join(dir, ref.Location)
		f, ok := files[path]
		if !ok {
			f, err = os.Open(path)
			if err != nil {
				return fmt.Errorf("external data of tensor %q: %w", t.GetName(), err)
			}
			files[path] = f
		}
		st, err := f.Stat()
		if err != nil {
			return fmt.Errorf("external data %q: %w", path, err)
		}
		length := ref.Length
		if length < 0 {
			length = st.Size() - ref.Offset
		}
		want, known := ByteSize(t)
		if known && length != want {
			return fmt.Errorf("external data %q: tensor %q declares %d bytes, its shape needs %d", path, t.GetName(), length, want)
		}
		if ref.Offset+length > st.Size() || length < 0 {
			return fmt.Errorf("external data %q is %d bytes, tensor %q needs bytes %d..%d: file truncated", path, st.Size(), t.GetName(), ref.Offset, ref.Offset+length)
		}
		if opts.SkipExternalData {
			continue
		}
		raw := make([]byte, length)
		if _, err := f.ReadAt(raw, ref.Offset); err != nil && !errors.Is(err, io.EOF) {
			return fmt.Errorf("external data %q: tensor %q: %w", path, t.GetName(), err)
		}
		t.RawData = raw
		t.DataLocation = TensorProto_DEFAULT
		t.ExternalData = nil
	}
	return nil
}

// LoadData loads t's external data (resolved against dir) into RawData,
// if it is stored externally.
func LoadData(t *TensorProto, dir string) error {
	ref, ext, err := External(t)
	if err != nil || !ext {
		return err
	}
	path := filepath.Join(dir, ref.Location)
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("external data of tensor %q: %w", t.GetName(), err)
	}
	defer f.Close()
	length := ref.Length
	if length < 0 {
		st, err := f.Stat()
		if err != nil {
			return fmt.Errorf("external data %q: %w", path, err)
		}
		length = st.Size() - ref.Offset
	}
	raw := make([]byte, length)
	if _, err := f.ReadAt(raw, ref.Offset); err != nil {
		return fmt.Errorf("external data %q: tensor %q: %w", path, t.GetName(), err)
	}
	t.RawData, t.DataLocation, t.ExternalData = raw, TensorProto_DEFAULT, nil
	return nil
}

// DataReader returns a reader of t's raw little-endian bytes, inline or
// external (resolved against dir), without loading them all, and their
// length. The caller closes it.
func DataReader(t *TensorProto, dir string) (io.ReadCloser, int64, error) {
	ref, ext, err := External(t)
	if err != nil {
		return nil, 0, err
	}
	if !ext {
		if err := ToRaw(t); err != nil {
			return nil, 0, err
		}
		return io.NopCloser(bytes.NewReader(t.RawData)), int64(len(t.RawData)), nil
	}
	path := filepath.Join(dir, ref.Location)
	f, err := os.Open(path)
	if err != nil {
		return nil, 0, fmt.Errorf("external data of tensor %q: %w", t.GetName(), err)
	}
	length := ref.Length
	if length < 0 {
		st, err := f.Stat()
		if err != nil {
			f.Close()
			return nil, 0, fmt.Errorf("external data %q: %w", path, err)
		}
		length = st.Size() - ref.Offset
	}
	return struct {
		io.Reader
		io.Closer
	}{io.NewSectionReader(f, ref.Offset, length), f}, length, nil
}
