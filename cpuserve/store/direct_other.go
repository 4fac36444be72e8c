//go:build !linux

package store

// openDirect: O_DIRECT is Linux's here; reads stay buffered.
func openDirect(string) int { return -1 }

func closeDirect(int) {}

func readDirect(int, []byte, int64) (int, error) { return 0, errDirectRefused }
