//go:build !unix

package loadgen

import "time"

func cpuTime() time.Duration { return 0 }
