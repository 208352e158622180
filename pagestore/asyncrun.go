package pagestore

import (
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/pd3-go/pd3/pageid"
)

// MaxAsyncPages is the most pages one GetAsync reads: a database's 8 KiB
// page and the kernel's small reads around it, below the sizes served as
// streams (ReadStream). Its frames stay locked until the last read
// returns (docs/decisions.md, 29).
const MaxAsyncPages = 16

// asyncRun is one multi-page GetAsync with misses in flight. Its parts,
// each bound to its finish method once when the run is made, are the
// remote reads of its runs of missing pages, so a read allocates nothing.
type asyncRun struct {
	s       *Store
	first   pageid.Key
	dst     []byte
	frames  [MaxAsyncPages]int32 // the frame loading each missing page
	parts   [MaxAsyncPages]asyncPart
	pending atomic.Int32 // parts not yet finished
	mu      sync.Mutex
	err     error // the first part's error, under mu
	done    func(error)
}

// asyncPart is the remote read of pages [i, j) of its run.
type asyncPart struct {
	l    *asyncRun
	i, j int
	fn   func(error)
}

// checkRun validates a run of bytes bytes from page first for GetAsync
// and PutNow: whole pages, 1 to MaxAsyncPages of them, all in a served
// volume. It returns how many pages.
func (s *Store) checkRun(first pageid.Key, bytes int) (int, error) {
	n := bytes / pageid.Size
	if bytes%pageid.Size != 0 || n < 1 || n > MaxAsyncPages {
		return 0, ErrBadPage
	}
	if first.Page()+uint64(n) > 1<<pageid.PageBits {
		return 0, fmt.Errorf("pages %v+%d: %w", first, n, pageid.ErrOutOfRange)
	}
	// The volume and its last page: every page is in range.
	return n, s.CheckKey(pageid.MakeKey(first.Volume(), first.Page()+uint64(n-1)))
}

// getPagesAsync is GetAsync of more than one page. Hits are copied first,
// then every missing page gets a frame; if any step would wait, whatever
// was claimed is given back and the caller takes the blocking path.
func (s *Store) getPagesAsync(first pageid.Key, dst []byte, done func(error)) (bool, error) {
	n, err := s.checkRun(first, len(dst))
	if err != nil {
		return true, err
	}
	key := func(i int) pageid.Key { return pageid.MakeKey(first.Volume(), first.Page()+uint64(i)) }
	var missing [MaxAsyncPages]bool
	var hit [MaxAsyncPages]int32
	nhit, nmiss := 0, 0
	for i := range n {
		k := key(i)
		f, ok := s.lookup(k)
		if !ok {
			missing[i] = true
			nmiss++
			continue
		}
		if !s.copyHit(k, f, dst[i*pageid.Size:(i+1)*pageid.Size]) {
			return false, ErrWouldBlock
		}
		hit[nhit] = f
		nhit++
	}
	// Hits are counted once the read goes ahead: a read sent to the
	// blocking path counts them there.
	counted := func() {
		for _, f := range hit[:nhit] {
			s.pol.hit(f)
		}
		s.hits.Add(uint64(nhit))
		s.misses.Add(uint64(nmiss))
	}
	if nmiss == 0 {
		counted()
		return true, nil
	}
	ar, one := s.remote.(AsyncReader)
	apr, runs := s.remote.(AsyncPagesReader)
	if !one && !runs {
		return false, ErrWouldBlock
	}
	if s.async.Add(int64(nmiss)) > s.maxAsync() {
		s.async.Add(-int64(nmiss))
		return false, ErrWouldBlock
	}
	l := s.runLoads.Get().(*asyncRun)
	for i := range n {
		if !missing[i] {
			continue
		}
		f, ok := s.tryClaimClean()
		if !ok || !s.publish(key(i), f) { // a failed publish frees f
			for x := range i {
				if missing[x] {
					s.unpublish(key(x), l.frames[x])
				}
			}
			s.async.Add(-int64(nmiss))
			s.runLoads.Put(l)
			return false, ErrWouldBlock
		}
		l.frames[i] = f
	}
	counted()
	if s.mayBePrefetched() {
		for i := range n {
			if !missing[i] || !s.prefetched(key(i), s.page(l.frames[i])) {
				continue
			}
			s.async.Add(-1)
			s.loaded(key(i), l.frames[i], dst[i*pageid.Size:(i+1)*pageid.Size])
			missing[i] = false
			nmiss--
		}
	}
	if nmiss == 0 {
		s.runLoads.Put(l)
		return true, nil
	}
	// The reads: a run of consecutive missing pages each, or a page each
	// from a remote that reads one page at a time.
	np := 0
	for i := 0; i < n; {
		if !missing[i] {
			i++
			continue
		}
		j := i + 1
		for runs && j < n && missing[j] {
			j++
		}
		l.parts[np].i, l.parts[np].j = i, j
		np++
		i = j
	}
	l.first, l.dst, l.done, l.err = first, dst, done, nil
	l.pending.Store(int32(np))
	s.remoteReads.Add(uint64(nmiss))
	s.asyncLoads.Add(uint64(nmiss))
	for x := range np {
		// A part may finish at once, and the last one to finish recycles
		// l: read what issuing needs before issuing.
		p := &l.parts[x]
		i, j, fn := p.i, p.j, p.fn
		if runs {
			apr.ReadPagesAsync(key(i), dst[i*pageid.Size:j*pageid.Size], fn)
		} else {
			ar.ReadPageAsync(key(i), dst[i*pageid.Size:j*pageid.Size], fn)
		}
	}
	return false, nil
}

// finish completes a part's pages, which the remote read into the
// caller's buffer: each is copied into its frame and made valid. The last
// part to finish tells the caller.
func (p *asyncPart) finish(err error) {
	l := p.l
	s := l.s
	for i := p.i; i < p.j; i++ {
		k := pageid.MakeKey(l.first.Volume(), l.first.Page()+uint64(i))
		f := l.frames[i]
		if err != nil {
			s.unpublish(k, f)
			continue
		}
		copy(s.page(f), l.dst[i*pageid.Size:(i+1)*pageid.Size])
		s.frames[f].valid = true
		s.frames[f].mu.Unlock()
		s.track(f, k)
	}
	s.async.Add(-int64(p.j - p.i))
	if err != nil {
		l.mu.Lock()
		if l.err == nil {
			l.err = fmt.Errorf("reading pages from %v: %w", pageid.MakeKey(l.first.Volume(), l.first.Page()+uint64(p.i)), err)
		}
		l.mu.Unlock()
	}
	if l.pending.Add(-1) != 0 {
		return
	}
	done, ferr := l.done, l.err
	l.dst, l.done, l.err = nil, nil, nil
	s.runLoads.Put(l)
	done(ferr)
}
