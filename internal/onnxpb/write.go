package onnxpb

import (
	"bufio"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// ExternalMode says when WriteModel moves initializers out of the .onnx file.
type ExternalMode int

const (
	// ExternalAuto stores large tensors externally when the model's tensors
	// exceed AutoExternalBytes (protobuf cannot encode a message of 2 GiB).
	ExternalAuto ExternalMode = iota
	// ExternalAlways stores every tensor of at least MinExternalBytes externally.
	ExternalAlways
	// ExternalNever keeps everything in the .onnx file.
	ExternalNever
)

// AutoExternalBytes is the total tensor size above which ExternalAuto
// writes external data.
const AutoExternalBytes = 1 << 30

// WriteOptions controls WriteModel.
type WriteOptions struct {
	External ExternalMode
	// DataFile is the external data file name, relative to the model's
	// folder. Default: the model's file name plus ".data", as PyTorch does.
	DataFile string
	// MinExternalBytes: smaller tensors stay inline. Default 1024, as in
	// onnx.external_data_helper.
	MinExternalBytes int
	// Progress, if set, is called as external data is written.
	Progress func(done, total int64)
}

// ErrNoSpace is wrapped by WriteModel's error when the model's folder has
// less free space than its external data needs. WriteModel checks before
// it writes, so a model of several GiB fails at once, saying how much it
// needs, instead of after minutes of writing.
var ErrNoSpace = errors.New("not enough free disk space")

// FreeBytes returns the bytes an unprivileged writer can still use on the
// file system holding dir.
func FreeBytes(dir string) (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, err
	}
	return int64(st.Bavail) * st.Bsize, nil
}

// freeBytes is FreeBytes; tests replace it.
var freeBytes = FreeBytes

// pageAlign keeps every external tensor at a page-aligned offset so ONNX
// Runtime can memory-map it.
const pageAlign = 4096

// WriteModel writes m to path, and its large tensors to an external data
// file beside it when opts ask for it. Both files are written to temporary
// names and renamed, so a crash never leaves a half-written model. The
// output is deterministic: the same model writes the same bytes.
//
// WriteModel temporarily detaches RawData from m's tensors while it
// encodes; m must not be read concurrently.
func WriteModel(path string, m *ModelProto, opts WriteOptions) (err error) {
	if opts.MinExternalBytes <= 0 {
		opts.MinExternalBytes = 1024
	}
	if opts.DataFile == "" {
		opts.DataFile = filepath.Base(path) + ".data"
	}
	var ext []*TensorProto
	var total int64
	for _, t := range Tensors(m) {
		if _, isExt, _ := External(t); isExt {
			return fmt.Errorf("write model %q: tensor %q still refers to external data; read the model without SkipExternalData", path, t.GetName())
		}
		if len(t.GetRawData()) >= opts.MinExternalBytes || packedSize(t) >= opts.MinExternalBytes {
			ext = append(ext, t)
			total += int64(len(t.GetRawData()))
		}
	}
	switch opts.External {
	case ExternalNever:
		ext = nil
	case ExternalAuto:
		if total < AutoExternalBytes {
			ext = nil
		}
	}

	dataPath := filepath.Join(filepath.Dir(path), opts.DataFile)
	type saved struct {
		t   *TensorProto
		raw []byte
	}
	var restore []saved
	defer func() {
		for _, s := range restore {
			s.t.RawData = s.raw
			s.t.DataLocation = TensorProto_DEFAULT
			s.t.ExternalData = nil
		}
	}()
	if len(ext) > 0 {
		for _, t := range ext {
			if err := ToRaw(t); err != nil {
				return fmt.Errorf("write model %q: %w", path, err)
			}
		}
		total = 0
		for _, t := range ext {
			total += int64(len(t.RawData))
		}
		need := total + int64(len(ext))*pageAlign
		if free, err := freeBytes(filepath.Dir(dataPath)); err == nil && free < need {
			return fmt.Errorf("write external data %q: %w: needs %.1f MiB, %.1f MiB free on %s", dataPath, ErrNoSpace, float64(need)/(1<<20), float64(free)/(1<<20), filepath.Dir(dataPath))
		}
		tmp := dataPath + ".tmp"
		f, err := os.Create(tmp)
		if err != nil {
			return fmt.Errorf("write model %q: %w", path, err)
		}
		defer os.Remove(tmp)
		w := bufio.NewWriterSize(f, 4<<20)
		var off, done int64
		for _, t := range ext {
			if pad := (pageAlign - off%pageAlign) % pageAlign; pad > 0 {
				if _, err := w.Write(make([]byte, pad)); err != nil {
					f.Close()
					return fmt.Errorf("write external data %q: %w", dataPath, err)
				}
				off += pad
			}
			raw := t.RawData
			for i := 0; i < len(raw); i += 16 << 20 {
				j := min(i+16<<20, len(raw))
				if _, err := w.Write(raw[i:j]); err != nil {
					f.Close()
					return fmt.Errorf("write external data %q: %w", dataPath, err)
				}
				done += int64(j - i)
				if opts.Progress != nil {
					opts.Progress(done, total)
				}
			}
			restore = append(restore, saved{t, raw})
			t.RawData = nil
			t.DataLocation = TensorProto_EXTERNAL
			t.ExternalData = []*StringStringEntryProto{
				{Key: "location", Value: opts.DataFile},
				{Key: "offset", Value: strconv.FormatInt(off, 10)},
				{Key: "length", Value: strconv.Itoa(len(raw))},
			}
			off += int64(len(raw))
		}
		if err := w.Flush(); err != nil {
			f.Close()
			return fmt.Errorf("write external data %q: %w", dataPath, err)
		}
		if err := f.Sync(); err != nil {
			f.Close()
			return fmt.Errorf("write external data %q: %w", dataPath, err)
		}
		if err := f.Close(); err != nil {
			return fmt.Errorf("write external data %q: %w", dataPath, err)
		}
		if err := os.Rename(tmp, dataPath); err != nil {
			return fmt.Errorf("write external data %q: %w", dataPath, err)
		}
	}
	zeros := markZeroScalars(m)
	buf, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	for _, a := range zeros {
		a.ProtoReflect().SetUnknown(nil)
	}
	if err != nil {
		return fmt.Errorf("write model %q: encode: %w", path, err)
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, buf, 0o644); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write model %q: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("write model %q: %w", path, err)
	}
	return nil
}

// packedSize estimates the bytes of a tensor stored in typed fields.
func packedSize(t *TensorProto) int {
	return 4*len(t.GetFloatData()) + 4*len(t.GetInt32Data()) + 8*len(t.GetInt64Data()) + 8*len(t.GetDoubleData()) + 8*len(t.GetUint64Data())
}

// markZeroScalars makes the encoding of m carry the value of every INT
// attribute of 0 and FLOAT attribute of 0 (in its graphs, subgraphs and
// functions), and returns the attributes it marked. ONNX's schema is
// proto2, where AttributeProto's i and f have presence; this package's
// subset is proto3, which writes no zero scalar, and a reader that asks
// whether the value is there (ONNX Runtime's Constant for value_int or
// value_float, onnx.checker) refuses the attribute: "Attribute
// 'value_int' expect an integer". The value is added as an unknown
// field with the scalar's own number, which the marshaller writes as
// is; WriteModel clears the marks after encoding.
func markZeroScalars(m *ModelProto) []*AttributeProto {
	var marked []*AttributeProto
	var nodes func(ns []*NodeProto)
	attr := func(a *AttributeProto) {
		if a.GetRefAttrName() != "" {
			return // a reference to the calling node's attribute: no value
		}
		var b []byte
		switch {
		case a.GetType() == AttributeProto_INT && a.GetI() == 0:
			b = protowire.AppendVarint(protowire.AppendTag(nil, 3, protowire.VarintType), 0)
		case a.GetType() == AttributeProto_FLOAT && a.GetF() == 0 && !math.Signbit(float64(a.GetF())):
			b = protowire.AppendFixed32(protowire.AppendTag(nil, 2, protowire.Fixed32Type), 0)
		}
		if b != nil {
			a.ProtoReflect().SetUnknown(b)
			marked = append(marked, a)
		}
		if g := a.GetG(); g != nil {
			nodes(g.GetNode())
		}
		for _, g := range a.GetGraphs() {
			nodes(g.GetNode())
		}
	}
	nodes = func(ns []*NodeProto) {
		for _, n := range ns {
			for _, a := range n.GetAttribute() {
				attr(a)
			}
		}
	}
	nodes(m.GetGraph().GetNode())
	for _, f := range m.GetFunctions() {
		nodes(f.GetNode())
		for _, a := range f.GetAttributeProto() {
			attr(a)
		}
	}
	return marked
}
