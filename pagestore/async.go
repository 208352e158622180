package pagestore

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/pd3-go/pd3/pageid"
)

// ErrWouldBlock is GetAsync's answer when it cannot go on without waiting
// (the page is being loaded or evicted, only dirty frames are left to
// evict, too many loads are in flight, or the remote cannot read
// asynchronously). Nothing was done; use Get from a goroutine that may
// block.
var ErrWouldBlock = errors.New("pagestore: would block")

// asyncLoads bounds the loads GetAsync keeps in flight: each holds a
// locked frame, and loads holding every frame would leave none for
// anyone else. Like the batched runs, a quarter of the cache at most.
func (s *Store) maxAsync() int64 { return int64(max(1, len(s.frames)/4)) }

// GetAsync reads the pages from k on into dst (1 to MaxAsyncPages whole
// pages) without blocking. If every page is cached or in the Loading Zone
// they are copied at once and GetAsync reports finished (done is not
// called). Misses start remote reads into free or clean frames — one per
// run of consecutive missing pages, straight into dst — and GetAsync
// returns (false, nil); done(err) follows once, on another goroutine,
// with dst filled. Errors other than ErrWouldBlock (a bad key, a fenced
// volume) are final. ErrWouldBlock leaves nothing started (dst may hold
// some of the pages).
//
// It is the read path of a connection reader that runs requests to
// completion without a worker: hits cost no hand-off at all, misses one
// callback from the remote's reader instead of two goroutine wake-ups.
func (s *Store) GetAsync(k pageid.Key, dst []byte, done func(error)) (finished bool, err error) {
	finished, err = s.getAsync(k, dst, done)
	if s.opt.Shadow && finished && err == nil {
		s.shadowRead(k.Volume(), k.Page()*pageid.Size, len(dst))
	}
	return finished, err
}

func (s *Store) getAsync(k pageid.Key, dst []byte, done func(error)) (finished bool, err error) {
	if len(dst) != pageid.Size {
		return s.getPagesAsync(k, dst, done)
	}
	if err := s.CheckKey(k); err != nil {
		return true, err
	}
	if f, ok := s.lookup(k); ok {
		if !s.copyHit(k, f, dst) {
			return false, ErrWouldBlock
		}
		s.pol.hit(f)
		s.hits.Add(1)
		return true, nil
	}
	ar, ok := s.remote.(AsyncReader)
	if !ok {
		return false, ErrWouldBlock
	}
	if s.async.Add(1) > s.maxAsync() {
		s.async.Add(-1)
		return false, ErrWouldBlock
	}
	f, ok := s.tryClaimClean()
	if !ok {
		s.async.Add(-1)
		return false, ErrWouldBlock
	}
	if !s.publish(k, f) {
		s.async.Add(-1)
		return false, ErrWouldBlock // someone else is loading k
	}
	s.misses.Add(1)
	page := s.page(f)
	if s.prefetched(k, page) {
		s.async.Add(-1)
		s.loaded(k, f, dst)
		return true, nil
	}
	s.remoteReads.Add(1)
	s.asyncLoads.Add(1)
	l := s.loads.Get().(*asyncLoad)
	l.k, l.f, l.dst, l.done = k, f, dst, done
	ar.ReadPageAsync(k, page, l.fn)
	return false, nil
}

// copyHit copies page k from frame f into dst unless that would wait: the
// frame is being loaded or evicted, or no longer holds k.
func (s *Store) copyHit(k pageid.Key, f int32, dst []byte) bool {
	fr := &s.frames[f]
	if !fr.mu.TryRLock() {
		return false
	}
	if fr.key != k || !fr.valid {
		fr.mu.RUnlock()
		return false
	}
	copy(dst, s.page(f))
	fr.mu.RUnlock()
	return true
}

// loaded makes a freshly filled, write-locked frame valid, copies it to dst
// and hands it to the eviction policy.
func (s *Store) loaded(k pageid.Key, f int32, dst []byte) {
	s.frames[f].valid = true
	copy(dst, s.page(f))
	s.frames[f].mu.Unlock()
	s.track(f, k)
}

// asyncLoad is one GetAsync miss in flight. fn is its finish method, bound
// once when the load is made, so a miss allocates nothing.
type asyncLoad struct {
	s    *Store
	k    pageid.Key
	f    int32
	dst  []byte
	done func(error)
	fn   func(error)
}

func (l *asyncLoad) finish(err error) {
	s, k, f, dst, done := l.s, l.k, l.f, l.dst, l.done
	l.dst, l.done = nil, nil
	s.loads.Put(l)
	if err != nil {
		s.unpublish(k, f)
		err = fmt.Errorf("reading page %v: %w", k, err)
	} else {
		s.loaded(k, f, dst)
	}
	s.async.Add(-1)
	done(err)
}

// PutNow stores src (1 to MaxAsyncPages whole pages) as the pages from k
// on if it can without waiting: each page is cached and no one holds it,
// or a free frame or a clean page's frame takes it. Otherwise it returns
// ErrWouldBlock having stored only the pages before the one that would
// wait (the page is being read, flushed or loaded; only dirty frames are
// left to evict); write them all with Put or WriteRange from a goroutine
// that may block. Other errors (a bad key, a missing volume) are final,
// and nothing was stored.
//
// It is the write path of a connection reader that runs small writes to
// completion without a worker, as GetAsync is its read path.
func (s *Store) PutNow(k pageid.Key, src []byte) error {
	n, err := s.checkRun(k, len(src))
	if err != nil {
		return err
	}
	for i := range n {
		if err := s.putPageNow(pageid.MakeKey(k.Volume(), k.Page()+uint64(i)), src[i*pageid.Size:(i+1)*pageid.Size]); err != nil {
			return err
		}
	}
	return nil
}

// putPageNow is PutNow of one page of a volume known to hold it.
func (s *Store) putPageNow(k pageid.Key, src []byte) error {
	if f, ok := s.lookup(k); ok {
		fr := &s.frames[f]
		if !fr.mu.TryLock() {
			return ErrWouldBlock
		}
		if fr.key != k || !fr.valid {
			fr.mu.Unlock()
			return ErrWouldBlock
		}
		copy(s.page(f), src)
		s.written(f)
		s.pol.hit(f)
		s.hits.Add(1)
		return nil
	}
	f, ok := s.tryClaimClean()
	if !ok {
		return ErrWouldBlock
	}
	if !s.publish(k, f) {
		return ErrWouldBlock // someone else is placing k
	}
	s.misses.Add(1)
	copy(s.page(f), src)
	s.frames[f].valid = true
	s.written(f)
	s.track(f, k)
	return nil
}

// cleanTries bounds the dirty (or busy) pages the policy may offer a
// non-blocking caller before it gives up. Below the three-quarters rule
// dirty pages can still fill the head of the policy's queues (the
// newest pages of a write burst, in S3-FIFO's small queue, are all
// dirty), and an unbounded scan went round them for up to four times
// every frame under evictMu (docs/decisions.md, 11).
const cleanTries = 32

// tryClaimClean is claimFrame for a caller that must not block: a free
// frame, or a clean resident page evicted without a write-back.
func (s *Store) tryClaimClean() (int32, bool) {
	claim := s.claimClean
	if s.dirtyCount() > len(s.frames)*3/4 {
		// Few clean pages are left: the policy's scan for one looks at
		// up to four times every frame, under evictMu, on a path that
		// must not wait. Take only a free frame; claimFrame writes a
		// victim back instead.
		claim = nil
	}
	f, free := s.takeVictim(claim, cleanTries)
	if free {
		return f, true
	}
	if f < 0 {
		return -1, false
	}
	if fr := &s.frames[f]; fr.valid { // else a discarded page
		s.evicted(f, fr.key)
	}
	return f, true
}

// initAsync prepares the pools GetAsync uses.
func (s *Store) initAsync() {
	s.loads.New = func() any {
		l := &asyncLoad{s: s}
		l.fn = l.finish
		return l
	}
	s.runLoads.New = func() any {
		l := &asyncRun{s: s}
		for i := range l.parts {
			p := &l.parts[i]
			p.l, p.fn = l, p.finish
		}
		return l
	}
	s.claimClean = func(f int32) bool {
		if !s.claim(f) {
			return false
		}
		if s.dirty(f) {
			s.frames[f].mu.Unlock()
			return false
		}
		return true
	}
}

// asyncState is the part of Store that GetAsync uses.
type asyncState struct {
	async      atomic.Int64 // pages GetAsync is loading
	asyncLoads atomic.Uint64
	loads      sync.Pool // *asyncLoad
	runLoads   sync.Pool // *asyncRun
}
