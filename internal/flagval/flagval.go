// Package flagval parses values people write on command lines and in
// configs, such as byte sizes ("256MiB"). Its errors describe the value;
// the command adds which flag it came from. (Seed lists are
// placement/cli.ParseSeeds, beside their one user.)
package flagval

import (
	"fmt"
	"math"
	"net"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
)

// byteUnits are tried in order: longer suffixes first, so "mib" is not
// read as "b". The one-letter forms are binary, as people mean them.
var byteUnits = []struct {
	suffix string
	mult   int64
}{
	{"kib", 1 << 10}, {"mib", 1 << 20}, {"gib", 1 << 30},
	{"kb", 1e3}, {"mb", 1e6}, {"gb", 1e9},
	{"k", 1 << 10}, {"m", 1 << 20}, {"g", 1 << 30}, {"b", 1},
}

// Bytes reads "1234", "64MiB", "2GB", "512k" or "1.5g", case-insensitive;
// "" is 0. Negative sizes are refused.
func Bytes(s string) (int64, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return 0, nil
	}
	mult := int64(1)
	low := strings.ToLower(s)
	for _, u := range byteUnits {
		if strings.HasSuffix(low, u.suffix) {
			mult, low = u.mult, strings.TrimSuffix(low, u.suffix)
			break
		}
	}
	n, err := strconv.ParseFloat(strings.TrimSpace(low), 64)
	// Also refused: NaN, infinities and sizes past int64, which the
	// conversion would turn into a negative number.
	v := n * float64(mult)
	if err != nil || !(v >= 0 && v < 1<<63) {
		return 0, fmt.Errorf("%q is not a size", s)
	}
	return int64(v), nil
}

// FormatBytes writes n the way Bytes reads it: in the largest binary
// unit that keeps it readable ("768MiB", "1.5GiB", "4096B").
func FormatBytes(n int64) string {
	neg := ""
	if n < 0 {
		neg, n = "-", -n
	}
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n >= u.mult {
			v := float64(n) / float64(u.mult)
			if n%u.mult == 0 {
				return fmt.Sprintf("%s%d%s", neg, n/u.mult, u.suffix)
			}
			return neg + strconv.FormatFloat(v, 'f', 1, 64) + u.suffix
		}
	}
	return fmt.Sprintf("%s%dB", neg, n)
}

// Positive refuses, among the flags of fs named, any set on the command
// line to zero or less (an int, a float or a duration): a count, a size
// or an interval that would otherwise be taken silently as "use the
// default" or mean nothing. Infinities are refused too (a float flag
// takes "+Inf"). Flags left unset keep their defaults.
func Positive(fs *pflag.FlagSet, names ...string) error { return atLeast(fs, false, names) }

// NonNegative refuses, among the flags of fs named, any set on the
// command line below zero (where 0 means none or the default).
func NonNegative(fs *pflag.FlagSet, names ...string) error { return atLeast(fs, true, names) }

func atLeast(fs *pflag.FlagSet, zero bool, names []string) error {
	for _, name := range names {
		f := fs.Lookup(name)
		if f == nil || !f.Changed {
			continue
		}
		v := f.Value.String()
		var x float64
		var err error
		switch f.Value.Type() {
		case "duration":
			var d time.Duration
			d, err = time.ParseDuration(v)
			x = float64(d)
		default:
			x, err = strconv.ParseFloat(v, 64)
		}
		switch {
		// Negated, so NaN (which pflag's float flags take) is refused.
		case zero && (err != nil || !(x >= 0)):
			return fmt.Errorf("--%s %s: want 0 or more", name, v)
		case !zero && (err != nil || !(x > 0)):
			return fmt.Errorf("--%s %s: want a positive value", name, v)
		case math.IsInf(x, 1):
			return fmt.Errorf("--%s %s: want a finite number", name, v)
		}
	}
	return nil
}

// PerCore is the most a flag sizing threads or processes on a machine
// of cpus cores takes: four a core, and at least 16. More only contend
// for the cores (ONNX Runtime sizes its pools at one thread a core), and
// the extra digits of a typo started ten thousand threads that a
// SIGTERM no longer stopped.
func PerCore(cpus int) int { return max(4*cpus, 16) }

// AtMostPerCore refuses, among the flags of fs named, any set on the
// command line above PerCore of this machine's cores (runtime.NumCPU).
func AtMostPerCore(fs *pflag.FlagSet, names ...string) error {
	return atMostPerCore(fs, runtime.NumCPU(), names)
}

func atMostPerCore(fs *pflag.FlagSet, cpus int, names []string) error {
	limit := PerCore(cpus)
	for _, name := range names {
		f := fs.Lookup(name)
		if f == nil || !f.Changed {
			continue
		}
		v := f.Value.String()
		if n, err := strconv.ParseFloat(v, 64); err == nil && n > float64(limit) {
			return fmt.Errorf("--%s %s: want at most %d on this machine of %d cores (four a core, at least 16)", name, v, limit, cpus)
		}
	}
	return nil
}

// ListenAddrs checks the flags names of fs that were given (addresses
// to listen on) with ListenAddr; "off", where a flag takes it, passes.
func ListenAddrs(fs *pflag.FlagSet, names ...string) error {
	for _, name := range names {
		f := fs.Lookup(name)
		if f == nil || !f.Changed || f.Value.String() == "off" {
			continue
		}
		if err := ListenAddr(name, f.Value.String()); err != nil {
			return err
		}
	}
	return nil
}

// ListenAddr checks value, an address to listen on given by flag name:
// HOST:PORT, HOST empty for every interface and PORT 0 for one the
// operating system chooses. An empty value, which the standard library
// takes for every interface on a port it chooses, is refused: a server
// reachable from anywhere on a port nobody asked for is never what was
// meant.
func ListenAddr(name, value string) error {
	if value == "" {
		return fmt.Errorf("--%s '': want HOST:PORT (127.0.0.1:0: this host only, a port the OS chooses; :PORT: every interface)", name)
	}
	_, port, err := net.SplitHostPort(value)
	if err != nil {
		return fmt.Errorf("--%s %s: want HOST:PORT (%v)", name, value, err)
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil && port != "" {
		if _, lerr := net.LookupPort("tcp", port); lerr != nil {
			return fmt.Errorf("--%s %s: port %q is not a number from 0 to 65535 nor a service name", name, value, port)
		}
	}
	return nil
}
