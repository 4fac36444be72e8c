//go:build !linux

package storebench

import "syscall"

func dieWithParent() *syscall.SysProcAttr { return nil }
