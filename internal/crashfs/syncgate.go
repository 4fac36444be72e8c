package crashfs

import (
	"strings"
	"sync"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// SyncGate is a file system that, while armed, holds every sync of a
// write-ahead log (a "*.log" file) until Release: a disk slow to sync,
// or a large write under way, for tests of what waits on it (the
// store's and the embedding worker's lock-free reads during an upsert).
type SyncGate struct {
	vfs.FS
	mu      sync.Mutex
	armed   bool
	blocked chan struct{}
	release chan struct{}
}

// NewSyncGate wraps fs, disarmed.
func NewSyncGate(fs vfs.FS) *SyncGate {
	return &SyncGate{FS: fs, blocked: make(chan struct{}, 16), release: make(chan struct{})}
}

// Arm starts (on) or stops holding syncs; syncs held stay held until
// Release.
func (g *SyncGate) Arm(on bool) {
	g.mu.Lock()
	g.armed = on
	g.mu.Unlock()
}

// Blocked receives once per sync held.
func (g *SyncGate) Blocked() <-chan struct{} { return g.blocked }

// Release lets every sync held, and every later one, go on; once only.
func (g *SyncGate) Release() { close(g.release) }

func (g *SyncGate) wrap(f vfs.File, name string, err error) (vfs.File, error) {
	if err != nil || !strings.HasSuffix(name, ".log") {
		return f, err
	}
	return &gatedFile{File: f, g: g}, nil
}

// Create wraps a created write-ahead log.
func (g *SyncGate) Create(name string, cat vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := g.FS.Create(name, cat)
	return g.wrap(f, name, err)
}

// ReuseForWrite wraps a recycled write-ahead log.
func (g *SyncGate) ReuseForWrite(old, name string, cat vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := g.FS.ReuseForWrite(old, name, cat)
	return g.wrap(f, name, err)
}

func (g *SyncGate) hold() {
	g.mu.Lock()
	armed := g.armed
	g.mu.Unlock()
	if armed {
		g.blocked <- struct{}{}
		<-g.release
	}
}

type gatedFile struct {
	vfs.File
	g *SyncGate
}

func (f *gatedFile) Sync() error                  { f.g.hold(); return f.File.Sync() }
func (f *gatedFile) SyncData() error              { f.g.hold(); return f.File.SyncData() }
func (f *gatedFile) SyncTo(n int64) (bool, error) { f.g.hold(); return f.File.SyncTo(n) }
