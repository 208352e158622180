package pagestore

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"sync"

	"github.com/pd3-go/pd3/pageid"
)

// ReadRange reads len(p) bytes at byte offset off of volume vol. The
// missing pages of a multi-page range are loaded concurrently (up to
// maxParallelMisses at a time), so a 1 MiB read costs about one remote
// round trip, not 256 in a row; they are copied out as they arrive, the
// cached ones afterwards.
func (s *Store) ReadRange(ctx context.Context, vol uint16, off uint64, p []byte) error {
	err := s.readRange(ctx, vol, off, p)
	if s.opt.Shadow && err == nil {
		s.shadowRead(vol, off, len(p))
	}
	return err
}

func (s *Store) readRange(ctx context.Context, vol uint16, off uint64, p []byte) error {
	var done []bool // pages already copied, by index from off's page
	if first, last := off/pageid.Size, (off+uint64(len(p))-1)/pageid.Size; len(p) > 0 && last > first {
		done = make([]bool, last-first+1)
		end := off + uint64(len(p))
		// Each page is filled by one goroutine of loadMissing, and read
		// here only after it returns.
		fill := func(k pageid.Key, page []byte) {
			ps := k.Page() * pageid.Size
			from, to := max(ps, off), min(ps+pageid.Size, end)
			copy(p[from-off:to-off], page[from-ps:to-ps])
			done[k.Page()-first] = true
		}
		if err := s.loadMissing(ctx, vol, off, uint64(len(p)), fill); err != nil {
			return err
		}
	}
	return s.eachPage(vol, off, uint64(len(p)), func(k pageid.Key, po, n int, at uint64) error {
		if done != nil && done[k.Page()-off/pageid.Size] {
			return nil
		}
		dst := p[at : at+uint64(n)]
		if n == pageid.Size {
			return s.Get(ctx, k, dst)
		}
		tmp := s.pages.Get().(*[pageid.Size]byte)
		defer s.pages.Put(tmp)
		if err := s.Get(ctx, k, tmp[:]); err != nil {
			return err
		}
		copy(dst, tmp[po:po+n])
		return nil
	})
}

// ReadStream is ReadRange for a large read that is not worth caching
// (a FUSE read of a stream: the kernel keeps its own copy, and a scan
// through the cache would evict what is worth keeping). Pages the cache
// holds are copied from it, pages the Loading Zone holds are taken from
// it, and the rest are read from the remote straight into p, runs of
// consecutive pages in one request each, concurrently, without claiming
// frames. A page that is not resident is at the remote (an eviction
// unindexes a page only once its write-back is acknowledged), so nothing
// newer than what a concurrent reader may see is missed. Unaligned reads,
// and remotes that cannot read runs, take ReadRange.
//
// Pages a read-ahead window holds (ReadAhead) are copied from it.
func (s *Store) ReadStream(ctx context.Context, vol uint16, off uint64, p []byte) error {
	var err error
	if s.ra.live.Load() > 0 && off%pageid.Size == 0 && len(p)%pageid.Size == 0 {
		if err = s.checkRange(vol, off, uint64(len(p))); err == nil {
			err = s.readWindowed(ctx, vol, off, p)
		}
	} else {
		err = s.readStream(ctx, vol, off, p)
	}
	if s.opt.Shadow && err == nil {
		s.shadowRead(vol, off, len(p))
	}
	return err
}

// readStream is ReadStream without the read-ahead windows.
func (s *Store) readStream(ctx context.Context, vol uint16, off uint64, p []byte) error {
	pr, ok := s.remote.(PagesReader)
	if !ok || off%pageid.Size != 0 || len(p)%pageid.Size != 0 || len(p) < 2*pageid.Size {
		return s.readRange(ctx, vol, off, p)
	}
	read, took := pr.ReadPages, func(pageid.Key) {}
	if sr, ok := s.remote.(StreamReader); ok {
		read, took = sr.ReadStreamPages, sr.StreamTook
	}
	if err := s.checkRange(vol, off, uint64(len(p))); err != nil {
		return err
	}
	first, pages := off/pageid.Size, len(p)/pageid.Size
	var (
		wg    sync.WaitGroup
		sem   = make(chan struct{}, maxParallelMisses)
		errMu sync.Mutex
		ferr  error
	)
	runStart := -1
	flush := func(end int) {
		if runStart < 0 {
			return
		}
		a := runStart
		runStart = -1
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			s.remoteReads.Add(uint64(end - a))
			s.misses.Add(uint64(end - a))
			if err := read(ctx, pageid.MakeKey(vol, first+uint64(a)), p[a*pageid.Size:end*pageid.Size]); err != nil {
				errMu.Lock()
				ferr = cmp.Or(ferr, fmt.Errorf("reading pages from %v: %w", pageid.MakeKey(vol, first+uint64(a)), err))
				errMu.Unlock()
			}
		}()
	}
	lz := s.opt.Prefetched
	var err error
	prev := int32(-1) // the frame of the last page, if cached
	for i := 0; i < pages && err == nil; i++ {
		k := pageid.MakeKey(vol, first+uint64(i))
		dst := p[i*pageid.Size : (i+1)*pageid.Size]
		if prev >= 0 && s.nextFrame(k, prev, dst) {
			// The frame after the last page's holds this one.
			flush(i)
			prev++
			continue
		}
		f, cached := s.lookup(k)
		prev = -1
		switch {
		case cached:
			flush(i)
			err = s.getFound(ctx, k, f, dst)
			prev = f
		case lz != nil && lz.CheckAndReturn(k, dst) == pageid.Size:
			flush(i)
			s.misses.Add(1) // a miss of the cache, as in Get
			s.lzHits.Add(1)
			took(k)
		default:
			if runStart < 0 {
				runStart = i
			} else if i-runStart == maxRun {
				flush(i)
				runStart = i
			}
		}
	}
	if err == nil {
		flush(pages)
	}
	wg.Wait()
	return cmp.Or(err, ferr)
}

// maxParallelMisses bounds the concurrent loads of one ReadRange.
const maxParallelMisses = 64

// maxRun bounds the pages one batched load claims: 256 KiB per request,
// and never more than a sixteenth of the cache (frames stay locked until
// the request returns).
const maxRun = 64

// runPages is the longest run a cache of frames pages loads at once.
func runPages(frames int) int { return min(maxRun, frames/16) }

// loadMissing brings the non-resident pages of a range into the cache
// concurrently — runs of consecutive missing pages in one request each
// when the Remote can (PagesReader), else page by page — and hands each
// page it loads to fill.
func (s *Store) loadMissing(ctx context.Context, vol uint16, off, n uint64, fill func(pageid.Key, []byte)) error {
	pr, batched := s.remote.(PagesReader)
	run := runPages(len(s.frames))
	if run < 2 {
		batched = false
	}
	var (
		wg    sync.WaitGroup
		sem   = make(chan struct{}, maxParallelMisses)
		errMu sync.Mutex
		first error
	)
	fail := func(err error) {
		errMu.Lock()
		first = cmp.Or(first, err)
		errMu.Unlock()
	}
	var runStart pageid.Key
	runLen := 0
	startRun := func() {
		if runLen == 0 {
			return
		}
		k, m := runStart, runLen
		runLen = 0
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if batched && m > 1 {
				if err := s.loadRun(ctx, pr, k, m, fill); err != nil {
					fail(err)
				}
				return
			}
			tmp := s.pages.Get().(*[pageid.Size]byte)
			defer s.pages.Put(tmp)
			if err := s.Get(ctx, k, tmp[:]); err != nil {
				fail(err)
				return
			}
			fill(k, tmp[:])
		}()
	}
	err := s.eachPage(vol, off, n, func(k pageid.Key, _, _ int, _ uint64) error {
		if s.Resident(k) {
			startRun()
			return nil
		}
		if runLen > 0 && (!batched || runLen == run) {
			startRun()
		}
		if runLen == 0 {
			runStart = k
		}
		runLen++
		return nil
	})
	startRun()
	wg.Wait()
	return cmp.Or(err, first)
}

// loadRun loads up to m consecutive pages from first and hands each to
// fill. Pages that turn out to be cached or being loaded by someone else
// end the run early (the caller reads them from the cache); pages the
// Loading Zone holds are taken from it, and the rest are read with one
// remote request per consecutive stretch.
func (s *Store) loadRun(ctx context.Context, pr PagesReader, first pageid.Key, m int, fill func(pageid.Key, []byte)) error {
	select {
	case s.runSlots <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-s.runSlots }()
	var frames [maxRun]int32
	got := 0
	for got < m {
		k := pageid.MakeKey(first.Volume(), first.Page()+uint64(got))
		if s.Resident(k) {
			break
		}
		f, err := s.claimFrame(ctx)
		if errors.Is(err, ErrCacheFull) {
			break // the rest are read one by one (ReadRange), past the cache if need be
		}
		if err != nil {
			s.abandonRun(first, frames[:got])
			return fmt.Errorf("reading pages from %v: %w", first, err)
		}
		if !s.publish(k, f) {
			break
		}
		frames[got] = f
		got++
	}
	if got == 0 {
		return nil
	}
	var fromLZ [maxRun]bool
	if s.mayBePrefetched() {
		for i, f := range frames[:got] {
			fromLZ[i] = s.prefetched(pageid.MakeKey(first.Volume(), first.Page()+uint64(i)), s.page(f))
		}
	}
	buf := s.runBufs.Get().(*[maxRun * pageid.Size]byte)
	defer s.runBufs.Put(buf)
	s.misses.Add(uint64(got))
	for i := 0; i < got; {
		if fromLZ[i] {
			i++
			continue
		}
		j := i
		for j < got && !fromLZ[j] {
			j++
		}
		s.remoteReads.Add(uint64(j - i))
		k := pageid.MakeKey(first.Volume(), first.Page()+uint64(i))
		if err := pr.ReadPages(ctx, k, buf[i*pageid.Size:j*pageid.Size]); err != nil {
			s.abandonRun(first, frames[:got])
			return fmt.Errorf("reading pages from %v: %w", k, err)
		}
		for x := i; x < j; x++ {
			copy(s.page(frames[x]), buf[x*pageid.Size:])
		}
		i = j
	}
	for i, f := range frames[:got] {
		k := pageid.MakeKey(first.Volume(), first.Page()+uint64(i))
		fill(k, s.page(f)) // still ours: write-locked until valid
		fr := &s.frames[f]
		fr.valid = true
		fr.mu.Unlock()
		s.track(f, k)
	}
	return nil
}

// abandonRun unpublishes the frames a failed run claimed.
func (s *Store) abandonRun(first pageid.Key, frames []int32) {
	for i, f := range frames {
		s.unpublish(pageid.MakeKey(first.Volume(), first.Page()+uint64(i)), f)
	}
}

// WriteRange writes p at byte offset off of volume vol. Whole pages are
// Put; partial pages are read, modified and written under the page's lock,
// so concurrent partial writes to one page never lose each other's bytes.
func (s *Store) WriteRange(ctx context.Context, vol uint16, off uint64, p []byte) error {
	return s.WriteFresh(ctx, vol, off, p, math.MaxUint64)
}

// WriteFresh is WriteRange for a writer that knows that nothing was ever
// written at or past byte zeroFrom of the volume (a file's bytes past its
// size and the furthest any write reached: they read as zeroes). A page
// that the write covers in part, that is not cached, and whose bytes the
// write leaves are all zeroes by that — the page starts at or past
// zeroFrom, or the write starts at the page's start and ends at or past
// zeroFrom (the kernel writing back a file's last page) — starts from
// zeroes instead of a read of the remote, a round trip on the writer's
// path. A cached page is changed in place, as by WriteRange.
func (s *Store) WriteFresh(ctx context.Context, vol uint16, off uint64, p []byte, zeroFrom uint64) error {
	return s.eachPage(vol, off, uint64(len(p)), func(k pageid.Key, po, n int, at uint64) error {
		src := p[at : at+uint64(n)]
		if n == pageid.Size {
			return s.Put(ctx, k, src)
		}
		how := fillLoad
		if start := k.Page() * pageid.Size; start >= zeroFrom || po == 0 && start+uint64(n) >= zeroFrom {
			how = fillZero
		}
		return s.modify(ctx, k, how, func(page []byte) { copy(page[po:po+n], src) })
	})
}

// ZeroRange makes n bytes at off of volume vol read as zeroes. Whole pages
// are dropped from the cache without write-back and trimmed at the Remote
// (freeing memory-node chunks) unless keep is set, in which case zero pages
// are written; partial pages are zeroed in place.
func (s *Store) ZeroRange(ctx context.Context, vol uint16, off, n uint64, keep bool) error {
	defer s.invalidate(vol, off/pageid.Size, (off+n+pageid.Size-1)/pageid.Size)
	tr, canTrim := s.remote.(Trimmer)
	if first, end := (off+pageid.Size-1)/pageid.Size*pageid.Size, (off+n)/pageid.Size*pageid.Size; canTrim && !keep && end > first &&
		(end-first)/pageid.Size >= uint64(len(s.frames)) {
		// More whole pages than the cache has frames (a file's volume
		// zeroed past its size): the partial pages at either end, then
		// the cached pages among the rest in one pass, and one Trim.
		if err := s.checkRange(vol, off, n); err != nil {
			return err
		}
		if err := s.ZeroRange(ctx, vol, off, first-off, false); err != nil {
			return err
		}
		if err := s.ZeroRange(ctx, vol, end, off+n-end, false); err != nil {
			return err
		}
		s.discardPages(vol, first/pageid.Size, end/pageid.Size, false)
		if err := tr.Trim(ctx, vol, first, end-first); err != nil {
			return err
		}
		s.discardPages(vol, first/pageid.Size, end/pageid.Size, true)
		return nil
	}
	var zero [pageid.Size]byte
	var runStart, runLen uint64 // a run of whole pages to trim remotely
	flushRun := func() error {
		if runLen == 0 {
			return nil
		}
		err := tr.Trim(ctx, vol, runStart, runLen)
		if err == nil {
			// A read between the discard and the trim loaded the old
			// bytes from the remote: drop them, or they outlive the
			// zeroing (a write since then is dirty, and newer: kept).
			s.discardPages(vol, runStart/pageid.Size, (runStart+runLen)/pageid.Size, true)
		}
		runLen = 0
		return err
	}
	err := s.eachPage(vol, off, n, func(k pageid.Key, po, m int, at uint64) error {
		if m < pageid.Size {
			return s.modify(ctx, k, fillLoad, func(page []byte) { clear(page[po : po+m]) })
		}
		if keep || !canTrim {
			return s.Put(ctx, k, zero[:])
		}
		s.discard(k)
		pageOff := k.Page() * pageid.Size
		if runLen > 0 && runStart+runLen != pageOff {
			if err := flushRun(); err != nil {
				return err
			}
		}
		if runLen == 0 {
			runStart = pageOff
		}
		runLen += pageid.Size
		return nil
	})
	if err != nil {
		return err
	}
	return flushRun()
}

// eachPage validates the range and calls fn for every page it touches with
// the page's key, the offset and length within the page, and the offset
// within the caller's buffer.
func (s *Store) eachPage(vol uint16, off, n uint64, fn func(k pageid.Key, po, n int, at uint64) error) error {
	if err := s.checkRange(vol, off, n); err != nil {
		return err
	}
	var at uint64
	for n > 0 {
		po := off % pageid.Size
		m := min(n, pageid.Size-po)
		if err := fn(pageid.MakeKey(vol, off/pageid.Size), int(po), int(m), at); err != nil {
			return err
		}
		off, n, at = off+m, n-m, at+m
	}
	return nil
}

// Map calls fn for consecutive runs covering the n bytes at off of volume
// vol, saying which hold no memory at the remote (holes read as zeroes),
// after writing back the volume's dirty pages: a page written before the
// call is at the remote and its run is data. Without a Mapper remote,
// one run of data.
func (s *Store) Map(ctx context.Context, vol uint16, off, n uint64, fn func(off, n uint64, hole bool)) error {
	if err := s.checkRange(vol, off, n); err != nil {
		return err
	}
	m, ok := s.remote.(Mapper)
	if !ok || n == 0 {
		if n > 0 {
			fn(off, n, false)
		}
		return nil
	}
	if err := s.FlushVolume(ctx, vol); err != nil {
		return err
	}
	return m.Map(ctx, vol, off, n, fn)
}

// checkRange validates n bytes at off of volume vol against the served
// volumes (after a Suspend has let requests go).
func (s *Store) checkRange(vol uint16, off, n uint64) error {
	s.waitServing()
	s.vmu.RLock()
	v, ok := s.volumes[vol]
	s.vmu.RUnlock()
	if !ok {
		return fmt.Errorf("volume %d: %w", vol, s.missing(vol))
	}
	if off > v.Size || n > v.Size-off {
		return fmt.Errorf("%d bytes at %d of %q (%d bytes): %w", n, off, v.Name, v.Size, pageid.ErrOutOfRange)
	}
	return nil
}

// discard drops page k from the cache without writing it back. Its frame
// stays with the eviction policy, empty, and is reclaimed first-come.
func (s *Store) discard(k pageid.Key) { s.drop(k, false) }

// drop is discard; with cleanOnly, a dirty page (a write newer than what
// the caller dropped) stays.
func (s *Store) drop(k pageid.Key, cleanOnly bool) {
	f, ok := s.lookup(k)
	if !ok {
		return
	}
	fr := &s.frames[f]
	fr.mu.Lock()
	defer fr.mu.Unlock()
	if fr.key != k || !fr.valid || (cleanOnly && s.dirty(f)) {
		return
	}
	for fr.wb.Load() {
		// A Flush is writing this page back; let it finish so its older
		// copy cannot land after the trim.
		fr.mu.Unlock()
		runtime.Gosched()
		fr.mu.Lock()
		if fr.key != k || !fr.valid {
			return
		}
	}
	s.unindex(k, f)
	fr.valid = false
	fr.key = 0
	s.markClean(f)
	fr.ver++
	s.discards.Add(1)
	if s.opt.OnEvict != nil {
		s.opt.OnEvict(k)
	}
}
