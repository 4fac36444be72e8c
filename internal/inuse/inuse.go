// Package inuse explains the error Pebble gives when another process
// holds a folder's LOCK file: the operating system's "resource
// temporarily unavailable" (EAGAIN from the fcntl lock Pebble takes) says nothing of which
// folder is busy or why.
package inuse

import (
	"errors"
	"fmt"
	"syscall"
)

// Explain returns err, saying so when it is a lock another process
// holds on the folder; other errors are returned as they are.
func Explain(err error) error {
	if err != nil && errors.Is(err, syscall.EAGAIN) {
		return fmt.Errorf("in use by another process (it holds the folder's LOCK file; stop it or give another folder): %w", err)
	}
	return err
}
