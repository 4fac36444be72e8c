package flagval

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
)

func TestBytes(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
		bad  bool
	}{
		{"", 0, false},
		{"  ", 0, false},
		{"1234", 1234, false},
		{"64MiB", 64 << 20, false},
		{"256mib", 256 << 20, false},
		{"2GB", 2e9, false},
		{"2GiB", 2 << 30, false},
		{"512k", 512 << 10, false},
		{"512KB", 512e3, false},
		{"1.5g", 3 << 29, false},
		{"10b", 10, false},
		{" 8 MiB ", 8 << 20, false},
		{"0", 0, false},
		{"-1", 0, true},
		{"-64MiB", 0, true},
		{"auto", 0, true},
		{"12 parsecs", 0, true},
		{"MiB", 0, true},
		// NaN, infinities and sizes past int64 read as a negative size.
		{"NaN", 0, true},
		{"inf", 0, true},
		{"+Infinity MiB", 0, true},
		{"1e19", 0, true},
		{"9e9GiB", 0, true},
		{"8e18", 8e18, false},
	} {
		got, err := Bytes(tc.in)
		if (err != nil) != tc.bad || got != tc.want {
			t.Errorf("Bytes(%q) = %d, %v; want %d, error %v", tc.in, got, err, tc.want, tc.bad)
		}
	}
}

func TestFormatBytes(t *testing.T) {
	for _, tc := range []struct {
		in   int64
		want string
	}{
		{0, "0B"}, {1023, "1023B"}, {1 << 10, "1KiB"}, {768 << 20, "768MiB"},
		{3 << 29, "1.5GiB"}, {2 << 30, "2GiB"}, {-(64 << 20), "-64MiB"}, {1536 << 10, "1.5MiB"},
	} {
		got := FormatBytes(tc.in)
		if got != tc.want {
			t.Errorf("FormatBytes(%d) = %q, want %q", tc.in, got, tc.want)
		}
		// What it writes, Bytes reads back (to the printed precision).
		if tc.in >= 0 {
			if n, err := Bytes(got); err != nil || n != tc.in {
				t.Errorf("Bytes(FormatBytes(%d) = %q) = %d, %v", tc.in, got, n, err)
			}
		}
	}
}

func TestPositive(t *testing.T) {
	for _, tc := range []struct {
		args      []string
		bad, bad0 string // from Positive, NonNegative
	}{
		{nil, "", ""},
		{[]string{"--n", "3", "--d", "1ms", "--f", "0.5"}, "", ""},
		{[]string{"--n", "0"}, "--n 0: want a positive value", ""},
		{[]string{"--n", "-1"}, "--n -1: want a positive value", "--n -1: want 0 or more"},
		{[]string{"--d", "0s"}, "--d 0s: want a positive value", ""},
		{[]string{"--d", "-1s"}, "--d -1s: want a positive value", "--d -1s: want 0 or more"},
		{[]string{"--f", "0"}, "--f 0: want a positive value", ""},
		{[]string{"--f", "-0.5"}, "--f -0.5: want a positive value", "--f -0.5: want 0 or more"},
		{[]string{"--f", "NaN"}, "--f NaN: want a positive value", "--f NaN: want 0 or more"},
		// An infinite rate, size or share means nothing either (a
		// --tolerance of +Inf failed as "json: unsupported value").
		{[]string{"--f", "+Inf"}, "--f +Inf: want a finite number", "--f +Inf: want a finite number"},
		{[]string{"--f", "-Inf"}, "--f -Inf: want a positive value", "--f -Inf: want 0 or more"},
		{[]string{"--free", "-5"}, "", ""}, // not checked
	} {
		fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
		fs.Int("n", 7, "")
		fs.Duration("d", time.Second, "")
		fs.Float64("f", 1.05, "")
		fs.Int("free", 0, "")
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		err := Positive(fs, "n", "d", "f", "absent")
		if got := fmt.Sprint(err); tc.bad == "" && err != nil || tc.bad != "" && !strings.Contains(got, tc.bad) {
			t.Errorf("%v: %v, want %q", tc.args, err, tc.bad)
		}
		err = NonNegative(fs, "n", "d", "f", "absent")
		if got := fmt.Sprint(err); tc.bad0 == "" && err != nil || tc.bad0 != "" && !strings.Contains(got, tc.bad0) {
			t.Errorf("NonNegative %v: %v, want %q", tc.args, err, tc.bad0)
		}
	}
}

func TestAtMostPerCore(t *testing.T) {
	for _, tc := range []struct {
		cpus int
		args []string
		bad  string
	}{
		{2, nil, ""},
		{2, []string{"--threads", "16"}, ""},
		{2, []string{"--threads", "0"}, ""},
		{2, []string{"--threads", "-1"}, ""}, // the lower bound is the command's
		{2, []string{"--threads", "17"}, "--threads 17: want at most 16 on this machine of 2 cores (four a core, at least 16)"},
		{2, []string{"--threads", "10000"}, "--threads 10000: want at most 16"},
		{64, []string{"--threads", "256"}, ""},
		{64, []string{"--threads", "257"}, "--threads 257: want at most 256 on this machine of 64 cores"},
		{2, []string{"--workers", "1000"}, "--workers 1000: want at most 16"},
		{2, []string{"--free", "1000"}, ""}, // not checked
	} {
		fs := pflag.NewFlagSet("t", pflag.ContinueOnError)
		fs.Int("threads", 1, "")
		fs.Int("workers", 0, "")
		fs.Int("free", 0, "")
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		err := atMostPerCore(fs, tc.cpus, []string{"threads", "workers", "absent"})
		if got := fmt.Sprint(err); tc.bad == "" && err != nil || tc.bad != "" && !strings.Contains(got, tc.bad) {
			t.Errorf("%d cores, %v: %v, want %q", tc.cpus, tc.args, err, tc.bad)
		}
	}
}

func TestListenAddr(t *testing.T) {
	for _, tc := range []struct {
		value, want string // want: "" to pass
	}{
		{"127.0.0.1:0", ""},
		{":8500", ""},
		{"[::1]:8500", ""},
		{"localhost:http", ""},
		{"127.0.0.1:", ""},
		{"", "want HOST:PORT"},
		{"8500", "missing port"},
		{"fd00::5:8500", "too many colons"},
		{"127.0.0.1:65536", "not a number from 0 to 65535"},
		{"127.0.0.1:-1", "not a number from 0 to 65535"},
		{"127.0.0.1:nosuchservice", "nor a service name"},
	} {
		err := ListenAddr("addr", tc.value)
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("ListenAddr(%q) = %v, want %q", tc.value, err, tc.want)
		}
	}
}
