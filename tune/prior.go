package tune

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"time"

	"github.com/prism-serve/prism/plan"
)

// Features describe a model for the prior's similarity: what makes two
// models' best configurations alike.
type Features struct {
	// DenseParamBytes and DenseFLOPs (per sample) are the dense side's
	// size and work (plan.json's cost report).
	DenseParamBytes int64 `json:"dense_param_bytes"`
	DenseFLOPs      int64 `json:"dense_flops_per_sample"`
	// TableBytes are the embedding tables' bytes; CutBytes the bytes per
	// sample sent from the embedding tier to the dense tier.
	TableBytes int64 `json:"table_bytes"`
	CutBytes   int64 `json:"cut_bytes_per_sample"`
	// Candidates per request in the trials.
	Candidates float64 `json:"candidates"`
}

// PlanFeatures reads a plan's features.
func PlanFeatures(p *plan.Plan, candidates float64) Features {
	return Features{
		DenseParamBytes: p.Cost.GPU.ParamBytes,
		DenseFLOPs:      p.Cost.GPU.FLOPsPerSamp,
		TableBytes:      p.Cost.TableBytes,
		CutBytes:        p.Cost.CutBytes,
		Candidates:      candidates,
	}
}

// Similarity of two models in (0,1]: a Gaussian of the distance between
// their features in decades (log10), one decade costing as much as the
// bandwidth.
func Similarity(a, b Features) float64 {
	pairs := [][2]float64{
		{float64(a.DenseParamBytes), float64(b.DenseParamBytes)},
		{float64(a.DenseFLOPs), float64(b.DenseFLOPs)},
		{float64(a.TableBytes), float64(b.TableBytes)},
		{float64(a.CutBytes), float64(b.CutBytes)},
		{a.Candidates, b.Candidates},
	}
	var d2 float64
	for _, p := range pairs {
		d := math.Log10(math.Max(p[0], 1)) - math.Log10(math.Max(p[1], 1))
		d2 += d * d
	}
	return math.Exp(-d2 / 2)
}

// Machine is the shape of the host a trial ran on: what makes one
// host's best configuration wrong for another (dense workers per core,
// batches per GPU).
type Machine struct {
	// CPUs the Go runtime uses (GOMAXPROCS: a CPU quota's share).
	CPUs int `json:"cpus"`
	// Devices are the GPUs or MIG slices the dense tier serves on (0:
	// the CPU), Device the first one's name.
	Devices int    `json:"devices,omitempty"`
	Device  string `json:"device,omitempty"`
}

func (m Machine) String() string {
	if m.Devices == 0 {
		return fmt.Sprintf("%d CPUs", m.CPUs)
	}
	return fmt.Sprintf("%d CPUs, %d x %s", m.CPUs, m.Devices, m.Device)
}

// PriorRecord is one line of the prior file: one trial of an earlier
// tuning run.
type PriorRecord struct {
	Time     time.Time `json:"time"`
	Model    string    `json:"model"`
	Features Features  `json:"features"`
	// Machine is where it ran (nil: a record of a release before
	// machines were recorded).
	Machine *Machine `json:"machine,omitempty"`
	Config  Config   `json:"config"`
	// Score is the trial's max samples/s over its run's best (0 for a
	// failed trial).
	Score       float64 `json:"score"`
	SamplesPerS float64 `json:"samples_per_s"`
}

// ReadPrior reads a prior file (JSON lines); a missing file is an empty
// prior. A record an append left cut short (a full disk, a crash) is
// skipped: see readPrior.
func ReadPrior(path string) ([]PriorRecord, error) {
	recs, _, err := readPrior(path)
	return recs, err
}

// readPrior reads a prior file and lists the lines (from 1) of the
// records it skipped as cut short: a line that ends inside its JSON
// value, which an append stopped part way leaves (AppendPrior starts
// the next append on a new line). Blank lines (an editor's, a CRLF's)
// are skipped. Any other line that does not parse as a record with a
// model and a configuration is an error naming the line: the file is
// not a prior.
func readPrior(path string) (recs []PriorRecord, torn []int, err error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("read prior: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), maxPriorLine)
	n := 1
	for ; sc.Scan(); n++ {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		var r PriorRecord
		if err := json.Unmarshal(line, &r); err != nil {
			var se *json.SyntaxError
			if errors.As(err, &se) && se.Offset == int64(len(line)) && line[0] == '{' {
				torn = append(torn, n)
				continue
			}
			return nil, nil, fmt.Errorf("read prior %q line %d: %w", path, n, err)
		}
		if r.Model == "" || len(r.Config) == 0 {
			// Another file's JSON (a prism up --config object, say),
			// which the end of the run would append records to.
			return nil, nil, fmt.Errorf("read prior %q line %d: not a prior record (no model or configuration): is it a prior file?", path, n)
		}
		recs = append(recs, r)
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			err = fmt.Errorf("longer than %d bytes: not a prior record", maxPriorLine)
		}
		return nil, nil, fmt.Errorf("read prior %q line %d: %w", path, n, err)
	}
	return recs, torn, nil
}

// maxPriorLine bounds a prior record's line (one is a few hundred
// bytes).
const maxPriorLine = 1 << 20

// AppendPrior adds records to a prior file, making its folder. The
// records go in one write, on a line of their own: a file whose last
// append was cut short (no newline at its end) gets one first, so the
// cut record stays alone on its line (readPrior skips it) instead of
// swallowing the first new one.
func AppendPrior(path string, recs []PriorRecord) error {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	for _, r := range recs {
		if err := enc.Encode(r); err != nil {
			return fmt.Errorf("append prior %q: %w", path, err)
		}
	}
	f, err := openPrior(path)
	if err != nil {
		return fmt.Errorf("append prior: %w", err)
	}
	out := buf.Bytes()
	if st, err := f.Stat(); err == nil && st.Size() > 0 {
		last := make([]byte, 1)
		if _, err := f.ReadAt(last, st.Size()-1); err == nil && last[0] != '\n' {
			out = append([]byte{'\n'}, out...)
		}
	}
	if _, err := f.Write(out); err != nil {
		f.Close()
		return fmt.Errorf("append prior %q: %w", path, err)
	}
	return f.Close()
}

// OnMachine splits records into those measured on machine m, or on a
// machine not recorded (an older release's), and those measured on
// another machine: its values (dense workers per core, say) are placed
// in this space by number, so a 64-core host's best worker count read
// as this 2-core host's largest. A nil m keeps every record.
func OnMachine(recs []PriorRecord, m *Machine) (here, elsewhere []PriorRecord) {
	for _, r := range recs {
		if m != nil && r.Machine != nil && *r.Machine != *m {
			elsewhere = append(elsewhere, r)
			continue
		}
		here = append(here, r)
	}
	return here, elsewhere
}

// PriorPoints places records in space for a model of features f: each
// weighted by its model's similarity to f; records that cannot be
// placed (a flag of the space missing) or whose weight is below
// minWeight are dropped, and so are records of the model named skip.
func PriorPoints(recs []PriorRecord, space Space, f Features, skip string, minWeight float64) []PriorPoint {
	var out []PriorPoint
	for _, r := range recs {
		if r.Model == skip {
			continue
		}
		w := Similarity(r.Features, f)
		if w < minWeight {
			continue
		}
		c, ok := space.CoordsOf(r.Config)
		if !ok {
			continue
		}
		out = append(out, PriorPoint{Coords: c, Score: r.Score, Weight: w})
	}
	return out
}

// openPrior opens the prior file for appending, making it and its folder.
func openPrior(path string) (*os.File, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	return os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_RDWR, 0o644)
}

// checkPriorWritable fails now, before the trials, when the prior file
// could not be appended to after them (a folder that cannot be made, a
// file not writable).
// A file made for the check is removed: a run that measures nothing
// leaves no prior.
func checkPriorWritable(path string) error {
	_, statErr := os.Stat(path)
	f, err := openPrior(path)
	if err != nil {
		return fmt.Errorf("prior %q: appended to at the end, and it cannot be: %w", path, err)
	}
	f.Close()
	if errors.Is(statErr, fs.ErrNotExist) {
		os.Remove(path)
	}
	return nil
}
