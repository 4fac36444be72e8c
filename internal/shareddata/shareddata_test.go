package shareddata

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestDirFrom(t *testing.T) {
	root := t.TempDir()
	repo := filepath.Join(root, "repo")
	deep := filepath.Join(repo, "a", "b")
	if err := os.MkdirAll(deep, 0o755); err != nil {
		t.Fatal(err)
	}
	if _, err := dirFrom(deep); err == nil || !strings.Contains(err.Error(), "no go.mod") {
		t.Fatalf("no go.mod: %v", err)
	}
	if err := os.WriteFile(filepath.Join(repo, "go.mod"), []byte("module x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	want := filepath.Join(root, "shared", "data")
	if _, err := dirFrom(deep); err == nil || !strings.Contains(err.Error(), "no directory "+want) {
		t.Fatalf("no shared data: %v", err)
	}
	if err := os.MkdirAll(want, 0o755); err != nil {
		t.Fatal(err)
	}
	if got, err := dirFrom(deep); err != nil || got != want {
		t.Fatalf("dirFrom = %q, %v; want %q", got, err, want)
	}
}

func TestMissingErrorNamesTheDataset(t *testing.T) {
	err := error(&MissingError{Rel: "openb/openb_pod_list_default.csv", Err: fs.ErrNotExist})
	for _, want := range []string{"openb/openb_pod_list_default.csv", `"openb"`, "FGD", "github.com/alibaba/clusterdata", "cluster-trace-gpu-v2023"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q lacks %q", err, want)
		}
	}
	if !errors.Is(err, fs.ErrNotExist) || !IsMissing(err) {
		t.Error("not an fs.ErrNotExist")
	}
	for _, rel := range []string{"prism/disaggregated_DLRM_trace.csv", "qps/genai_gateway_qps.csv", "criteo/criteo_sample.txt"} {
		if _, ok := DatasetOf(rel); !ok {
			t.Errorf("no data set for %s", rel)
		}
	}
	if _, ok := DatasetOf("nope/x"); ok {
		t.Error("data set for nope/x")
	}
	if _, err := Path("openb/no-such-file.csv"); !IsMissing(err) {
		t.Errorf("Path of a missing file: %v", err)
	}
}
