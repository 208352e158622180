package pagestore

import (
	"sync"
	"sync/atomic"

	"github.com/pd3-go/pd3/pageid"
)

// shadowChunk is the most one shadow read moves (a memory node's largest
// request).
const shadowChunk = 1 << 20

// shadow reads the pages of every read the Store served from the remote
// again, into scratch buffers it drops (Options.Shadow).
type shadow struct {
	bufs  sync.Pool // *[]byte of shadowChunk
	pages atomic.Uint64
}

// shadowRead starts reading the pages holding the n bytes at byte offset
// off of volume vol from the remote, in runs of at most shadowChunk, and
// returns at once; the bytes are dropped when they arrive. A remote that
// cannot read runs asynchronously is not shadowed.
func (s *Store) shadowRead(vol uint16, off uint64, n int) {
	pr, ok := s.remote.(AsyncPagesReader)
	if !ok || n <= 0 {
		return
	}
	first, end := off/pageid.Size, (off+uint64(n)+pageid.Size-1)/pageid.Size
	for p := first; p < end; {
		m := min(end-p, shadowChunk/pageid.Size)
		bp, _ := s.shadow.bufs.Get().(*[]byte)
		if bp == nil {
			b := make([]byte, shadowChunk)
			bp = &b
		}
		s.shadow.pages.Add(m)
		pr.ReadPagesAsync(pageid.MakeKey(vol, p), (*bp)[:m*pageid.Size], func(error) { s.shadow.bufs.Put(bp) })
		p += m
	}
}
