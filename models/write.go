package models

import (
	"encoding/json"
	"fmt"
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

// Write saves m as dir/model.onnx (plus model.onnx.data when external)
// and dir/model.json, creating dir.
func (m *Model) Write(dir string, o WriteOptions) (*Manifest, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("write model %s: %w", m.Config.Name, err)
	}
	g := m.Graph()
	mode := pb.ExternalAuto
	if o.External {
		mode = pb.ExternalAlways
	}
	path := filepath.Join(dir, ModelFile)
	// Remove a stale data file first, so a small model rebuilt in a folder
	// that held a large one does not leave it behind.
	dataFile := ModelFile + ".data"
	os.Remove(filepath.Join(dir, dataFile))
	if err := pb.WriteModel(path, g, pb.WriteOptions{External: mode, DataFile: dataFile, Progress: o.Progress}); err != nil {
		return nil, err
	}
	e, d := m.Config.Params()
	man := &Manifest{Config: m.Config, Seed: m.Seed, Params: e + d, Bytes: m.Config.Bytes(), Opset: Opset, ModelFile: ModelFile}
	if _, err := os.Stat(filepath.Join(dir, dataFile)); err == nil {
		man.External, man.DataFile = true, dataFile
	}
	buf, err := json.MarshalIndent(man, "", "  ")
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(dir, "model.json"), append(buf, '\n'), 0o644); err != nil {
		return nil, fmt.Errorf("write model %s: %w", m.Config.Name, err)
	}
	return man, nil
}
