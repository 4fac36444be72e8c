package main

import (
	"testing"

	"github.com/prism-serve/prism/internal/up"
)

// TestDictionaryFramesDefault: dictionary-encoded frames are on unless
// --dictionary-frames=false says otherwise, in serve embedding and in
// prism up (which passes its setting on either way).
func TestDictionaryFramesDefault(t *testing.T) {
	if f := newServeEmbeddingCmd().Flags().Lookup("dictionary-frames"); f == nil || f.DefValue != "true" {
		t.Errorf("serve embedding --dictionary-frames: %+v, want a flag on by default", f)
	}
	for _, c := range []struct {
		args []string
		want bool
	}{{nil, true}, {[]string{"--dictionary-frames=false"}, false}, {[]string{"--dictionary-frames"}, true}} {
		var cfg up.Config
		fl := upCmd(&cfg).Flags()
		if err := fl.Parse(c.args); err != nil {
			t.Fatal(err)
		}
		if cfg.DictionaryFrames != c.want {
			t.Errorf("prism up %v: dictionary frames %v, want %v", c.args, cfg.DictionaryFrames, c.want)
		}
	}
}
