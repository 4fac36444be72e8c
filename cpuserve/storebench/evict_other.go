//go:build !(linux && (amd64 || arm64))

package storebench

import (
	"errors"
	"os"
	"time"
)

func cpuTime() time.Duration { return 0 }

func fadviseDontNeed(*os.File) error { return errors.New("fadvise: not supported") }
