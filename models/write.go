package models

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	pb "github.com/prism-serve/prism/internal/onnxpb"
)

// ModelFile is the file name Write gives the ONNX model in its folder.
const ModelFile = "model.onnx"

// Manifest is model.json beside a built model: how it was made.
type Manifest struct {
	Config     Config `json:"config"`
	Seed       uint64 `json:"seed"`
	Params     int64  `json:"params"`
	Bytes      int64  `json:"bytes"`
	External   bool   `json:"external_data"`
	Opset      int    `json:"opset"`
	ModelFile  string `json:"model_file"`
	DataFile   string `json:"data_file,omitempty"`
	PrismBuild string `json:"prism_build,omitempty"`
}

// WriteOptions control Write.
type WriteOptions struct {
	// External forces external data; otherwise it is used above 1 GiB.
	External bool
	Progress func(done, total int64)
}

// partialPrefix names the folder in dir a build writes into before its
// files are moved into place.
const partialPrefix = ".model.partial-"

// Write saves m as dir/model.onnx (plus model.onnx.data when external)
// and dir/model.json, creating dir. Every file is written first into a
// hidden folder in dir and moved into place at the end, so a build that
// fails or is killed part-way (a full disk, Ctrl-C while the weights are
// written) leaves the build that was in dir whole: never a model.onnx
// without its model.onnx.data, or one beside another build's data or
// model.json. A rebuild therefore needs the new build's bytes free
// beside the old one's. The hidden folder of a build killed part-way is
// removed by the next build into dir.
func (m *Model) Write(dir string, o WriteOptions) (*Manifest, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("write model %s: %w", m.Config.Name, err)
	}
	if stale, _ := filepath.Glob(filepath.Join(dir, partialPrefix+"*")); len(stale) > 0 {
		for _, s := range stale {
			os.RemoveAll(s)
		}
	}
	tmp, err := os.MkdirTemp(dir, partialPrefix)
	if err != nil {
		return nil, fmt.Errorf("write model %s: %w", m.Config.Name, err)
	}
	keep := false // the new build, when moving it into place failed half-way
	defer func() {
		if !keep {
			os.RemoveAll(tmp)
		}
	}()
	g := m.Graph()
	mode := pb.ExternalAuto
	if o.External {
		mode = pb.ExternalAlways
	}
	// The data file's location in the model is relative to the model's
	// folder, so the two move together.
	dataFile := ModelFile + ".data"
	if err := pb.WriteModel(filepath.Join(tmp, ModelFile), g, pb.WriteOptions{External: mode, DataFile: dataFile, Progress: o.Progress}); err != nil {
		return nil, err
	}
	e, d := m.Config.Params()
	man := &Manifest{Config: m.Config, Seed: m.Seed, Params: e + d, Bytes: m.Config.Bytes(), Opset: Opset, ModelFile: ModelFile}
	if _, err := os.Stat(filepath.Join(tmp, dataFile)); err == nil {
		man.External, man.DataFile = true, dataFile
	}
	buf, err := json.MarshalIndent(man, "", "  ")
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(tmp, "model.json"), append(buf, '\n'), 0o644); err != nil {
		return nil, fmt.Errorf("write model %s: %w", m.Config.Name, err)
	}
	// Into place. The old model.onnx goes first: from then until the new
	// one is in place there is no model.onnx (a command given the folder
	// says it is missing), never the old graph reading the new data file.
	// A small model rebuilt where a large one was drops its data file.
	for _, f := range []string{ModelFile, "model.json"} {
		if err := os.Remove(filepath.Join(dir, f)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("write model %s: %w", m.Config.Name, err)
		}
	}
	// The temporary files of a build by an earlier Prism, which wrote
	// them in dir itself and left them there when killed.
	os.Remove(filepath.Join(dir, dataFile+".tmp"))
	os.Remove(filepath.Join(dir, ModelFile+".tmp"))
	moves := []string{ModelFile, "model.json"}
	if man.External {
		moves = append([]string{dataFile}, moves...)
	} else if err := os.Remove(filepath.Join(dir, dataFile)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("write model %s: %w", m.Config.Name, err)
	}
	for _, f := range moves {
		if err := os.Rename(filepath.Join(tmp, f), filepath.Join(dir, f)); err != nil {
			// The old build is gone already: the new one is left
			// whole where it was written (the next build removes it).
			keep = true
			return nil, fmt.Errorf("write model %s: %w (the new build is whole in %s)", m.Config.Name, err, tmp)
		}
	}
	return man, nil
}
