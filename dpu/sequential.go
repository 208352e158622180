package dpu

import (
	"sync"
	"sync/atomic"

	"github.com/pd3-go/pd3/pageid"
)

// Sequential predicts the next pages of sequential streams and steps
// aside when its predictions are not used.
//
// Streams: each source (every mirrored connection together, the FUSE
// server, the kernel page-cache tracker) has up to streamsPerSource
// streams per volume, so that interleaved readers (the backends of a
// database behind one loop device, spread over a client's connections)
// are followed apart. A read that starts at or
// shortly after where a stream's last read ended (or overlaps its end:
// readahead windows and page-aligned re-reads do) continues it and doubles
// its window, up to MaxWindow pages, and the window after the read is
// predicted; a read that continues no stream replaces the least recently
// used one. Only pages not predicted before are proposed: a stream of
// page faults would otherwise re-propose the same window for every page.
//
// Governor (SODA's lesson: a prefetcher that does not pay steps aside):
// a predicted page is useful when a later read of its stream asks for it,
// and wasted when it is still unread a ring of trackPages behind the
// stream's prediction, or when its stream is replaced.
// Every governEpoch pages judged, the share that was useful sets the
// level: at least governOn, every window may grow to MaxWindow; between
// governOff and governOn, windows are capped at a quarter of it; below
// governOff the predictor is off. Off, it keeps following streams and
// judging what it would have predicted (costing nothing: no prefetch is
// issued) and comes back on once that is accurate again
// (docs/decisions.md, 2).
type Sequential struct {
	// MaxWindow bounds the pages predicted per read (default 256: 1 MiB).
	MaxWindow int

	mu      sync.Mutex
	streams map[seqKey]*seqSet
	tick    uint64
	// Judged in the current epoch.
	useful, wasted uint64
	level          int // governOnLevel, governNarrowLevel, governOffLevel

	stats SequentialStats
}

// SequentialStats are a predictor's counters.
type SequentialStats struct {
	// Predicted counts pages proposed for prefetching (not counting what
	// it judged while off).
	Predicted atomic.Uint64
	// Useful and Wasted count predictions judged (while off too).
	Useful, Wasted atomic.Uint64
	// Switches counts changes of level (on, narrow, off).
	Switches atomic.Uint64
	// Off is 1 while the governor holds the predictor off.
	Off atomic.Uint32
}

// Governor thresholds: useful shares of one epoch of judged pages.
const (
	governEpoch = 2048
	governOn    = 0.6
	governOff   = 0.3
)

const (
	governOnLevel = iota
	governNarrowLevel
	governOffLevel
)

type seqKey struct {
	src int
	vol uint16
}

// streamsPerSource bounds the streams followed per source and volume.
const streamsPerSource = 8

type seqSet struct {
	s [streamsPerSource]seqStream
}

type seqStream struct {
	next   uint64 // the page a sequential read would start at; 0: unused slot
	window int
	ahead  uint64 // pages below this were predicted already
	first  uint64 // the first page predicted for the stream
	used   uint64 // tick of the last read
	// Predicted pages not read yet, as a ring of bits by page number
	// over [base, base+trackPages): a read clears them (useful); a page
	// that falls out of the ring, or is left when the stream is
	// replaced, was wasted.
	base    uint64
	pending [trackPages / 64]uint64
}

// trackPages is how far behind its prediction a stream judges reads:
// two of the largest windows, so that stragglers up to a window behind
// the stream's end count.
const trackPages = 512

// mark records pages [from, to) as predicted, judging the pages that fall
// out of the ring on the way.
func (st *seqStream) mark(s *Sequential, from, to uint64) {
	if to > st.base+trackPages {
		s.judge(0, st.take(st.base, to-trackPages))
		st.base = to - trackPages
	}
	for p := from; p < to; p++ {
		st.pending[p%trackPages/64] |= 1 << (p % 64)
	}
}

// take clears the pending pages in [start, last) (within the ring) and
// returns how many there were: read by a request, or fallen out unread.
func (st *seqStream) take(start, last uint64) uint64 {
	var n uint64
	for p := max(start, st.base); p < last && p < st.base+trackPages; p++ {
		w, b := &st.pending[p%trackPages/64], uint64(1)<<(p%64)
		if *w&b != 0 {
			*w &^= b
			n++
		}
	}
	return n
}

// maxStreams bounds the (source, volume) pairs remembered; past it they
// are forgotten wholesale (a cold start for each, never unbounded memory).
const maxStreams = 4096

// seqGap is how far past a stream's end a read may start and still
// continue it (a reader that skips a few pages, or two requests of one
// stream served out of order).
const seqGap = 16

// Stats returns the predictor's counters.
func (s *Sequential) Stats() *SequentialStats { return &s.stats }

// Access records a read of n pages from first by source src and appends
// the pages to prefetch to out, none at or past page end (the file's or
// volume's end; 0: no bound).
func (s *Sequential) Access(src int, first pageid.Key, n int, end uint64, out []pageid.Key) []pageid.Key {
	out, _ = s.access(src, first, n, end, out)
	return out
}

// AccessCovered is Access that also says whether every page of the read
// was predicted before (and so is prefetched, or being prefetched,
// already, unless the host holds it).
func (s *Sequential) AccessCovered(src int, first pageid.Key, n int, end uint64, out []pageid.Key) ([]pageid.Key, bool) {
	return s.access(src, first, n, end, out)
}

func (s *Sequential) access(src int, first pageid.Key, n int, end uint64, out []pageid.Key) (_ []pageid.Key, covered bool) {
	if n <= 0 || first.Page() == 0 && end > 0 && uint64(n) >= end {
		// A whole file in one read (a small file's READ, the kernel's
		// read of it): nothing lies past it, and no stream of it to
		// keep (docs/decisions.md, 44).
		return out, false
	}
	maxW := s.MaxWindow
	if maxW <= 0 {
		maxW = 256
	}
	k := seqKey{src, first.Volume()}
	start, last := first.Page(), first.Page()+uint64(n)
	s.mu.Lock()
	if s.streams == nil || len(s.streams) >= maxStreams {
		s.streams = make(map[seqKey]*seqSet)
	}
	set := s.streams[k]
	if set == nil {
		set = new(seqSet)
		s.streams[k] = set
	}
	s.tick++
	var st *seqStream
	for i := range set.s {
		c := &set.s[i]
		if c.next == 0 {
			continue
		}
		// At most seqGap pages past the stream's end, or inside what was
		// predicted for it, or a straggler up to a window behind its end
		// (requests of one stream spread over several connections
		// arrive out of order).
		if start <= max(c.next+seqGap, c.ahead) && last+uint64(max(c.window, 4*n, seqGap)) > c.next {
			st = c
			break
		}
	}
	if st != nil {
		covered = s.level != governOffLevel && start >= st.first && last <= st.ahead
		s.judge(st.take(start, last), 0)
		if last <= st.next { // a straggler: nothing new to predict
			st.used = s.tick
			s.mu.Unlock()
			return out, covered
		}
		st.window = min(max(2*st.window, n, 8), maxW)
	} else {
		st = &set.s[0]
		for i := range set.s {
			if set.s[i].used < st.used {
				st = &set.s[i]
			}
		}
		if st.next != 0 {
			s.judge(0, st.take(st.base, st.base+trackPages))
		}
		*st = seqStream{first: last, base: last}
	}
	st.next, st.used = last, s.tick
	if end == 0 {
		end = 1 << pageid.PageBits
	}
	w := st.window
	if s.level == governNarrowLevel {
		w = min(w, max(maxW/4, 8))
	}
	from, to := max(last, st.ahead), min(last+uint64(w), end)
	if to > from {
		st.mark(s, from, to)
		st.ahead = to
	} else {
		st.ahead = max(st.ahead, last)
	}
	off := s.level == governOffLevel
	s.mu.Unlock()
	if off || to <= from {
		return out, covered
	}
	s.stats.Predicted.Add(to - from)
	for p := from; p < to; p++ {
		out = append(out, pageid.MakeKey(first.Volume(), p))
	}
	return out, covered
}

// judge counts predictions found useful or wasted and, at the end of an
// epoch, sets the level. s.mu is held.
func (s *Sequential) judge(useful, wasted uint64) {
	s.useful += useful
	s.wasted += wasted
	s.stats.Useful.Add(useful)
	s.stats.Wasted.Add(wasted)
	total := s.useful + s.wasted
	if total < governEpoch {
		return
	}
	acc := float64(s.useful) / float64(total)
	s.useful, s.wasted = 0, 0
	level := governOffLevel
	switch {
	case acc >= governOn:
		level = governOnLevel
	case acc >= governOff && s.level != governOffLevel:
		// Off, it comes back only once fully accurate again.
		level = governNarrowLevel
	}
	if level == s.level {
		return
	}
	s.level = level
	s.stats.Switches.Add(1)
	if level == governOffLevel {
		s.stats.Off.Store(1)
	} else {
		s.stats.Off.Store(0)
	}
}
