// Package sharedtest gives tests the files of ../shared/data, skipping
// with a clear message where a clone lacks them. It is apart from
// shareddata so that commands do not link package testing.
package sharedtest

import (
	"testing"

	"github.com/prism-serve/prism/internal/shareddata"
)

// Path returns the file rel (slash-separated, as "openb/x.csv") under
// ../shared/data or skips the test, naming the data set and its source.
func Path(tb testing.TB, rel string) string {
	tb.Helper()
	p, err := shareddata.Path(rel)
	if err != nil {
		tb.Skip(err)
	}
	return p
}
