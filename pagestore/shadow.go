package pagestore

import (
	"sync"
	"sync/atomic"

	"github.com/pd3-go/pd3/pageid"
)

// Options.Shadow reads again, from the remote, the pages of every read
// the Store served, as a perfect prefetcher would have fetched them: in
// runs of up to shadowRunPages, a read that starts at most shadowGap
// pages past the end of a pending run extending it (the pages between
// too, as a window that covered them would). shadowRuns runs are pending
// at once, one per stream; a read that extends none starts a run in place
// of the one least recently extended, which is read then.
const (
	shadowRunPages = 1 << 20 / pageid.Size
	shadowGap      = 64
	shadowRuns     = 8
)

type shadow struct {
	mu   sync.Mutex
	runs [shadowRuns]shadowRun
	tick uint64
	bufs sync.Pool // *[]byte of shadowRunPages pages

	pages atomic.Uint64
}

// shadowRun is the pages [first, end) of vol, waiting to be read; end is
// 0 for a free slot.
type shadowRun struct {
	vol        uint16
	first, end uint64
	touched    uint64 // shadow.tick when a read last extended it
}

// shadowRead notes that the n bytes at byte offset off of volume vol were
// served, and reads the runs that complete, without waiting for them. A
// remote that cannot read runs asynchronously is not shadowed.
func (s *Store) shadowRead(vol uint16, off uint64, n int) {
	pr, ok := s.remote.(AsyncPagesReader)
	if !ok || n <= 0 {
		return
	}
	first, end := off/pageid.Size, (off+uint64(n)+pageid.Size-1)/pageid.Size
	var out [shadowRuns + 2]shadowRun
	for _, r := range s.shadow.note(vol, first, end, out[:0]) {
		s.shadowFetch(pr, r)
	}
}

// note adds pages [first, end) of vol to a pending run and appends to
// ready the runs it completed.
func (sh *shadow) note(vol uint16, first, end uint64, ready []shadowRun) []shadowRun {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	sh.tick++
	slot := -1
	for i := range sh.runs {
		r := &sh.runs[i]
		if r.end != 0 && r.vol == vol && first >= r.first && first <= r.end+shadowGap {
			slot = i
			break
		}
	}
	if slot < 0 {
		slot = 0
		for i := range sh.runs {
			if sh.runs[i].end == 0 || sh.runs[i].touched < sh.runs[slot].touched {
				slot = i
				if sh.runs[i].end == 0 {
					break
				}
			}
		}
		if r := sh.runs[slot]; r.end != 0 {
			ready = append(ready, r)
		}
		sh.runs[slot] = shadowRun{vol: vol, first: first, end: first}
	}
	r := &sh.runs[slot]
	r.end, r.touched = max(r.end, end), sh.tick
	for r.end-r.first >= shadowRunPages {
		ready = append(ready, shadowRun{vol: vol, first: r.first, end: r.first + shadowRunPages})
		r.first += shadowRunPages
	}
	if r.first == r.end {
		*r = shadowRun{}
	}
	return ready
}

// shadowFlush reads every pending run now (tests). Runs are pending only
// at a remote shadowRead reads from.
func (s *Store) shadowFlush() {
	pr, _ := s.remote.(AsyncPagesReader)
	s.shadow.mu.Lock()
	runs := s.shadow.runs
	s.shadow.runs = [shadowRuns]shadowRun{}
	s.shadow.mu.Unlock()
	for _, r := range runs {
		if r.end != 0 {
			s.shadowFetch(pr, r)
		}
	}
}

// shadowFetch reads run r through pr into a scratch buffer and drops it,
// without waiting.
func (s *Store) shadowFetch(pr AsyncPagesReader, r shadowRun) {
	bp, _ := s.shadow.bufs.Get().(*[]byte)
	if bp == nil {
		b := make([]byte, shadowRunPages*pageid.Size)
		bp = &b
	}
	n := r.end - r.first
	s.shadow.pages.Add(n)
	pr.ReadPagesAsync(pageid.MakeKey(r.vol, r.first), (*bp)[:n*pageid.Size], func(error) { s.shadow.bufs.Put(bp) })
}
