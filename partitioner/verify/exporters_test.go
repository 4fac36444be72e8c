package verify_test

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prism-serve/prism/models"
	"github.com/prism-serve/prism/models/exporters"
	"github.com/prism-serve/prism/partitioner"
	"github.com/prism-serve/prism/partitioner/verify"
)

// TestExporterCorpusPartitionsAndVerifies: every model of the exporter
// corpus partitions with every table taken as a lookup, and the
// partition reproduces the whole model within 1e-5 both on samples
// drawn from the plan (what prism partition --verify draws: valid ids
// worked back through the pre-lookup ops) and on the corpus's own
// valid inputs.
func TestExporterCorpusPartitionsAndVerifies(t *testing.T) {
	requireORT(t)
	for _, m := range exporters.Corpus(5) {
		t.Run(m.Name, func(t *testing.T) {
			dir := t.TempDir()
			model := filepath.Join(dir, "model.onnx")
			if err := m.Write(model); err != nil {
				t.Fatal(err)
			}
			out := filepath.Join(dir, "part")
			res, err := partitioner.Partition(model, out, partitioner.Options{})
			if err != nil {
				t.Fatal(err)
			}
			if len(res.Plan.Tables) == 0 {
				t.Fatalf("no lookups:\n%s", res.Report())
			}
			rep, err := verify.Verify(model, out, 500, 1)
			if err != nil {
				t.Fatalf("verify on the plan's samples: %v\n%s", err, res.Report())
			}
			src, err := models.NewSynthetic(m.Sig, models.SyntheticOptions{Seed: 2, Uniform: true})
			if err != nil {
				t.Fatal(err)
			}
			rep2, err := verify.VerifySource(model, out, src, 500)
			if err != nil {
				t.Fatalf("verify on the corpus's samples: %v\n%s", err, res.Report())
			}
			t.Logf("%d tables; max abs error %.2g (plan's samples), %.2g (corpus's)", len(res.Plan.Tables), rep.MaxAbsErr, rep2.MaxAbsErr)
		})
	}
}

// TestExporterBrokenTwins: each broken pattern is refused with an error
// naming the table and why.
func TestExporterBrokenTwins(t *testing.T) {
	for _, m := range exporters.Broken(5) {
		t.Run(m.Name, func(t *testing.T) {
			dir := t.TempDir()
			model := filepath.Join(dir, "model.onnx")
			if err := m.Write(model); err != nil {
				t.Fatal(err)
			}
			_, err := partitioner.Partition(model, filepath.Join(dir, "part"), partitioner.Options{})
			if !errors.Is(err, partitioner.ErrUnrecognised) || !strings.Contains(err.Error(), m.WantErr) {
				t.Fatalf("got %v\nwant ErrUnrecognised saying %q", err, m.WantErr)
			}
			t.Log(err)
		})
	}
}
