package fs

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/pd3-go/pd3/pageid"
	"github.com/pd3-go/pd3/pagestore"
)

// Read-ahead of a file read as a stream (FUSE reads of streamRead or
// more, one after the other): while the kernel takes one reply, the
// memory node is already sending the next ones into buffers of the
// host's own, and a read that finds its window there answers with that
// buffer (no copy of ours: go-fuse writes it to the kernel and then gives
// it back). Without it a sequential reader's READs wait in turn for the
// node, the network and the FUSE reply, each alone (docs/decisions.md,
// 14).
//
// A window is never stale: it is taken only if no write, truncation or
// fallocate of its file returned since the window's read began
// (inode.gen), and that read goes through the page store like any other
// (ReadStream: pages the host holds, dirty ones too, come from its
// cache).

// A stream is read ahead by at least raDepth windows and at least
// raBytes: the kernel's 128 KiB read-ahead READs of a reader under memory
// pressure need four windows in flight to cover the node's round trip
// where two 1 MiB windows do. raMaxWindows bounds the windows of all
// streams of a mount (buffers of up to maxIO each: 32 MiB).
const (
	raDepth      = 2
	raBytes      = 512 << 10
	raMaxWindows = 32
)

// depth is how many windows of n bytes a stream reads ahead.
func depth(n int) uint64 { return uint64(max(raDepth, raBytes/max(n, 1))) }

// stream is a file's read-ahead state, guarded by mu.
type stream struct {
	mu   sync.Mutex
	next uint64    // where the last read ended
	wins []*window // read or being read ahead, in offset order
	// scan counts the READs of less than streamRead in a row that began
	// at most scanGap past the end of the one before, scanBytes their
	// bytes (see scanning).
	scan      int
	scanBytes int
}

// active reports whether s has windows read or being read, or is a scan
// of small READs (read ahead by the page store).
func (s *stream) active() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.wins) > 0 || s.scanned()
}

// scanned reports whether s's last READs were a scan (s.mu held).
func (s *stream) scanned() bool { return s.scan >= scanRun && s.scanBytes >= streamRead }

// A sequential reader of a file part of whose pages the kernel still
// caches (a scan after random reads under a memory budget) sends READs
// of what lies between those pages: smaller than streamRead, each
// beginning a few pages past where the last one ended. Such a scan is
// read ahead too, into the page store's windows (pagestore.ReadAhead,
// which serve any part of themselves to ReadStream) scanDepth blocks of
// scanBlock pages ahead, once scanRun READs in a row continued it with
// streamRead bytes in all (a database's lookups read a few pages near
// each other, a page or two at a time; docs/decisions.md, 38).
const (
	scanRun   = 3
	scanGap   = 256 << 10
	scanBlock = pagestore.MaxWindowPages
	scanDepth = 2
)

// scanning records a READ of n bytes at off (less than streamRead) in s
// and reports whether it continues a scan.
func (s *stream) scanning(off uint64, n int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if off >= s.next && off-s.next <= scanGap {
		s.scan++
		s.scanBytes += n
	} else {
		s.scan, s.scanBytes = 1, n
	}
	s.next = off + uint64(n)
	return s.scanned()
}

// scanAhead has store read the scanDepth blocks of scanBlock pages that
// follow the one holding page end of volume vol (pages in all) ahead;
// blocks already read ahead are left alone.
func scanAhead(store *pagestore.Store, vol uint16, end, pages uint64) {
	for b := end/scanBlock + 1; b <= end/scanBlock+scanDepth; b++ {
		first := b * scanBlock
		if first >= pages {
			return
		}
		store.ReadAhead(pageid.MakeKey(vol, first), int(min(scanBlock, pages-first)))
	}
}

// streamSet is a file's streams: one per open handle, so that a change
// of the file reaches the windows of each.
type streamSet struct {
	mu sync.Mutex
	m  map[*stream]struct{}
}

func (ss *streamSet) add(s *stream) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if ss.m == nil {
		ss.m = make(map[*stream]struct{})
	}
	ss.m[s] = struct{}{}
}

func (ss *streamSet) remove(s *stream) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	delete(ss.m, s)
}

// each calls fn for every stream, with ss locked.
func (ss *streamSet) each(fn func(*stream)) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	for s := range ss.m {
		fn(s)
	}
}

// active reports whether any of the streams has windows.
func (ss *streamSet) active() bool {
	found := false
	ss.each(func(s *stream) { found = found || s.active() })
	return found
}

// window is one read-ahead: n bytes at off of volume vol, read into buf
// by a goroutine that closes done. gen is the file's generation when the
// read began.
type window struct {
	ra   *readAhead
	vol  uint16
	off  uint64
	n    int
	gen  uint64
	bp   *[]byte // the pooled buffer; buf is its first n bytes
	buf  []byte
	err  error
	done chan struct{}
	// state is windowReading until the read ends (windowRead), or
	// windowDropped if it was dropped while reading: the reader then
	// gives the buffer back itself.
	state atomic.Int32
}

const (
	windowReading = iota
	windowRead
	windowDropped
)

// readAhead is a mount's read-ahead: its buffer budget, and the
// goroutines reading ahead (Close waits for them).
type readAhead struct {
	read func(ctx context.Context, vol uint16, off uint64, p []byte) error
	ctx  context.Context
	wg   sync.WaitGroup
	bufs sync.Pool // *[]byte of maxIO bytes
	used atomic.Int32
	// Hits counts reads answered from a window; Discards, windows
	// dropped unread (a write, a seek, the stream's end).
	Hits, Discards atomic.Uint64
}

func newReadAhead(ctx context.Context, read func(ctx context.Context, vol uint16, off uint64, p []byte) error) *readAhead {
	return &readAhead{read: read, ctx: ctx}
}

// take answers a stream read of n bytes at off of file c (volume vol,
// size bytes long) through a handle's stream s: from a window if one
// holds it, and in any case it starts the windows that follow. ok false:
// no window held it; read it yourself. c.io must be read-locked.
func (ra *readAhead) take(ctx context.Context, c *inode, s *stream, vol uint16, off uint64, n int, size uint64) (res fuse.ReadResult, ok bool) {
	s.mu.Lock()
	s.scan, s.scanBytes = 0, 0
	var w *window
	seq := off == s.next
	for i, x := range s.wins {
		if x.off == off && x.vol == vol && x.n >= n {
			w = x
			s.wins = append(s.wins[:i], s.wins[i+1:]...)
			break
		}
	}
	if w == nil && !seq {
		// A seek: what was read ahead is not what this reader wants.
		ra.dropLocked(s)
	}
	s.next = off + uint64(n)
	if w != nil || seq {
		ra.aheadLocked(s, c, vol, off+uint64(n), n, size)
	}
	s.mu.Unlock()
	if w == nil {
		return nil, false
	}
	select {
	case <-w.done:
	case <-ctx.Done(): // interrupted: the caller's own read fails with ctx
		ra.drop(w)
		return nil, false
	}
	if w.err != nil || w.gen != c.gen.Load() {
		ra.Discards.Add(1)
		ra.free(w)
		return nil, false
	}
	ra.Hits.Add(1)
	return &windowResult{w: w, data: w.buf[:n]}, true
}

// aheadLocked makes s's windows those of n bytes at off, off+n, ... up to
// depth(n) of them, short of the file's end and as far as the budget lets
// it: windows elsewhere (the reader skipped them, or reads another size
// now) are dropped.
func (ra *readAhead) aheadLocked(s *stream, c *inode, vol uint16, off uint64, n int, size uint64) {
	keep := s.wins[:0]
	for _, w := range s.wins {
		d := w.off - off
		if w.vol != vol || w.off < off || d%uint64(n) != 0 || d/uint64(n) >= depth(n) || w.n != int(min(uint64(n), size-w.off)) {
			ra.drop(w)
			continue
		}
		keep = append(keep, w)
	}
	s.wins = keep
	for i := 0; i < int(depth(n)); i++ {
		at := off + uint64(i*n)
		if at >= size {
			break
		}
		if i < len(s.wins) && s.wins[i].off == at {
			continue
		}
		w := ra.start(c, vol, at, int(min(uint64(n), size-at)))
		if w == nil {
			break
		}
		s.wins = append(s.wins, nil)
		copy(s.wins[i+1:], s.wins[i:])
		s.wins[i] = w
	}
}

// start reads a window of n bytes at off, or returns nil when the budget
// is spent.
func (ra *readAhead) start(c *inode, vol uint16, off uint64, n int) *window {
	if n <= 0 || n > maxIO {
		return nil
	}
	if ra.used.Add(1) > raMaxWindows {
		ra.used.Add(-1)
		return nil
	}
	bp, _ := ra.bufs.Get().(*[]byte)
	if bp == nil {
		b := make([]byte, maxIO)
		bp = &b
	}
	w := &window{ra: ra, vol: vol, off: off, n: n, gen: c.gen.Load(), bp: bp, buf: (*bp)[:n], done: make(chan struct{})}
	ra.wg.Add(1)
	go func() {
		defer ra.wg.Done()
		w.err = ra.read(ra.ctx, vol, off, w.buf)
		if !w.state.CompareAndSwap(windowReading, windowRead) {
			ra.free(w) // dropped: nobody waits for it
			return
		}
		close(w.done)
	}()
	return w
}

// dropLocked discards every window of s.
func (ra *readAhead) dropLocked(s *stream) {
	for _, w := range s.wins {
		ra.drop(w)
	}
	s.wins = s.wins[:0]
}

// drop discards w, now or (if it is still being read) when its read
// ends. Only a window no reader took may be dropped.
func (ra *readAhead) drop(w *window) {
	ra.Discards.Add(1)
	if !w.state.CompareAndSwap(windowReading, windowDropped) {
		ra.free(w)
	}
}

func (ra *readAhead) free(w *window) {
	ra.bufs.Put(w.bp)
	w.bp, w.buf = nil, nil
	ra.used.Add(-1)
}

// ReadAheadStats is what the stream read-ahead did: READs answered from a
// window, windows dropped unread (a change, a seek, a close), and windows
// held now.
func (f *FS) ReadAheadStats() (hits, discards uint64, windows int) {
	return f.ra.Hits.Load(), f.ra.Discards.Load(), int(f.ra.used.Load())
}

// changed makes c's windows stale and drops them: its bytes changed.
// Call it before the change returns.
func (ra *readAhead) changed(c *inode) {
	c.gen.Add(1)
	c.streams.each(ra.stop)
}

// close drops the windows of a handle's stream s on c (its reader is
// gone: they would hold the budget for nobody) and forgets it.
func (ra *readAhead) close(c *inode, s *stream) {
	c.streams.remove(s)
	ra.stop(s)
}

// stop drops s's windows.
func (ra *readAhead) stop(s *stream) {
	s.mu.Lock()
	if len(s.wins) > 0 {
		ra.dropLocked(s)
	}
	s.mu.Unlock()
}

// wait waits for every read ahead to end (the mount is closing; its
// context is cancelled).
func (ra *readAhead) wait() { ra.wg.Wait() }

// windowResult answers a FUSE READ with a window's buffer. go-fuse writes
// a result that has Slices with writev and calls Done only after that
// (one with Bytes alone is released before its bytes are written), so the
// buffer goes back to the pool when the kernel has its copy.
type windowResult struct {
	w    *window
	data []byte
}

func (r *windowResult) Slices() ([][]byte, fuse.Status)    { return [][]byte{r.data}, fuse.OK }
func (r *windowResult) Bytes([]byte) ([]byte, fuse.Status) { return r.data, fuse.OK }
func (r *windowResult) Size() int                          { return len(r.data) }
func (r *windowResult) Done() {
	if r.w != nil {
		r.w.ra.free(r.w)
		r.w = nil
	}
}
