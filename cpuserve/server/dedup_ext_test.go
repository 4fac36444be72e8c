package server_test

import (
	"testing"
)

// TestDictionaryFrames: with Options.DictionaryFrames every model family
// scores as model.onnx does within 1e-5, and for the models whose
// lookups qualify the frame is smaller where ids repeat.
func TestDictionaryFrames(t *testing.T) {
	f := setup(t)
	for i, name := range testModels {
		t.Run(name, func(t *testing.T) {
			for _, n := range []int{1, 7, 300} {
				b := f.batch(t, name, n, uint64(900+i*10+n))
				f.checkScores(t, name, b, f.request(name, b))
				plain, _ := f.dense.lastFrame()
				f.checkScoresVia(t, f.dictClient, name, b, f.request(name, b))
				dict, _ := f.dense.lastFrame()
				if n == 300 {
					t.Logf("n=%d: frame %d bytes plain, %d with dictionaries", n, plain, dict)
				}
				if dict > plain+4096 {
					t.Errorf("n=%d: frame %d bytes with dictionaries, %d plain", n, dict, plain)
				}
			}
		})
	}
}
