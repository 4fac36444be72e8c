//go:build !linux

package threadcpu

import "time"

const supported = false

func now() time.Duration { return 0 }
