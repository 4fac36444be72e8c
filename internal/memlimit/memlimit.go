// Package memlimit reads how much memory this process may use: the
// machine's memory, or less when the process runs in a memory cgroup
// (a container's limit, a Kubernetes Pod's resources.limits.memory, a
// systemd unit's MemoryMax). Sizing caches from the machine's memory
// inside a smaller cgroup gets a process killed by the kernel's OOM
// killer, or reclaiming its own page cache without end.
//
// Both cgroup versions are read the way the kernel applies them: the
// limit of the process's own group and of every group above it, the
// smallest wins (cgroup v1's memory.stat says so directly as
// hierarchical_memory_limit). Inside a container whose /proc/self/cgroup
// names a path its /sys/fs/cgroup does not show (no cgroup namespace),
// the mount's root is the container's own group.
package memlimit

import (
	"bufio"
	"io/fs"
	"os"
	"path"
	"strconv"
	"strings"
)

// Limits is what bounds this process's memory, in bytes; 0 where
// unknown or unlimited.
type Limits struct {
	// Physical is the machine's memory (MemTotal of /proc/meminfo).
	Physical int64
	// Cgroup is the memory cgroup's limit (v1 or v2), the smallest along
	// the group's path.
	Cgroup int64
}

// Effective is the memory the process may use: the smaller of the
// cgroup's limit and the machine's memory that are known; 0 when
// neither is.
func (l Limits) Effective() int64 {
	switch {
	case l.Cgroup > 0 && (l.Physical <= 0 || l.Cgroup < l.Physical):
		return l.Cgroup
	case l.Physical > 0:
		return l.Physical
	}
	return 0
}

// Read reads this process's limits from /proc and /sys/fs/cgroup.
func Read() Limits { return read(os.DirFS("/")) }

// unlimited: cgroup v1 writes "no limit" as the largest page-aligned
// int64 (9223372036854771712); anything this large is no limit.
const unlimited = 1 << 60

// read is Read on a file system rooted at "/" (a fstest.MapFS in tests).
func read(fsys fs.FS) Limits {
	l := Limits{Physical: memTotal(fsys)}
	b, err := fs.ReadFile(fsys, "proc/self/cgroup")
	if err != nil {
		return l
	}
	for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		var n int64
		switch {
		case hasController(parts[1], "memory"):
			n = v1Limit(fsys, parts[2])
		case parts[0] == "0" && parts[1] == "":
			n = v2Limit(fsys, parts[2])
		default:
			continue
		}
		if n > 0 && (l.Cgroup == 0 || n < l.Cgroup) {
			l.Cgroup = n
		}
	}
	return l
}

func hasController(list, c string) bool {
	for _, s := range strings.Split(list, ",") {
		if s == c {
			return true
		}
	}
	return false
}

// v1Limit is a cgroup v1 memory group's limit: hierarchical_memory_limit
// from its memory.stat (the smallest limit on the way to the root), else
// its memory.limit_in_bytes; the group at p under the memory mount, or
// the mount's root when p is not there.
func v1Limit(fsys fs.FS, p string) int64 {
	for _, dir := range []string{path.Join("sys/fs/cgroup/memory", p), "sys/fs/cgroup/memory"} {
		if n, ok := statValue(fsys, path.Join(dir, "memory.stat"), "hierarchical_memory_limit"); ok {
			return limitValue(n)
		}
		if n, ok := fileValue(fsys, path.Join(dir, "memory.limit_in_bytes")); ok {
			return limitValue(n)
		}
	}
	return 0
}

// v2Limit is the smallest memory.max from the group at p up to the
// cgroup2 mount's root (the root itself has none); when p is not there,
// the mount's root is the process's group (a container without a cgroup
// namespace) and its memory.max is the limit.
func v2Limit(fsys fs.FS, p string) int64 {
	dir := path.Join("sys/fs/cgroup", p)
	if _, err := fs.Stat(fsys, dir); err != nil {
		dir = "sys/fs/cgroup"
	}
	var least int64
	for {
		if n, ok := fileValue(fsys, path.Join(dir, "memory.max")); ok {
			if n = limitValue(n); n > 0 && (least == 0 || n < least) {
				least = n
			}
		}
		if dir == "sys/fs/cgroup" || dir == "." {
			return least
		}
		dir = path.Dir(dir)
	}
}

func limitValue(n int64) int64 {
	if n <= 0 || n >= unlimited {
		return 0
	}
	return n
}

// fileValue reads a file holding one integer; "max" (cgroup v2's no
// limit) reads as unlimited.
func fileValue(fsys fs.FS, name string) (int64, bool) {
	b, err := fs.ReadFile(fsys, name)
	if err != nil {
		return 0, false
	}
	s := strings.TrimSpace(string(b))
	if s == "max" {
		return unlimited, true
	}
	n, err := strconv.ParseInt(s, 10, 64)
	return n, err == nil
}

// statValue reads key's value from a "key value" file (memory.stat).
func statValue(fsys fs.FS, name, key string) (int64, bool) {
	f, err := fsys.Open(name)
	if err != nil {
		return 0, false
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), " ")
		if ok && k == key {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}

// memTotal reads MemTotal (kB) from /proc/meminfo; 0 when absent.
func memTotal(fsys fs.FS) int64 {
	f, err := fsys.Open("proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) >= 2 && fields[0] == "MemTotal:" {
			kb, err := strconv.ParseInt(fields[1], 10, 64)
			if err != nil {
				return 0
			}
			return kb << 10
		}
	}
	return 0
}
