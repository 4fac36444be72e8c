package storebench

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// IOStats counts the file reads of a store: every ReadAt of a file its
// FS opened (SST blocks the block cache did not hold; from the page cache
// or the device).
type IOStats struct {
	Reads, Bytes, Nanos atomic.Int64
}

// IOSnap is IOStats at one moment, with the process's device reads
// (/proc/self/io read_bytes) and CPU time.
type IOSnap struct {
	Reads, Bytes, Nanos int64
	DeviceBytes         int64
	CPU                 time.Duration
	At                  time.Time
}

// Snap reads the counters now.
func (s *IOStats) Snap() IOSnap {
	cpu := cpuTime()
	return IOSnap{Reads: s.Reads.Load(), Bytes: s.Bytes.Load(), Nanos: s.Nanos.Load(), DeviceBytes: procReadBytes(), CPU: cpu, At: time.Now()}
}

// Sub is the difference a - b.
func (a IOSnap) Sub(b IOSnap) IOSnap {
	return IOSnap{Reads: a.Reads - b.Reads, Bytes: a.Bytes - b.Bytes, Nanos: a.Nanos - b.Nanos,
		DeviceBytes: a.DeviceBytes - b.DeviceBytes, CPU: a.CPU - b.CPU, At: a.At}
}

// procReadBytes is the bytes this process caused to be read from a block
// device (page cache hits excluded); -1 where /proc/self/io is missing.
func procReadBytes() int64 {
	f, err := os.Open("/proc/self/io")
	if err != nil {
		return -1
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "read_bytes: "); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	return -1
}

// processCPU is the user and system CPU time of process pid, all its
// threads: utime and stime of /proc/PID/stat, in USER_HZ ticks (100 a
// second on Linux); false where /proc does not say.
func processCPU(pid int) (time.Duration, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, false
	}
	return statCPU(string(b))
}

// statCPU reads utime and stime (fields 14 and 15) from a
// /proc/PID/stat line; the command's name (field 2) is in parentheses
// and may hold spaces and parentheses of its own.
func statCPU(line string) (time.Duration, bool) {
	i := strings.LastIndexByte(line, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(line[i+1:]) // from field 3
	if len(f) < 13 {
		return 0, false
	}
	u, err := strconv.ParseInt(f[11], 10, 64)
	if err != nil {
		return 0, false
	}
	s, err := strconv.ParseInt(f[12], 10, 64)
	if err != nil {
		return 0, false
	}
	return time.Duration(u+s) * (time.Second / 100), true
}

// timedFS times the reads of the files it opens.
type timedFS struct {
	vfs.FS
	st *IOStats
}

func (fs timedFS) Open(name string, opts ...vfs.OpenOption) (vfs.File, error) {
	f, err := fs.FS.Open(name, opts...)
	if err != nil {
		return nil, err
	}
	return timedFile{f, fs.st}, nil
}

type timedFile struct {
	vfs.File
	st *IOStats
}

func (f timedFile) ReadAt(p []byte, off int64) (int, error) {
	t0 := time.Now()
	n, err := f.File.ReadAt(p, off)
	f.st.Nanos.Add(int64(time.Since(t0)))
	f.st.Reads.Add(1)
	f.st.Bytes.Add(int64(n))
	return n, err
}

// EvictPageCache drops the page cache of every file under dir
// (fadvise DONTNEED), so the next reads come from the device and are
// charged to the reader's memory cgroup; a no-op where unsupported.
func EvictPageCache(dir string) (files int, err error) {
	err = filepath.WalkDir(dir, func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		f, err := os.Open(path)
		if err != nil {
			return nil // a file Pebble just removed
		}
		defer f.Close()
		if fadviseDontNeed(f) == nil {
			files++
		}
		return nil
	})
	return files, err
}
