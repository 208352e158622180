package pagestore

import (
	"cmp"
	"context"
	"fmt"
	"runtime"
	"sync"

	"github.com/pd3-go/pd3/memnode"
)

// Trimmer is implemented by Remotes that can drop pages: TRIM frees whole
// memory-node chunks. Remotes without it get zero pages written instead.
type Trimmer interface {
	// Trim discards n bytes at byte offset off of volume vol; they read as
	// zeroes afterwards.
	Trim(ctx context.Context, vol uint16, off, n uint64) error
}

// ReadRange reads len(p) bytes at byte offset off of volume vol. The
// missing pages of a multi-page range are loaded concurrently (up to
// maxParallelMisses at a time), so a 1 MiB read costs about one remote
// round trip, not 256 in a row.
func (s *Store) ReadRange(ctx context.Context, vol uint16, off uint64, p []byte) error {
	if first, last := off/PageSize, (off+uint64(len(p))-1)/PageSize; len(p) > 0 && last > first {
		if err := s.loadMissing(ctx, vol, off, uint64(len(p))); err != nil {
			return err
		}
	}
	return s.eachPage(vol, off, uint64(len(p)), func(k Key, po, n int, at uint64) error {
		dst := p[at : at+uint64(n)]
		if n == PageSize {
			return s.Get(ctx, k, dst)
		}
		tmp := s.pages.Get().(*[PageSize]byte)
		defer s.pages.Put(tmp)
		if err := s.Get(ctx, k, tmp[:]); err != nil {
			return err
		}
		copy(dst, tmp[po:po+n])
		return nil
	})
}

// maxParallelMisses bounds the concurrent loads of one ReadRange.
const maxParallelMisses = 64

// loadMissing brings the non-resident pages of a range into the cache
// concurrently. A page evicted again before the caller copies it is simply
// read once more; this only warms the cache.
func (s *Store) loadMissing(ctx context.Context, vol uint16, off, n uint64) error {
	var (
		wg    sync.WaitGroup
		sem   = make(chan struct{}, maxParallelMisses)
		errMu sync.Mutex
		first error
	)
	err := s.eachPage(vol, off, n, func(k Key, _, _ int, _ uint64) error {
		if s.Resident(k) {
			return nil
		}
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			tmp := s.pages.Get().(*[PageSize]byte)
			if err := s.Get(ctx, k, tmp[:]); err != nil {
				errMu.Lock()
				first = cmp.Or(first, err)
				errMu.Unlock()
			}
			s.pages.Put(tmp)
			<-sem
		}()
		return nil
	})
	wg.Wait()
	return cmp.Or(err, first)
}

// WriteRange writes p at byte offset off of volume vol. Whole pages are
// Put; partial pages are read, modified and written under the page's lock,
// so concurrent partial writes to one page never lose each other's bytes.
func (s *Store) WriteRange(ctx context.Context, vol uint16, off uint64, p []byte) error {
	return s.eachPage(vol, off, uint64(len(p)), func(k Key, po, n int, at uint64) error {
		src := p[at : at+uint64(n)]
		if n == PageSize {
			return s.Put(ctx, k, src)
		}
		return s.modify(ctx, k, true, func(page []byte) { copy(page[po:po+n], src) })
	})
}

// ZeroRange makes n bytes at off of volume vol read as zeroes. Whole pages
// are dropped from the cache without write-back and trimmed at the Remote
// (freeing memory-node chunks) unless keep is set, in which case zero pages
// are written; partial pages are zeroed in place.
func (s *Store) ZeroRange(ctx context.Context, vol uint16, off, n uint64, keep bool) error {
	tr, canTrim := s.remote.(Trimmer)
	var zero [PageSize]byte
	var runStart, runLen uint64 // a run of whole pages to trim remotely
	flushRun := func() error {
		if runLen == 0 {
			return nil
		}
		err := tr.Trim(ctx, vol, runStart, runLen)
		runLen = 0
		return err
	}
	err := s.eachPage(vol, off, n, func(k Key, po, m int, at uint64) error {
		if m < PageSize {
			return s.modify(ctx, k, true, func(page []byte) { clear(page[po : po+m]) })
		}
		if keep || !canTrim {
			return s.Put(ctx, k, zero[:])
		}
		s.discard(k)
		pageOff := k.Page() * PageSize
		if runLen > 0 && runStart+runLen != pageOff {
			if err := flushRun(); err != nil {
				return err
			}
		}
		if runLen == 0 {
			runStart = pageOff
		}
		runLen += PageSize
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
func (s *Store) eachPage(vol uint16, off, n uint64, fn func(k Key, po, n int, at uint64) error) error {
	s.vmu.RLock()
	v, ok := s.volumes[vol]
	s.vmu.RUnlock()
	if !ok {
		return fmt.Errorf("volume %d: %w", vol, ErrNoVolume)
	}
	if off > v.Size || n > v.Size-off {
		return fmt.Errorf("%d bytes at %d of %q (%d bytes): %w", n, off, v.Name, v.Size, ErrOutOfRange)
	}
	var at uint64
	for n > 0 {
		po := off % PageSize
		m := min(n, PageSize-po)
		if err := fn(memnode.MakeKey(vol, off/PageSize), int(po), int(m), at); err != nil {
			return err
		}
		off, n, at = off+m, n-m, at+m
	}
	return nil
}

// discard drops page k from the cache without writing it back. Its frame
// stays with the eviction policy, empty, and is reclaimed first-come.
func (s *Store) discard(k Key) {
	f, ok := s.lookup(k)
	if !ok {
		return
	}
	fr := &s.frames[f]
	fr.mu.Lock()
	defer fr.mu.Unlock()
	if fr.key != k || !fr.valid {
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
	fr.dirty.Store(false)
	fr.ver++
	s.discards.Add(1)
	if s.opt.OnEvict != nil {
		s.opt.OnEvict(k)
	}
}
