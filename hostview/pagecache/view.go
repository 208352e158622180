package pagecache

import (
	"sort"
	"sync"

	"github.com/pd3-go/pd3/hostview"
	"github.com/pd3-go/pd3/pageid"
)

// View is a Sink that keeps a Host View of one mount's kernel page cache
// (page keys, for the agent) and per-file counters (for cachestat).
type View struct {
	// Set, if set, receives the keys of the pages the kernel holds.
	Set *hostview.Set
	// OnRange, if set, hears the same as ranges (a split agent gets them
	// as messages).
	OnRange func(added bool, first pageid.Key, pages int)
	// KeyOf maps (inode, page index) to the page's key; false for files
	// without data pages (nothing to track).
	KeyOf func(ino, index uint64) (pageid.Key, bool)
	// OnRead, if set, hears every read the kernel saw (hit or miss).
	OnRead func(first pageid.Key, pages int)

	mu    sync.Mutex
	files map[uint64]*FileStats
}

// FileStats are one file's page-cache counters since the tracker started.
type FileStats struct {
	Ino uint64
	// Resident is the pages held now, as far as the events since the
	// start tell (pages cached before it are not counted).
	Resident int64
	// Accessed counts pages read or faulted; Added pages brought in (read
	// misses, and pages written). Hits are Accessed minus the misses.
	Accessed, Added uint64

	lastFirst, lastLast uint64 // the last read range, to drop repeats
}

// Hits estimates cache hits as accesses not matched by an insertion, as
// bcc's cachestat does.
func (f FileStats) Hits() uint64 {
	if f.Added >= f.Accessed {
		return 0
	}
	return f.Accessed - f.Added
}

// maxRange bounds the pages one event may name (a huge folio is 512).
const maxRange = 1 << 12

// Event implements Sink.
func (v *View) Event(e Event) {
	if e.Last < e.First || e.Last-e.First >= maxRange {
		return
	}
	n := e.Last - e.First + 1
	first, ok := v.KeyOf(e.Ino, e.First)
	v.mu.Lock()
	if v.files == nil {
		v.files = make(map[uint64]*FileStats)
	}
	fs := v.files[e.Ino]
	if fs == nil {
		fs = &FileStats{Ino: e.Ino}
		v.files[e.Ino] = fs
	}
	switch e.Kind {
	case Added:
		fs.Resident += int64(n)
		fs.Added += n
	case Deleted:
		fs.Resident = max(0, fs.Resident-int64(n))
	case Accessed:
		// The kernel reports a read once per batch of pages it hands
		// out, each time from the batch to the end of the request: the
		// later reports are suffixes of the first and add nothing.
		if e.Last == fs.lastLast && e.First > fs.lastFirst && fs.Accessed > 0 {
			v.mu.Unlock()
			return
		}
		fs.lastFirst, fs.lastLast = e.First, e.Last
		fs.Accessed += n
	}
	v.mu.Unlock()
	if !ok {
		return
	}
	vol, base := first.Volume(), first.Page()
	if v.OnRange != nil && e.Kind != Accessed {
		v.OnRange(e.Kind == Added, first, int(n))
	}
	switch {
	case v.Set == nil:
	case e.Kind == Added:
		for i := uint64(0); i < n; i++ {
			v.Set.Add(uint64(pageid.MakeKey(vol, base+i)))
		}
	case e.Kind == Deleted:
		for i := uint64(0); i < n; i++ {
			v.Set.Delete(uint64(pageid.MakeKey(vol, base+i)))
		}
	}
	if e.Kind == Accessed && v.OnRead != nil {
		v.OnRead(first, int(n))
	}
}

// Files returns the counters of every file seen, by inode number.
func (v *View) Files() []FileStats {
	v.mu.Lock()
	out := make([]FileStats, 0, len(v.files))
	for _, f := range v.files {
		out = append(out, *f)
	}
	v.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Ino < out[j].Ino })
	return out
}
