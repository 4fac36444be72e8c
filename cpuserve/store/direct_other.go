//go:build !linux

package store

import "sync"

// openDirect: O_DIRECT is Linux's here; reads stay buffered.
func openDirect(string) int { return -1 }

func closeDirect(int) {}

func readDirect(int, []byte, int64) (int, error) { return 0, errDirectRefused }

func preadFull(int, []byte, int64) (int, error) { return 0, errDirectRefused }

func alignedBuf(n int) ([]byte, int) { return make([]byte, n), 0 }

var directBufs [8]sync.Pool
