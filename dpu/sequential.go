package dpu

import (
	"sync"

	"github.com/pd3-go/pd3/memnode"
)

// Sequential predicts the next pages of sequential streams, one stream per
// (source, volume): a read that starts where the previous one of its
// stream ended doubles the window (up to MaxWindow pages) and the window
// after it is predicted; any other read resets the stream. It backs the
// FUSE path, where the kernel's own readahead has already sent the READs
// of the current window by the time the agent hears of the read: only the
// pages beyond it can be fetched before they are asked for.
type Sequential struct {
	// MaxWindow bounds the pages predicted per read (default 256: 1 MiB).
	MaxWindow int

	mu      sync.Mutex
	streams map[seqKey]*seqStream
}

type seqKey struct {
	src int
	vol uint16
}

type seqStream struct {
	next   uint64 // the page a sequential read would start at
	window int
	ahead  uint64 // pages below this were predicted already
}

// maxStreams bounds the streams remembered; past it they are forgotten
// wholesale (a cold start for each, never unbounded memory).
const maxStreams = 4096

// Access records a read of n pages from first by source src and appends
// the pages to prefetch to out, none at or past page end (the file's end;
// 0: no bound).
func (s *Sequential) Access(src int, first memnode.Key, n int, end uint64, out []memnode.Key) []memnode.Key {
	if n <= 0 {
		return out
	}
	maxW := s.MaxWindow
	if maxW <= 0 {
		maxW = 256
	}
	k := seqKey{src, first.Volume()}
	s.mu.Lock()
	if s.streams == nil || len(s.streams) >= maxStreams {
		s.streams = make(map[seqKey]*seqStream)
	}
	st := s.streams[k]
	if st == nil {
		st = &seqStream{}
		s.streams[k] = st
	}
	last := first.Page() + uint64(n)
	// A read that overlaps the end of the previous one (readahead windows
	// and page-aligned re-reads do) still continues the stream.
	if first.Page() <= st.next && last > st.next && st.next != 0 {
		st.window = min(max(2*st.window, n, 8), maxW)
	} else {
		st.window, st.ahead = 0, 0
	}
	st.next = last
	if end == 0 {
		end = 1 << memnode.PageBits
	}
	// Only pages not predicted before: a stream of page faults would
	// otherwise re-propose the same window for every page.
	from, to := max(last, st.ahead), min(last+uint64(st.window), end)
	if to > from {
		st.ahead = to
	}
	s.mu.Unlock()
	for p := from; p < to; p++ {
		out = append(out, memnode.MakeKey(first.Volume(), p))
	}
	return out
}
