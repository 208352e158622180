package dpu

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pd3-go/pd3/hostview"
	"github.com/pd3-go/pd3/loadingzone"
	"github.com/pd3-go/pd3/memnode"
	"github.com/pd3-go/pd3/pageid"
	"github.com/pd3-go/pd3/pagestore"
)

// Engine is the transfer engine: it owns the connection to the memory node
// in PD3 mode and carries the host's remote reads and write-backs as well
// as the agent's prefetches, applying PD3 Table 2:
//
//   - a write-back invalidates the key's Loading Zone record and any
//     prefetch of it in flight, and only then is queued to the node. It
//     leaves Host View alone, unlike PD3's rule: PD3's host writes a page
//     back as it evicts it, but our store also writes back pages it keeps
//     (flush, fsync, NBD FLUSH), and dropping their keys made the agent
//     prefetch pages the host held. An eviction, dirty or clean, removes
//     the key through the host's eviction notice (Agent.Evicted);
//   - a read response adds its key to Host View before it is delivered;
//   - a prefetch response is placed in the Loading Zone (and its key added
//     to Host View) only if no write-back of the key was queued since the
//     prefetch was issued.
//
// All traffic goes through one Conn, whose requests each memory node
// executes in the order sent, and a write-back's WRITEs are queued under
// the same lock that issues prefetches: a prefetch issued after a
// write-back therefore reads what the write-back wrote (JUNE BERRY's
// same-queue rule). With replicated volumes a write-back is queued to
// every copy before the lock is released, so whichever copy a prefetch
// reads has it.
type Engine struct {
	c      Conn
	unlock func() // mu.Unlock, bound once: Conn calls it when writes are queued
	hv     *hostview.Set
	lz     *loadingzone.Zone

	mu       sync.Mutex // orders invalidation, write queueing and prefetch issue
	inflight map[pageid.Key]*flight
	gen      uint64
	flights  sync.Pool

	free   chan *prefetch // free prefetches; bounds prefetches in flight
	runs   chan *run      // free run buffers; bounds runs in flight
	closed bool           // guarded by mu: completions touch nothing shared
	// finishing counts completions running (they touch the Loading Zone
	// after releasing mu): Close waits for those that may have seen the
	// engine open. A lock here would let a waiting Close hold up the
	// connection's reader, which a write-back holding mu may wait for.
	finishing atomic.Int64

	// Counters.
	Issued, Placed, Deduped, Throttled, Stale, Failed atomic.Uint64
	HostReads, WriteBacks                             atomic.Uint64
	// Deferred counts prefetch completions the connection's reader could
	// not finish itself because the engine's lock was taken, and passed
	// to a goroutine of their own.
	Deferred atomic.Uint64
	// Joined counts host misses served by waiting for a prefetch in flight.
	Joined atomic.Uint64
	// FalsePositives counts host misses on keys Host View claimed the host
	// held: the agent skipped a prefetch it should have issued.
	FalsePositives atomic.Uint64
}

// prefetch is one page's prefetch in flight, pooled with its buffer and
// its completion function, so a prefetch allocates nothing.
type prefetch struct {
	e   *Engine
	k   pageid.Key
	f   *flight
	buf []byte
	js  []joiner    // scratch for the joiners it finishes
	fn  func(error) // e.answered with finish, bound once
}

// run is a prefetch of consecutive pages with one READ. flights[i] is nil
// for a page already in flight when the run was issued.
type run struct {
	e       *Engine
	first   pageid.Key
	n       int
	flights [MaxRun]*flight
	buf     []byte
	js      []joiner
	jkeys   []pageid.Key
	jn      []int
	fn      func(error) // e.answered with finish, bound once
}

// MaxRun is the most pages one prefetch request carries.
const MaxRun = 64

// runBuffers bounds the runs in flight.
const runBuffers = 16

// flight is a prefetch in flight. Host misses on its key wait for it
// (done closes when it is placed or given up) instead of reading the page a
// second time.
type flight struct {
	gen     uint64
	waiters int // guarded by Engine.mu
	done    chan struct{}
	// joiners are host misses that asked without blocking
	// (ReadPageAsync); they are finished after the flight completes.
	joiners []joiner // guarded by Engine.mu
}

type joiner struct {
	dst  []byte
	done func(error)
}

var _ pagestore.Remote = (*Engine)(nil)

// Conn carries the engine's traffic to memory: one memory node's
// connection (NodeConn) or the nodes of replicated volumes
// (replica.Remote). The engine's ordering rests on one promise: a read
// started after a write's queued callback ran reads what the write wrote,
// at whichever copy it is served.
type Conn interface {
	// PrefetchFn, ReadOneFn and ReadAsync read at one copy, without
	// failing over: a prefetch that fails costs only itself, and the
	// engine reads a host miss that fails again with ReadAt. PrefetchFn
	// and ReadOneFn call done once, on the connection's reader goroutine
	// when the answer has arrived (or at once if the read cannot start):
	// the engine finishes a prefetch there, with no goroutine hand-off,
	// and done must not block.
	PrefetchFn(k pageid.Key, page []byte, done func(error))
	ReadOneFn(vol uint16, off uint64, p []byte, done func(error))
	ReadAsync(ctx context.Context, vol uint16, off uint64, p []byte) memnode.Call
	// Span is how many of the n pages from first one read carries (at
	// least one): a replicated volume's reads end where an extent does.
	Span(first pageid.Key, n int) int
	// ReadAt reads p at byte off of vol, failing over between copies.
	ReadAt(ctx context.Context, vol uint16, off uint64, p []byte) error
	// ReadFn is ReadAt without blocking: done is called once, later on
	// another goroutine or at once if the read could not start, and must
	// not block.
	ReadFn(vol uint16, off uint64, p []byte, done func(error))
	// WriteQueued stores pages[i] as keys[i] at every copy and returns
	// once all are acknowledged. queued is called exactly once, when every
	// write is sent (or failed to be), before any is awaited.
	WriteQueued(ctx context.Context, keys []pageid.Key, pages [][]byte, queued func()) error
	// TrimQueued discards n bytes at off of vol, calling queued as
	// WriteQueued does.
	TrimQueued(ctx context.Context, vol uint16, off, n uint64, queued func()) error
	// Fence presents volume vol's fencing token on the connections the
	// engine's writes take.
	Fence(ctx context.Context, vol uint16, token uint64) error
}

// NodeConn is the Conn of one memory-node connection: requests are
// executed in the order sent, so a write is queued once it is sent.
type NodeConn struct{ *memnode.Client }

// Map implements pagestore.Mapper, for an Engine over a memory node.
func (c NodeConn) Map(ctx context.Context, vol uint16, off, n uint64, fn func(off, n uint64, hole bool)) error {
	return memnode.Remote{C: c.Client}.Map(ctx, vol, off, n, fn)
}

// ReadOneFn implements Conn: one node has one copy.
func (c NodeConn) ReadOneFn(vol uint16, off uint64, p []byte, done func(error)) {
	c.ReadFn(vol, off, p, done)
}

// Span implements Conn: a node holds the whole volume.
func (NodeConn) Span(_ pageid.Key, n int) int { return n }

// WriteQueued implements Conn: every WRITE sent, then awaited.
func (c NodeConn) WriteQueued(ctx context.Context, keys []pageid.Key, pages [][]byte, queued func()) error {
	const batch = 64
	var calls [batch]memnode.Call
	var failed pageid.Failures
	total := len(keys)
	for len(keys) > 0 {
		n := min(len(keys), batch)
		for i, k := range keys[:n] {
			calls[i] = c.WriteAsync(ctx, k.Volume(), k.Page()*pageid.Size, pages[i])
		}
		if queued != nil && len(keys) == n {
			queued()
			queued = nil
		}
		for i := range n {
			if err := calls[i].Wait(ctx); err != nil {
				failed.Add(keys[i], err)
			}
		}
		keys, pages = keys[n:], pages[n:]
	}
	if queued != nil {
		queued()
	}
	return failed.Err("writing", total)
}

// TrimQueued implements Conn.
func (c NodeConn) TrimQueued(ctx context.Context, vol uint16, off, n uint64, queued func()) error {
	return c.Client.TrimQueued(ctx, vol, off, n, queued)
}

// NewEngine starts an engine with at most maxInFlight prefetches
// outstanding. hv may be nil when nothing reads Host View (a host-side
// prefetcher such as Leap).
func NewEngine(c Conn, hv *hostview.Set, lz *loadingzone.Zone, maxInFlight int) *Engine {
	if maxInFlight <= 0 {
		maxInFlight = 1024
	}
	e := &Engine{
		c: c, hv: hv, lz: lz,
		inflight: make(map[pageid.Key]*flight, maxInFlight),
		free:     make(chan *prefetch, maxInFlight),
		runs:     make(chan *run, runBuffers),
	}
	for i := 0; i < maxInFlight; i++ {
		p := &prefetch{e: e, buf: make([]byte, pageid.Size)}
		finish := p.finish
		p.fn = func(err error) { e.answered(finish, err) }
		e.free <- p
	}
	for i := 0; i < runBuffers; i++ {
		r := &run{e: e, buf: make([]byte, MaxRun*pageid.Size)}
		finish := r.finish
		r.fn = func(err error) { e.answered(finish, err) }
		e.runs <- r
	}
	e.unlock = e.mu.Unlock
	e.flights.New = func() any { return new(flight) }
	return e
}

// Close makes the prefetches in flight end without touching the Loading
// Zone or Host View, so both may be released once it returns (answers
// arrive until the connection closes): misses that joined them are told
// the engine closed, and misses waiting in ReadPage read for themselves.
func (e *Engine) Close() {
	e.mu.Lock()
	e.closed = true
	e.mu.Unlock()
	for e.finishing.Load() > 0 { // those that saw it open end soon
		time.Sleep(10 * time.Microsecond)
	}
}

// errClosed ends the prefetches that complete after Close.
var errClosed = errors.New("dpu: transfer engine closed")

// Prefetch fetches page k into the Loading Zone unless a prefetch of k is
// already in flight or too many are. It does not wait.
func (e *Engine) Prefetch(k pageid.Key) {
	var p *prefetch
	select {
	case p = <-e.free:
	default:
		e.Throttled.Add(1)
		return
	}
	e.mu.Lock()
	f := e.startFlight(k)
	if f == nil {
		e.mu.Unlock()
		e.free <- p
		return
	}
	p.k, p.f = k, f
	e.Issued.Add(1)
	e.c.PrefetchFn(k, p.buf, p.fn)
	e.mu.Unlock()
}

// answered finishes a prefetch or run on the connection's reader:
// finish runs with e.mu held and unlocks it. The lock is only tried: its
// holder may be queueing a write-back on this very connection, behind a
// full send buffer that waits for the node, which waits for this reader.
func (e *Engine) answered(finish func(error), err error) {
	e.finishing.Add(1)
	if !e.mu.TryLock() {
		e.Deferred.Add(1)
		go func() {
			e.mu.Lock()
			finish(err)
			e.finishing.Add(-1)
		}()
		return
	}
	finish(err)
	e.finishing.Add(-1)
}

// finish places the page, e.mu held (it unlocks), then serves joiners.
func (p *prefetch) finish(err error) {
	e := p.e
	if e.closed {
		err = errClosed
	}
	e.complete(p.k, p.f, p.buf, err)
	js := takeJoiners(p.f, p.js[:0])
	e.mu.Unlock()
	e.flights.Put(p.f) // waiters keep only the channel
	e.finishJoiners(p.k, js, err)
	clear(js)
	p.js, p.f = js[:0], nil
	e.free <- p
}

// startFlight registers a prefetch of k, e.mu held; nil (and counted) if
// one is already in flight.
func (e *Engine) startFlight(k pageid.Key) *flight {
	if _, ok := e.inflight[k]; ok {
		e.Deduped.Add(1)
		return nil
	}
	e.gen++
	f := e.flights.Get().(*flight)
	f.gen, f.waiters, f.done = e.gen, 0, nil
	e.inflight[k] = f
	return f
}

// PrefetchRun fetches the n (≤ MaxRun) pages from first into the Loading
// Zone with one request, skipping pages already in flight. Like Prefetch
// it never waits: without a free run buffer the run is dropped.
func (e *Engine) PrefetchRun(first pageid.Key, n int) {
	n = min(n, MaxRun)
	for n > 0 {
		m := max(1, min(n, e.c.Span(first, n)))
		e.prefetchRun(first, m)
		first, n = pageid.MakeKey(first.Volume(), first.Page()+uint64(m)), n-m
	}
}

// prefetchRun is PrefetchRun of pages one read carries.
func (e *Engine) prefetchRun(first pageid.Key, n int) {
	var r *run
	select {
	case r = <-e.runs:
	default:
		e.Throttled.Add(uint64(n))
		return
	}
	r.first, r.n = first, n
	e.mu.Lock()
	issued := 0
	for i := 0; i < n; i++ {
		r.flights[i] = e.startFlight(pageid.MakeKey(first.Volume(), first.Page()+uint64(i)))
		if r.flights[i] != nil {
			issued++
		}
	}
	if issued == 0 {
		e.mu.Unlock()
		e.runs <- r
		return
	}
	e.Issued.Add(uint64(issued))
	e.c.ReadOneFn(first.Volume(), first.Page()*pageid.Size, r.buf[:n*pageid.Size], r.fn)
	e.mu.Unlock()
}

// finish places the run's pages, e.mu held (it unlocks), then serves
// joiners.
func (r *run) finish(err error) {
	e := r.e
	if e.closed {
		err = errClosed
	}
	js, jkeys, jn := r.js[:0], r.jkeys[:0], r.jn[:0]
	for i, f := range r.flights[:r.n] {
		if f != nil {
			k := pageid.MakeKey(r.first.Volume(), r.first.Page()+uint64(i))
			e.complete(k, f, r.buf[i*pageid.Size:(i+1)*pageid.Size], err)
			if len(f.joiners) > 0 {
				jkeys, jn = append(jkeys, k), append(jn, len(f.joiners))
				js = takeJoiners(f, js)
			}
		}
	}
	e.mu.Unlock()
	for i, f := range r.flights[:r.n] {
		if f != nil {
			e.flights.Put(f)
			r.flights[i] = nil
		}
	}
	rest := js
	for i, k := range jkeys {
		e.finishJoiners(k, rest[:jn[i]], err)
		rest = rest[jn[i]:]
	}
	clear(js)
	r.js, r.jkeys, r.jn = js[:0], jkeys[:0], jn[:0]
	e.runs <- r
}

// complete applies a finished prefetch of page k (its flight f, its bytes
// page) under e.mu: placed unless a write-back overtook it.
func (e *Engine) complete(k pageid.Key, f *flight, page []byte, err error) {
	if e.inflight[k] != f {
		// A write-back of the key was queued meanwhile: this page may
		// predate it and must not be served.
		e.Stale.Add(1)
	} else {
		delete(e.inflight, k)
		if err != nil {
			e.Failed.Add(1)
		} else {
			e.lz.Place(uint64(k), page)
			if e.hv != nil {
				e.hv.Add(uint64(k))
			}
			e.Placed.Add(1)
		}
	}
	if f.done != nil {
		close(f.done) // waiters look in the Loading Zone now
	}
}

// finishJoiners serves the asynchronous host misses that waited for
// prefetch f of page k, e.mu not held: from the Loading Zone, or if the
// page was stale or failed, by reading it themselves; after Close, with
// its error.
func (e *Engine) finishJoiners(k pageid.Key, js []joiner, err error) {
	for _, j := range js {
		if err == errClosed {
			j.done(err)
			continue
		}
		if e.lz.CheckAndReturn(uint64(k), j.dst) == pageid.Size {
			e.Joined.Add(1)
			j.done(nil)
			continue
		}
		// Stale or failed (rare). Not on this goroutine, which may be the
		// connection's reader: sending can wait for it.
		go e.readFn(k, j.dst, j.done)
	}
}

// takeJoiners empties f's joiner list into buf, e.mu held.
func takeJoiners(f *flight, buf []joiner) []joiner {
	buf = append(buf, f.joiners...)
	clear(f.joiners)
	f.joiners = f.joiners[:0]
	return buf
}

// ReadPage implements pagestore.Remote: the host's own miss. If a
// prefetch of k is in flight it waits for that instead of reading k again.
func (e *Engine) ReadPage(ctx context.Context, k pageid.Key, dst []byte) error {
	e.mu.Lock()
	if f, ok := e.inflight[k]; ok {
		if f.done == nil {
			f.done = make(chan struct{})
		}
		f.waiters++
		done := f.done
		e.mu.Unlock()
		select {
		case <-done:
			if e.lz.CheckAndReturn(uint64(k), dst) == pageid.Size {
				e.Joined.Add(1)
				return nil
			}
			// Stale or failed: read it ourselves.
		case <-ctx.Done():
			return ctx.Err()
		}
	} else {
		e.mu.Unlock()
	}
	e.HostReads.Add(1)
	if e.hv == nil {
		return e.c.ReadAt(ctx, k.Volume(), k.Page()*pageid.Size, dst)
	}
	if e.hv.Contains(uint64(k)) {
		e.FalsePositives.Add(1)
	}
	// The page is the host's from now on: adding it before the read, not
	// after, keeps the agent from prefetching it meanwhile for the same
	// request (measured: a quarter of random NBD misses were read twice).
	// A failed read leaves a false "present", which costs at most a
	// prefetch the agent skips.
	e.hv.Add(uint64(k))
	return e.c.ReadAt(ctx, k.Volume(), k.Page()*pageid.Size, dst)
}

// ReadPageAsync implements pagestore.AsyncReader: ReadPage without
// blocking. A miss on a page whose prefetch is in flight joins it and is
// finished with that prefetch; others are read on the engine's connection
// and finished by its reader.
func (e *Engine) ReadPageAsync(k pageid.Key, dst []byte, done func(error)) {
	e.mu.Lock()
	if f, ok := e.inflight[k]; ok {
		f.joiners = append(f.joiners, joiner{dst: dst, done: done})
		e.mu.Unlock()
		return
	}
	e.mu.Unlock()
	e.readFn(k, dst, done)
}

// readFn is the host's own read of k, as in ReadPage.
func (e *Engine) readFn(k pageid.Key, dst []byte, done func(error)) {
	e.HostReads.Add(1)
	e.hostReads(k)
	e.c.ReadFn(k.Volume(), k.Page()*pageid.Size, dst, done)
}

// hostReads enters k in Host View before the host's own read of it, as
// ReadPage does, counting a page Host View already had as a false
// positive.
func (e *Engine) hostReads(k pageid.Key) {
	if e.hv == nil {
		return
	}
	if e.hv.Contains(uint64(k)) {
		e.FalsePositives.Add(1)
	}
	e.hv.Add(uint64(k))
}

// ReadPagesAsync implements pagestore.AsyncPagesReader: the host's miss
// on a run of pages, without blocking. A run none of whose pages has a
// prefetch in flight (the usual case: the agent skips what the host is
// reading) is one read on the engine's connection, finished by its
// reader; otherwise ReadPages joins the prefetches on a goroutine of its
// own.
func (e *Engine) ReadPagesAsync(first pageid.Key, p []byte, done func(error)) {
	n := len(p) / pageid.Size
	key := func(i int) pageid.Key { return pageid.MakeKey(first.Volume(), first.Page()+uint64(i)) }
	e.mu.Lock()
	for i := range n {
		if _, ok := e.inflight[key(i)]; ok {
			e.mu.Unlock()
			go func() { done(e.ReadPages(context.Background(), first, p)) }()
			return
		}
	}
	e.mu.Unlock()
	e.HostReads.Add(uint64(n))
	for i := range n {
		e.hostReads(key(i))
	}
	e.c.ReadFn(first.Volume(), first.Page()*pageid.Size, p, done)
}

var (
	_ pagestore.AsyncReader      = (*Engine)(nil)
	_ pagestore.AsyncPagesReader = (*Engine)(nil)
)

// ReadPages implements pagestore.PagesReader: the host's miss on a run of
// pages. Pages with a prefetch in flight wait for it, as ReadPage does;
// each stretch of the others is read with one request. The store holds
// the run's frames locked, so no write-back of these pages can be queued
// meanwhile.
func (e *Engine) ReadPages(ctx context.Context, first pageid.Key, p []byte) error {
	return e.readPages(ctx, first, p, true)
}

// ReadStreamPages implements pagestore.StreamReader: ReadPages for pages
// the host will not cache (a FUSE stream read), which Host View therefore
// does not take as the host's. Such a read left a page in Host View for
// good (nothing evicts a page never cached), so the agent never
// prefetched it again; and it cost a Host View add per page.
func (e *Engine) ReadStreamPages(ctx context.Context, first pageid.Key, p []byte) error {
	return e.readPages(ctx, first, p, false)
}

// StreamTook implements pagestore.StreamReader: a stream took k from the
// Loading Zone, where the agent placed it (and put it in Host View) for
// the host to cache; the host does not hold it after all.
func (e *Engine) StreamTook(k pageid.Key) {
	if e.hv != nil {
		e.hv.Delete(uint64(k))
	}
}

// readPages reads a run of pages, joining prefetches in flight; held
// says whether the host will cache them (Host View adds them first).
func (e *Engine) readPages(ctx context.Context, first pageid.Key, p []byte, held bool) error {
	n := len(p) / pageid.Size
	key := func(i int) pageid.Key { return pageid.MakeKey(first.Volume(), first.Page()+uint64(i)) }
	var waits [MaxRun]chan struct{}
	var calls [MaxRun]memnode.Call
	var starts, ends [MaxRun]int
	nc := 0
	if e.hv != nil && held { // before the reads, as in ReadPage
		for i := 0; i < n; i++ {
			e.hv.Add(uint64(key(i)))
		}
	}
	e.mu.Lock()
	for i := 0; i < n; {
		if i < MaxRun {
			if f, ok := e.inflight[key(i)]; ok {
				if f.done == nil {
					f.done = make(chan struct{})
				}
				f.waiters++
				waits[i] = f.done
				i++
				continue
			}
		}
		j := i + 1
		for j < n && (j >= MaxRun || e.inflight[key(j)] == nil) {
			j++
		}
		starts[nc], ends[nc] = i, j
		calls[nc] = e.c.ReadAsync(ctx, first.Volume(), key(i).Page()*pageid.Size, p[i*pageid.Size:j*pageid.Size])
		nc++
		i = j
	}
	e.mu.Unlock()
	var errs error
	for c := 0; c < nc; c++ {
		if calls[c].Wait(ctx) != nil {
			// Once more, failing over to another copy if there is one.
			i, j := starts[c], ends[c]
			errs = errors.Join(errs, e.c.ReadAt(ctx, first.Volume(), key(i).Page()*pageid.Size, p[i*pageid.Size:j*pageid.Size]))
		}
	}
	if errs != nil {
		return errs
	}
	for i := 0; i < min(n, MaxRun); i++ {
		if waits[i] == nil {
			continue
		}
		dst := p[i*pageid.Size : (i+1)*pageid.Size]
		select {
		case <-waits[i]:
		case <-ctx.Done():
			return ctx.Err()
		}
		if e.lz.CheckAndReturn(uint64(key(i)), dst) == pageid.Size {
			e.Joined.Add(1)
			continue
		}
		// Stale or failed: read it ourselves.
		if err := e.c.ReadAt(ctx, first.Volume(), key(i).Page()*pageid.Size, dst); err != nil {
			return err
		}
	}
	e.HostReads.Add(uint64(n))
	return nil
}

var (
	_ pagestore.PagesReader  = (*Engine)(nil)
	_ pagestore.StreamReader = (*Engine)(nil)
)

// Trim implements pagestore.Trimmer: like a write-back, it invalidates the
// pages' Host View entries, Loading Zone records and in-flight prefetches
// before the TRIM is queued on the shared connection.
// Fence presents volume vol's fencing token on the engine's memory-node
// connection (memnode.Client.Fence), so that its write-backs are the
// lease holder's.
func (e *Engine) Fence(ctx context.Context, vol uint16, token uint64) error {
	return e.c.Fence(ctx, vol, token)
}

// Map implements pagestore.Mapper through the engine's connection when it
// can map (a memory node, a replica group), else every run is data. What
// the agent prefetched is not stored, so it changes nothing.
func (e *Engine) Map(ctx context.Context, vol uint16, off, n uint64, fn func(off, n uint64, hole bool)) error {
	if m, ok := e.c.(pagestore.Mapper); ok {
		return m.Map(ctx, vol, off, n, fn)
	}
	fn(off, n, false)
	return nil
}

func (e *Engine) Trim(ctx context.Context, vol uint16, off, n uint64) error {
	e.mu.Lock()
	first, end := off/pageid.Size, (off+n+pageid.Size-1)/pageid.Size
	if end-first <= uint64(e.lz.Records()) {
		for p := first; p < end; p++ {
			k := pageid.MakeKey(vol, p)
			if e.hv != nil {
				e.hv.Delete(uint64(k))
			}
			e.lz.Invalidate(uint64(k))
			delete(e.inflight, k)
		}
		return e.c.TrimQueued(ctx, vol, off, n, e.unlock)
	}
	// More pages than the zone has records (a file's volume trimmed past
	// its size, terabytes): one pass over the prefetches in flight and
	// one over the records. Host View loses what the zone held; a page
	// the host caches leaves Host View when the host's page store drops
	// it for the trim (its OnEvict), and other pages have no entry.
	lo, hi := pageid.MakeKey(vol, first), pageid.MakeKey(vol, end)
	for k := range e.inflight {
		if k >= lo && k < hi {
			delete(e.inflight, k)
		}
	}
	e.lz.InvalidateRange(uint64(lo), uint64(hi), func(k uint64) {
		if e.hv != nil {
			e.hv.Delete(k)
		}
	})
	return e.c.TrimQueued(ctx, vol, off, n, e.unlock)
}

var _ pagestore.Trimmer = (*Engine)(nil)

// Invalidate forgets k as a write-back does — Loading Zone record,
// prefetch in flight — for a write that reached the memory
// node by another connection (the host's direct path in split mode). Call
// it after that write is acknowledged: prefetches issued later read it.
func (e *Engine) Invalidate(k pageid.Key) {
	e.mu.Lock()
	e.lz.Invalidate(uint64(k))
	delete(e.inflight, k)
	e.mu.Unlock()
}

// WritePages implements pagestore.Remote: write-backs, invalidating first.
func (e *Engine) WritePages(ctx context.Context, keys []pageid.Key, pages [][]byte) error {
	const batch = 64
	var errs error
	for len(keys) > 0 {
		n := min(len(keys), batch)
		e.mu.Lock()
		for _, k := range keys[:n] {
			e.lz.Invalidate(uint64(k))
			// Its completion will find no entry (or a newer prefetch's
			// generation) and drop the page it read.
			delete(e.inflight, k)
		}
		errs = errors.Join(errs, e.c.WriteQueued(ctx, keys[:n], pages[:n], e.unlock))
		e.WriteBacks.Add(uint64(n))
		keys, pages = keys[n:], pages[n:]
	}
	return errs
}
