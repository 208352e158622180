package pagestore

import (
	"context"
	"math/bits"
	"sync"
	"sync/atomic"

	"github.com/pd3-go/pd3/pageid"
)

// Stream read-ahead (docs/decisions.md, 33): a predictor that expects a
// stream's next pages has them read from the remote into windows of the
// store's own, each one request straight into its buffer, and the stream
// read (ReadStream) that comes for them copies them out, as does a cache
// miss of a smaller read once the window is read (prefetched). The
// Loading Zone would take the same pages through a copy in, an index of
// its own and a copy out; a window costs the one copy out.
//
// A window is never stale: a write, a zeroing or a removal of any of its
// pages drops it (dropping also one still being read), and it is filled by
// the stream path itself, which takes cached pages (dirty ones too) from
// the cache.

const (
	// maxWindows bounds the windows of a store: up to 64 MiB of buffers.
	maxWindows = 64
	// MaxWindowPages bounds one window (1 MiB).
	MaxWindowPages = 256
	// windowClasses are the buffer sizes: 1, 2, 4 … MaxWindowPages pages.
	windowClasses = 9
)

type window struct {
	vol   uint16
	first uint64 // first page
	n     uint64 // pages
	buf   []byte
	done  chan struct{} // closed once buf is filled (err set)
	err   error
	stale atomic.Bool // written since the window's read began
	refs  atomic.Int32
	taken atomic.Uint64 // pages served
	class int
}

type readAhead struct {
	mu    sync.Mutex
	wins  []*window // oldest first
	live  atomic.Int32
	off   bool
	fill  sync.WaitGroup
	pools [windowClasses]sync.Pool // buffers of 1<<class pages

	placed, hits, dropped atomic.Uint64
}

func sizeClass(n uint64) int { return bits.Len64(n - 1) }

func (w *window) unref(ra *readAhead) {
	if w.refs.Add(-1) == 0 {
		ra.pools[w.class].Put(&w.buf)
	}
}

// ReadAhead starts reading n pages from first into a window for a stream
// read to come, unless a window already holds any of them; it reports
// whether it did. With every window taken the oldest is dropped. A run
// whose first and last pages are cached is left to the cache.
func (s *Store) ReadAhead(first pageid.Key, n int) bool {
	if n <= 0 {
		return false
	}
	vol, start, m := first.Volume(), first.Page(), uint64(min(n, MaxWindowPages))
	if s.held.Load() != nil || start+m > s.Pages(vol) {
		return false // suspended (never wait here), or past the end
	}
	if s.Resident(first) && s.Resident(pageid.MakeKey(vol, start+m-1)) {
		return false // cached: a stream read copies it from the cache
	}
	ra := &s.ra
	ra.mu.Lock()
	if ra.off {
		ra.mu.Unlock()
		return false
	}
	for _, w := range ra.wins {
		if w.vol == vol && w.first < start+m && start < w.first+w.n {
			ra.mu.Unlock()
			return false
		}
	}
	if len(ra.wins) == maxWindows {
		ra.removeLocked(0)
	}
	class := sizeClass(m)
	var buf []byte
	if p, ok := ra.pools[class].Get().(*[]byte); ok {
		buf = *p
	} else {
		buf = make([]byte, (1<<class)*pageid.Size)
	}
	w := &window{vol: vol, first: start, n: m, buf: buf[:m*pageid.Size], done: make(chan struct{}), class: class}
	w.refs.Store(2) // the table's and the filler's
	ra.wins = append(ra.wins, w)
	ra.live.Store(int32(len(ra.wins)))
	ra.fill.Add(1)
	ra.mu.Unlock()
	ra.placed.Add(m)
	go func() {
		defer ra.fill.Done()
		w.err = s.readStream(context.Background(), vol, start*pageid.Size, w.buf)
		close(w.done)
		w.unref(ra)
	}()
	return true
}

// removeLocked drops window i from the table, counting its pages never
// served; ra.mu is held.
func (ra *readAhead) removeLocked(i int) {
	w := ra.wins[i]
	if t := w.taken.Load(); t < w.n {
		ra.dropped.Add(w.n - t)
	}
	ra.wins = append(ra.wins[:i], ra.wins[i+1:]...)
	ra.live.Store(int32(len(ra.wins)))
	w.unref(ra)
}

// invalidate drops every window holding a page of [first, end) of vol:
// the caller changed them.
func (s *Store) invalidate(vol uint16, first, end uint64) {
	if s.ra.live.Load() == 0 {
		return
	}
	ra := &s.ra
	ra.mu.Lock()
	defer ra.mu.Unlock()
	for i := 0; i < len(ra.wins); {
		w := ra.wins[i]
		if w.vol == vol && w.first < end && first < w.first+w.n {
			w.stale.Store(true)
			ra.removeLocked(i)
			continue
		}
		i++
	}
}

// StopReadAhead drops every window, starts no more and waits for the
// reads filling them: before the Remote is closed.
func (s *Store) StopReadAhead() {
	ra := &s.ra
	ra.mu.Lock()
	ra.off = true
	for len(ra.wins) > 0 {
		ra.removeLocked(0)
	}
	ra.mu.Unlock()
	ra.fill.Wait()
}

// fromWindow copies into p what a window holds of the pages at page
// first of vol, from p's start on, and returns the pages copied (0: no
// window holds the first page, or it could not be read). It waits for a
// window still being read. next is the first page past first that a
// window holds (^0 if none), for the caller's read of what it lacks.
func (s *Store) fromWindow(ctx context.Context, vol uint16, first uint64, p []byte) (copied int, next uint64) {
	ra := &s.ra
	want := uint64(len(p) / pageid.Size)
	next = ^uint64(0)
	ra.mu.Lock()
	var w *window
	for _, x := range ra.wins {
		if x.holds(vol, first) {
			w = x
			break
		}
		if x.vol == vol && x.first > first && x.first < first+want {
			next = min(next, x.first)
		}
	}
	if w == nil {
		ra.mu.Unlock()
		return 0, next
	}
	w.refs.Add(1)
	ra.mu.Unlock()
	defer w.unref(ra)
	select {
	case <-w.done:
	case <-ctx.Done():
		return 0, ^uint64(0)
	}
	if !w.good() {
		return 0, ^uint64(0)
	}
	n := min(want, w.first+w.n-first)
	copy(p[:n*pageid.Size], w.buf[(first-w.first)*pageid.Size:])
	if ra.took(w, n) {
		ra.mu.Lock()
		for i, x := range ra.wins {
			if x == w {
				ra.removeLocked(i)
				break
			}
		}
		ra.mu.Unlock()
	}
	return int(n), next
}

// holds reports whether w is for page page of volume vol.
func (w *window) holds(vol uint16, page uint64) bool {
	return w.vol == vol && w.first <= page && page < w.first+w.n
}

// good reports whether w, read (done closed), may be served: its read
// succeeded and no write dropped it since.
func (w *window) good() bool { return w.err == nil && !w.stale.Load() }

// took counts n pages of w served (the cache's misses counted them as the
// window was read) and reports whether every page of w now is: the
// caller frees it.
func (ra *readAhead) took(w *window, n uint64) bool {
	ra.hits.Add(n)
	return w.taken.Add(n) >= w.n
}

// mayBePrefetched reports whether a miss may find its page prefetched:
// in the Loading Zone or in a read-ahead window.
func (s *Store) mayBePrefetched() bool { return s.opt.Prefetched != nil || s.ra.live.Load() > 0 }

// prefetched copies page k into dst if it was fetched ahead of need (the
// Loading Zone, or a read-ahead window already read) and reports whether
// it was: a miss of the cache that needs no round trip. A window's pages
// are taken by small reads too (docs/decisions.md, 41): a scan through a
// file of which the client caches some pages reads the rest in pieces,
// some too small for a stream read, and those would otherwise fetch pages
// again that a window holds.
func (s *Store) prefetched(k pageid.Key, dst []byte) bool {
	if lz := s.opt.Prefetched; lz != nil && lz.CheckAndReturn(k, dst) == pageid.Size {
		s.lzHits.Add(1)
		return true
	}
	ra := &s.ra
	if ra.live.Load() == 0 {
		return false
	}
	vol, page := k.Volume(), k.Page()
	ra.mu.Lock()
	defer ra.mu.Unlock()
	for i, w := range ra.wins {
		if !w.holds(vol, page) {
			continue
		}
		select {
		case <-w.done:
		default:
			return false // on its way: never wait on a miss's path
		}
		if !w.good() {
			return false
		}
		copy(dst[:pageid.Size], w.buf[(page-w.first)*pageid.Size:])
		if ra.took(w, 1) {
			ra.removeLocked(i)
		}
		return true
	}
	return false
}

// readWindowed is ReadStream with windows: the pages windows hold are
// copied from them, the rest read as a stream.
func (s *Store) readWindowed(ctx context.Context, vol uint16, off uint64, p []byte) error {
	page := off / pageid.Size
	for len(p) > 0 {
		n, next := s.fromWindow(ctx, vol, page, p)
		if n == 0 {
			// Up to the next window (or the end), read as a stream.
			m := uint64(len(p) / pageid.Size)
			if next != ^uint64(0) && next > page {
				m = min(m, next-page)
			}
			if err := s.readStream(ctx, vol, page*pageid.Size, p[:m*pageid.Size]); err != nil {
				return err
			}
			n = int(m)
		}
		p, page = p[n*pageid.Size:], page+uint64(n)
	}
	return nil
}
