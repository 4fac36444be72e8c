//go:build !(linux || darwin || freebsd)

package up

// locked: where record locks cannot be asked about, the children's own
// error says so.
func locked(string) bool { return false }
