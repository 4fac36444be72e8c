//go:build !linux

package hot

import "unsafe"

func adviseHuge(unsafe.Pointer, uintptr) {}
