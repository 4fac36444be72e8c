package memlimit

import (
	"testing"
	"testing/fstest"
)

const meminfo = "MemTotal:       24591660 kB\nMemFree:         1000 kB\n"

func TestRead(t *testing.T) {
	physical := int64(24591660) << 10
	for _, tc := range []struct {
		name  string
		files map[string]string
		want  Limits
	}{
		{
			name:  "no cgroup file",
			files: map[string]string{"proc/meminfo": meminfo},
			want:  Limits{Physical: physical},
		},
		{
			name: "v1 group with a limit (hierarchical_memory_limit wins)",
			files: map[string]string{
				"proc/meminfo":     meminfo,
				"proc/self/cgroup": "12:cpu,cpuacct:/user\n9:memory:/prism-ltm\n0::/user.slice\n",
				"sys/fs/cgroup/memory/prism-ltm/memory.limit_in_bytes": "805306368\n",
				"sys/fs/cgroup/memory/prism-ltm/memory.stat":           "cache 1\nhierarchical_memory_limit 536870912\nrss 2\n",
			},
			want: Limits{Physical: physical, Cgroup: 512 << 20},
		},
		{
			name: "v1 without memory.stat: memory.limit_in_bytes",
			files: map[string]string{
				"proc/self/cgroup": "9:memory:/a\n",
				"sys/fs/cgroup/memory/a/memory.limit_in_bytes": "805306368\n",
			},
			want: Limits{Cgroup: 768 << 20},
		},
		{
			name: "v1 unlimited",
			files: map[string]string{
				"proc/meminfo":     meminfo,
				"proc/self/cgroup": "9:memory:/\n",
				"sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712\n",
			},
			want: Limits{Physical: physical},
		},
		{
			name: "v1 container without a cgroup namespace: the mount's root is the group",
			files: map[string]string{
				"proc/self/cgroup":                           "4:memory:/docker/0123abcd\n",
				"sys/fs/cgroup/memory/memory.limit_in_bytes": "1073741824\n",
			},
			want: Limits{Cgroup: 1 << 30},
		},
		{
			name: "v2: the smallest memory.max on the way up",
			files: map[string]string{
				"proc/meminfo":     meminfo,
				"proc/self/cgroup": "0::/kubepods/pod1/ctr\n",
				"sys/fs/cgroup/kubepods/pod1/ctr/memory.max": "max\n",
				"sys/fs/cgroup/kubepods/pod1/memory.max":     "2147483648\n",
				"sys/fs/cgroup/kubepods/memory.max":          "17179869184\n",
			},
			want: Limits{Physical: physical, Cgroup: 2 << 30},
		},
		{
			name: "v2 container without a cgroup namespace",
			files: map[string]string{
				"proc/self/cgroup":          "0::/system.slice/docker-01.scope\n",
				"sys/fs/cgroup/memory.max":  "1073741824\n",
				"sys/fs/cgroup/cgroup.type": "domain\n",
			},
			want: Limits{Cgroup: 1 << 30},
		},
		{
			name: "v2 unlimited everywhere",
			files: map[string]string{
				"proc/self/cgroup":           "0::/a\n",
				"sys/fs/cgroup/a/memory.max": "max\n",
			},
			want: Limits{},
		},
		{
			name:  "meminfo without MemTotal",
			files: map[string]string{"proc/meminfo": "MemFree: 3 kB\n"},
			want:  Limits{},
		},
		{
			name: "unparsable values are no limit",
			files: map[string]string{
				"proc/meminfo":     "MemTotal: lots kB\n",
				"proc/self/cgroup": "garbage\n9:memory:/a\n",
				"sys/fs/cgroup/memory/a/memory.limit_in_bytes": "many\n",
			},
			want: Limits{},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fsys := fstest.MapFS{}
			for name, data := range tc.files {
				fsys[name] = &fstest.MapFile{Data: []byte(data)}
			}
			if got := read(fsys); got != tc.want {
				t.Fatalf("read = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestEffective(t *testing.T) {
	for _, tc := range []struct {
		l    Limits
		want int64
	}{
		{Limits{}, 0},
		{Limits{Physical: 100}, 100},
		{Limits{Cgroup: 50}, 50},
		{Limits{Physical: 100, Cgroup: 50}, 50},
		{Limits{Physical: 100, Cgroup: 500}, 100},
	} {
		if got := tc.l.Effective(); got != tc.want {
			t.Errorf("%+v.Effective() = %d, want %d", tc.l, got, tc.want)
		}
	}
}

// TestReadHere reads this machine: whatever it finds must be sane.
func TestReadHere(t *testing.T) {
	l := Read()
	if l.Physical < 0 || l.Cgroup < 0 {
		t.Fatalf("Read() = %+v", l)
	}
	t.Logf("this process: %+v, effective %d MiB", l, l.Effective()>>20)
}
