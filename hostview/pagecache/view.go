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
	// Quiet, if set, reports whether the file whose first page is first
	// needs no Host View for now (its mount reads it ahead itself): the
	// view then mutes its events (Mute) and forgets its pages, so that
	// Host View never claims a page the kernel may have dropped since.
	Quiet func(first pageid.Key) bool

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
	// lo and hi bound the pages added since the view last forgot the
	// file (none if lo > hi); muted while Mute says so.
	lo, hi uint64
	muted  bool
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
	fs := v.file(e.Ino)
	switch e.Kind {
	case Added:
		fs.Resident += int64(n)
		fs.Added += n
		if fs.lo > fs.hi {
			fs.lo, fs.hi = e.First, e.Last
		} else {
			fs.lo, fs.hi = min(fs.lo, e.First), max(fs.hi, e.Last)
		}
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
		v.forget(first, n)
	}
	if e.Kind == Accessed && v.OnRead != nil {
		v.OnRead(first, int(n))
	}
}

// file returns inode ino's counters (v.mu held).
func (v *View) file(ino uint64) *FileStats {
	if v.files == nil {
		v.files = make(map[uint64]*FileStats)
	}
	fs := v.files[ino]
	if fs == nil {
		fs = &FileStats{Ino: ino, lo: 1}
		v.files[ino] = fs
	}
	return fs
}

// Mute implements Muter: a file is muted while Quiet says so. On muting,
// the pages of the file the view holds leave it (and OnRange hears them
// dropped): the kernel's deletes will not be heard. Its counters stop
// meanwhile, and its Resident count restarts from zero.
func (v *View) Mute(ino uint64) bool {
	if v.Quiet == nil {
		return false
	}
	first, ok := v.KeyOf(ino, 0)
	quiet := ok && v.Quiet(first)
	v.mu.Lock()
	fs := v.file(ino)
	was := fs.muted
	fs.muted = quiet
	lo, hi := fs.lo, fs.hi
	if quiet && !was {
		fs.lo, fs.hi, fs.Resident = 1, 0, 0
	}
	v.mu.Unlock()
	if !quiet || was || lo > hi {
		return quiet
	}
	for at := lo; at <= hi; at += maxRange {
		n := min(hi-at+1, maxRange)
		k, ok := v.KeyOf(ino, at)
		if !ok {
			break
		}
		if v.OnRange != nil {
			v.OnRange(false, k, int(n))
		}
		if v.Set != nil {
			v.forget(k, n)
		}
	}
	return true
}

// forget takes the n pages from first out of v.Set.
func (v *View) forget(first pageid.Key, n uint64) {
	vol, base := first.Volume(), first.Page()
	for i := uint64(0); i < n; i++ {
		v.Set.Delete(uint64(pageid.MakeKey(vol, base+i)))
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
