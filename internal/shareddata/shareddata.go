// Package shareddata finds the public data sets that tests and commands
// read from ../shared/data, the folder beside the repository root, and
// says where each one is published when a clone lacks it.
//
// Nothing in that folder is part of the repository: a user's clone has no
// ../shared/data, so callers treat every file as optional and turn a
// missing one into an error that names the data set (MissingError) or,
// in tests, a skip (package sharedtest).
package shareddata

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// Dir returns ../shared/data beside the repository root: the directory
// holding go.mod, found by walking up from the working directory.
func Dir() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("shared data: working directory: %w", err)
	}
	return dirFrom(wd)
}

func dirFrom(start string) (string, error) {
	for dir := start; ; {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			p := filepath.Join(filepath.Dir(dir), "shared", "data")
			st, err := os.Stat(p)
			if errors.Is(err, fs.ErrNotExist) {
				return "", fmt.Errorf("no directory %s beside the repository", p)
			}
			if err != nil {
				return "", fmt.Errorf("shared data %q: %w", p, err)
			}
			if !st.IsDir() {
				return "", fmt.Errorf("shared data %q: not a directory", p)
			}
			return p, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.mod in %s or above, so no repository root to look beside", start)
		}
		dir = parent
	}
}

// Path returns the file rel (slash-separated, as "openb/x.csv") under
// Dir, or a *MissingError when it or the folder is absent.
func Path(rel string) (string, error) {
	d, err := Dir()
	if err != nil {
		return "", &MissingError{Rel: rel, Err: err}
	}
	p := filepath.Join(d, filepath.FromSlash(rel))
	if _, err := os.Stat(p); err != nil {
		return "", &MissingError{Rel: rel, Err: err}
	}
	return p, nil
}

// Default is Path for flag defaults: the path when the file is there,
// else "".
func Default(rel string) string {
	p, err := Path(rel)
	if err != nil {
		return ""
	}
	return p
}

// Dataset describes one public data set the project reads.
type Dataset struct {
	// Dir is the data set's folder under ../shared/data.
	Dir string
	// Name says what it is and whose it is.
	Name string
	// Source is where it is published.
	Source string
}

// Datasets are the data sets ../shared/data holds; README.md there has
// the details and licences.
var Datasets = []Dataset{
	{
		Dir:    "openb",
		Name:   `the Alibaba GPU cluster trace "openb" (nodes and tasks), the trace of the FGD paper (USENIX ATC'23) and its artifact`,
		Source: "https://github.com/alibaba/clusterdata/tree/master/cluster-trace-gpu-v2023 (folder csv/)",
	},
	{
		Dir:    "prism",
		Name:   "the Prism DLRM serving instance trace (disaggregated CN/HN instances, NSDI'25)",
		Source: "https://github.com/alibaba/clusterdata/tree/master/cluster-trace-gpu-v2025",
	},
	{
		Dir:    "qps",
		Name:   "the QPS samples of an Alibaba GenAI gateway",
		Source: "https://github.com/alibaba/clusterdata/tree/master/cluster-trace-v2026-GenAI (qps.tar.gz)",
	},
	{
		Dir:    "criteo",
		Name:   "a 200-row sample of the Criteo display-advertising data set (DeepCTR's example)",
		Source: "https://github.com/shenweichen/DeepCTR/blob/master/examples/criteo_sample.txt",
	},
}

// DatasetOf returns the data set a file under ../shared/data belongs to.
func DatasetOf(rel string) (Dataset, bool) {
	top, _, _ := strings.Cut(filepath.ToSlash(rel), "/")
	for _, d := range Datasets {
		if d.Dir == top {
			return d, true
		}
	}
	return Dataset{}, false
}

// MissingError is a file of ../shared/data that is not there. It matches
// fs.ErrNotExist under errors.Is.
type MissingError struct {
	Rel string // slash-separated, under ../shared/data
	Err error  // what the lookup hit
}

func (e *MissingError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "shared data file %s not found (%v)", e.Rel, e.Err)
	if d, ok := DatasetOf(e.Rel); ok {
		fmt.Fprintf(&b, "; data set: %s, published at %s", d.Name, d.Source)
	}
	return b.String()
}

func (e *MissingError) Unwrap() error { return e.Err }

// Is makes every MissingError an fs.ErrNotExist, whatever the lookup hit.
func (e *MissingError) Is(target error) bool { return target == fs.ErrNotExist }

var _ error = (*MissingError)(nil)

// IsMissing reports whether err is, or wraps, a MissingError.
func IsMissing(err error) bool {
	var m *MissingError
	return errors.As(err, &m)
}
