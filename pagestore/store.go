package pagestore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pd3-go/pd3/pageid"
)

// Errors callers branch on.
var (
	// ErrBadPage is returned when a buffer is not exactly one page.
	ErrBadPage = errors.New("pagestore: buffer is not one page")
	// ErrCacheFull is returned when no frame can be freed: every frame is
	// in use or dirty and its write-back failed.
	ErrCacheFull = errors.New("pagestore: no evictable page in cache")
)

// Options configure a Store.
type Options struct {
	// CacheBytes is the local cache capacity (default 64 MiB).
	CacheBytes int64
	// Policy is the eviction policy: "s3fifo" (default) or "clock".
	Policy string
	// Prefetched, if set, is consulted on every miss before the remote.
	Prefetched Prefetched
	// OnEvict, if set, receives keys of pages leaving the cache (called
	// with no locks held by the store, possibly concurrently).
	OnEvict func(pageid.Key)
	// RetryFor is how long a write-back that fails because the remote is
	// unreachable is retried — by an eviction that needs the frame, and by
	// Flush — before the error reaches the caller. A memory node that
	// restarts within it is invisible to clients. 0: no retries.
	RetryFor time.Duration
	// Log receives the background write-back's failures and recoveries
	// (nil: slog.Default()).
	Log *slog.Logger
	// Shadow is for measurement only: the pages of every read the Store
	// serves are read again from the remote, in runs as a prefetcher
	// would fetch them (shadow.go), into scratch buffers that are
	// dropped, without waiting. With a cache that holds every page, the
	// Store then pays each page's transfer as a perfect prefetcher would,
	// and never waits for one (pd3 bench apps's oracle systems;
	// docs/decisions.md, 43).
	Shadow bool
}

// DefaultCacheBytes is the default cache capacity.
const DefaultCacheBytes = 64 << 20

// Stats are cumulative counters.
type Stats struct {
	Hits, Misses uint64
	PrefetchHits uint64 // misses served by Prefetched
	RemoteReads  uint64
	AsyncLoads   uint64 // pages GetAsync read from the remote
	Evictions    uint64
	WriteBacks   uint64 // pages written to the remote
	// EvictionWriteBacks counts write-backs a miss waited for because
	// its victim was dirty: the background write-back fell behind.
	EvictionWriteBacks uint64
	// FreshWrites counts partial-page writes that started from zeroes
	// instead of reading the page (WriteFresh).
	FreshWrites         uint64
	DirtyPages, Frames  int
	ResidentPages       int
	SharedMissesWaiting uint64 // readers that waited for another's miss
	WritebackFailures   uint64 // background write-back rounds that failed
	// UncachedReads counts page reads served past the cache because no
	// frame could be freed: every frame busy, or dirty while the remote
	// refuses write-backs (a full disk at a persistent node).
	UncachedReads uint64
	// ReadAheadPages counts pages read into read-ahead windows,
	// ReadAheadHits those a stream read took from them, ReadAheadDropped
	// those dropped unread (a window replaced, or written to).
	ReadAheadPages, ReadAheadHits, ReadAheadDropped uint64
	// ShadowPages counts the pages Options.Shadow read again.
	ShadowPages uint64
}

// Store serves pages of volumes through a bounded local cache. It is safe
// for concurrent use.
//
// Lock order: frame.mu → shard.mu → evictMu; evictMu may only TryLock a
// frame. A frame's key and valid fields change only with its mu held for
// writing, so a reader that finds a frame through the index re-checks the
// key under the frame's read lock.
type Store struct {
	remote Remote
	opt    Options

	frames []frame
	data   []byte
	shards [nShards]shard

	evictMu sync.Mutex
	pol     policy
	free    []int32
	claim   func(int32) bool // TryLock of a frame, made once to avoid a closure per eviction
	// claimClean is claim for clean frames only: while the remote refuses
	// write-backs.
	claimClean func(int32) bool

	pages   sync.Pool // *[pageid.Size]byte scratch pages for partial reads
	runBufs sync.Pool // *[maxRun * pageid.Size]byte for batched loads
	// runSlots bounds the batched loads in flight so that together they
	// hold at most a quarter of the frames: a run keeps its frames locked
	// while it claims more, and runs holding every frame would wait for
	// each other until ErrCacheFull.
	runSlots chan struct{}

	// cleanKick wakes the background write-back (StartWriteback) early:
	// an eviction met a dirty victim, so misses are paying for write-backs
	// that a batched pass could have done ahead of them.
	cleanKick chan struct{}

	flushMu  sync.Mutex // one Flush batch at a time (flushFrom)
	flushBuf []byte     // guarded by flushMu

	fmu       sync.Mutex // guards the flush rounds
	fcond     *sync.Cond // signalled when a round ends
	flushing  bool
	nextRound *flushRound

	// held is nil while the store serves; while Suspend holds new
	// requests back it is the channel Resume closes.
	held atomic.Pointer[chan struct{}]

	vmu     sync.RWMutex
	volumes map[uint16]pageid.VolumeInfo
	fenced  map[uint16]bool // guarded by vmu

	hits, misses, lzHits, remoteReads atomic.Uint64
	evictions, writeBacks, waits      atomic.Uint64
	discards, wbFailures, evictWBs    atomic.Uint64
	freshWrites, uncached             atomic.Uint64
	ndirty                            atomic.Int64 // frames with dirty set
	// wbRefused is the remote's last refusal of a write-back for a reason
	// retrying does not cure (a full disk at the node): for wbRefusedFor
	// after it, a claim evicts clean pages only (docs/decisions.md, 7).
	wbRefused atomic.Pointer[refusal]
	// dirtyBits has bit f%64 of word f/64 set while frame f is dirty (set
	// with the frame's mu held for writing): a flush finds the dirty
	// frames by scanning words, not frames. A scan of a 64 MiB cache's
	// 16 K frames cost 50–65 µs of every fsync on the mount, and grows
	// with the cache.
	dirtyBits []atomic.Uint64

	ra readAhead

	shadow shadow // Options.Shadow's buffers and count
	asyncState
}

const nShards = 64

type shard struct {
	mu sync.Mutex
	m  index
	_  [16]byte // 64 bytes: keep shards on separate cache lines
}

type frame struct {
	mu    sync.RWMutex
	key   pageid.Key
	valid bool
	ver   uint64 // bumped by every write; guarded by mu
	// wb marks a Flush write-back in flight: the frame may not be evicted
	// until it is acknowledged, so an eviction's write-back of a newer
	// version can never be overtaken by the flush's older one.
	wb atomic.Bool
}

// New returns a store whose misses go to remote.
func New(remote Remote, opt Options) (*Store, error) {
	return newStore(remote, opt, framesInHeap)
}

// newStore is New with the cache's frames in the Go heap or outside it
// (frames.go).
func newStore(remote Remote, opt Options, inHeap bool) (*Store, error) {
	if opt.CacheBytes == 0 {
		opt.CacheBytes = DefaultCacheBytes
	}
	n := int(opt.CacheBytes / pageid.Size)
	if n < 4 {
		return nil, fmt.Errorf("pagestore: cache of %d bytes holds fewer than 4 pages", opt.CacheBytes)
	}
	pol, err := newPolicy(opt.Policy, n)
	if err != nil {
		return nil, err
	}
	s := &Store{
		remote:    remote,
		opt:       opt,
		frames:    make([]frame, n),
		dirtyBits: make([]atomic.Uint64, (n+63)/64),
		pol:       pol,
		free:      make([]int32, n),
		volumes:   make(map[uint16]pageid.VolumeInfo),
	}
	if s.data, err = frameMemory(s, n*pageid.Size, inHeap); err != nil {
		return nil, err
	}
	for i := range s.free {
		s.free[i] = int32(n - 1 - i)
	}
	s.pages.New = func() any { return new([pageid.Size]byte) }
	s.fcond = sync.NewCond(&s.fmu)
	s.cleanKick = make(chan struct{}, 1)
	s.runBufs.New = func() any { return new([maxRun * pageid.Size]byte) }
	s.runSlots = make(chan struct{}, max(1, n/(4*max(1, runPages(n)))))
	s.claim = func(f int32) bool {
		fr := &s.frames[f]
		if fr.wb.Load() || !fr.mu.TryLock() {
			return false
		}
		if fr.wb.Load() {
			fr.mu.Unlock()
			return false
		}
		return true
	}
	s.claimClean = func(f int32) bool {
		if s.dirty(f) || !s.claim(f) {
			return false
		}
		if s.dirty(f) {
			s.frames[f].mu.Unlock()
			return false
		}
		return true
	}
	for i := range s.shards {
		s.shards[i].m = newIndex(n / nShards)
	}
	s.initAsync()
	return s, nil
}

func (s *Store) shardOf(k pageid.Key) *shard {
	h := uint64(k) * 0x9E3779B97F4A7C15
	return &s.shards[h>>58]
}

func (s *Store) page(f int32) []byte {
	o := int(f) * pageid.Size
	return s.data[o : o+pageid.Size : o+pageid.Size]
}

func (s *Store) lookup(k pageid.Key) (int32, bool) {
	sh := s.shardOf(k)
	sh.mu.Lock()
	f, ok := sh.m.get(k)
	sh.mu.Unlock()
	return f, ok
}

// EachResident calls fn with the key of every page in the cache now.
func (s *Store) EachResident(fn func(pageid.Key)) {
	for f := range s.frames {
		fr := &s.frames[f]
		fr.mu.RLock()
		k, valid := fr.key, fr.valid
		fr.mu.RUnlock()
		if valid {
			fn(k)
		}
	}
}

// Resident reports whether page k is in the cache now.
func (s *Store) Resident(k pageid.Key) bool {
	_, ok := s.lookup(k)
	return ok
}

// copyOut copies page k out of frame f, which the caller has read-locked,
// if f holds it, counting a hit; it unlocks f and reports whether it
// copied.
func (s *Store) copyOut(k pageid.Key, f int32, dst []byte) bool {
	fr := &s.frames[f]
	ok := fr.key == k && fr.valid
	if ok {
		copy(dst, s.page(f))
	}
	fr.mu.RUnlock()
	if ok {
		s.pol.hit(f)
		s.hits.Add(1)
	}
	return ok
}

// getFound is Get of page k, checked, that a lookup just found in frame
// f: one lookup of the index where Resident and Get make two. A frame
// being loaded or evicted, or given to another page since, is left to
// Get.
func (s *Store) getFound(ctx context.Context, k pageid.Key, f int32, dst []byte) error {
	if s.frames[f].mu.TryRLock() && s.copyOut(k, f, dst) {
		return nil
	}
	return s.Get(ctx, k, dst)
}

// nextFrame copies page k into dst if the frame after f holds it: pages
// read in order were often cached in order, and a frame's own key,
// checked under its lock, says what it holds, with no lookup of the
// index, a cache miss of its own for every page of a stream
// (docs/decisions.md, 46).
func (s *Store) nextFrame(k pageid.Key, f int32, dst []byte) bool {
	f++
	return int(f) < len(s.frames) && s.frames[f].mu.TryRLock() && s.copyOut(k, f, dst)
}

// Get copies page k into dst.
func (s *Store) Get(ctx context.Context, k pageid.Key, dst []byte) error {
	if len(dst) != pageid.Size {
		return ErrBadPage
	}
	if err := s.CheckKey(k); err != nil {
		return err
	}
	for {
		if f, ok := s.lookup(k); ok {
			fr := &s.frames[f]
			if !fr.mu.TryRLock() {
				// Being loaded or evicted: wait for whoever holds it.
				s.waits.Add(1)
				fr.mu.RLock()
			}
			if s.copyOut(k, f, dst) {
				return nil
			}
			runtime.Gosched()
			continue
		}
		f, err := s.claimFrame(ctx)
		if errors.Is(err, ErrCacheFull) {
			// Every frame is busy or holds a write the remote refuses for
			// now: read past the cache rather than fail the read.
			s.misses.Add(1)
			s.uncached.Add(1)
			if err := s.load(ctx, k, dst); err != nil {
				return fmt.Errorf("reading page %v: %w", k, err)
			}
			return nil
		}
		if err != nil {
			return fmt.Errorf("reading page %v: %w", k, err)
		}
		if !s.publish(k, f) {
			continue // someone else is loading k; go wait for them
		}
		s.misses.Add(1)
		fr := &s.frames[f]
		if err := s.load(ctx, k, s.page(f)); err != nil {
			s.unpublish(k, f)
			return fmt.Errorf("reading page %v: %w", k, err)
		}
		fr.valid = true
		copy(dst, s.page(f))
		fr.mu.Unlock()
		s.track(f, k)
		return nil
	}
}

func (s *Store) load(ctx context.Context, k pageid.Key, p []byte) error {
	if s.prefetched(k, p) {
		return nil
	}
	s.remoteReads.Add(1)
	return s.remote.ReadPage(ctx, k, p)
}

// Put stores src as page k. The page is written back to the remote on
// eviction or Flush.
func (s *Store) Put(ctx context.Context, k pageid.Key, src []byte) error {
	if len(src) != pageid.Size {
		return ErrBadPage
	}
	if err := s.CheckKey(k); err != nil {
		return err
	}
	return s.modify(ctx, k, fillNone, func(page []byte) { copy(page, src) })
}

// fillMode is what a page that is not cached holds before a write changes it.
type fillMode uint8

const (
	fillNone fillMode = iota // nothing: the write covers the whole page
	fillLoad                 // its content at the remote (or in the Loading Zone)
	fillZero                 // zeroes: the writer knows nothing was ever written there
)

// modify applies fn to page k under the page's write lock and marks it
// dirty. A page that is not cached gets a frame, filled first as how says.
func (s *Store) modify(ctx context.Context, k pageid.Key, how fillMode, fn func(page []byte)) error {
	for {
		if f, ok := s.lookup(k); ok {
			fr := &s.frames[f]
			fr.mu.Lock()
			if fr.key == k && fr.valid {
				fn(s.page(f))
				s.written(f)
				s.pol.hit(f)
				s.hits.Add(1)
				return nil
			}
			fr.mu.Unlock()
			runtime.Gosched()
			continue
		}
		f, err := s.claimFrame(ctx)
		if err != nil {
			return fmt.Errorf("writing page %v: %w", k, err)
		}
		if !s.publish(k, f) {
			continue
		}
		s.misses.Add(1)
		fr := &s.frames[f]
		switch how {
		case fillLoad:
			if err := s.load(ctx, k, s.page(f)); err != nil {
				s.unpublish(k, f)
				return fmt.Errorf("writing page %v: %w", k, err)
			}
		case fillZero:
			s.freshWrites.Add(1)
			clear(s.page(f))
		}
		fn(s.page(f))
		fr.valid = true
		s.written(f)
		s.track(f, k)
		return nil
	}
}

// written ends a write into write-locked frame f: a new version, dirty,
// unlocked.
func (s *Store) written(f int32) {
	k := s.frames[f].key
	s.frames[f].ver++
	s.markDirty(f)
	s.frames[f].mu.Unlock()
	s.invalidate(k.Volume(), k.Page(), k.Page()+1)
}

// publish enters the claimed, write-locked frame f into the index as k. If
// k is already present it releases f and reports false.
func (s *Store) publish(k pageid.Key, f int32) bool {
	sh := s.shardOf(k)
	sh.mu.Lock()
	if !sh.m.add(k, f) {
		sh.mu.Unlock()
		s.releaseFrame(f)
		return false
	}
	sh.mu.Unlock()
	s.frames[f].key = k
	return true
}

// unpublish undoes publish after a failed load.
func (s *Store) unpublish(k pageid.Key, f int32) {
	s.unindex(k, f)
	s.releaseFrame(f)
}

func (s *Store) unindex(k pageid.Key, f int32) {
	sh := s.shardOf(k)
	sh.mu.Lock()
	sh.m.remove(k, f)
	sh.mu.Unlock()
}

// releaseFrame returns a write-locked, unindexed frame to the free list.
func (s *Store) releaseFrame(f int32) {
	fr := &s.frames[f]
	fr.key, fr.valid = 0, false
	s.markClean(f)
	fr.mu.Unlock()
	s.evictMu.Lock()
	s.free = append(s.free, f)
	s.evictMu.Unlock()
}

// track hands a loaded frame to the eviction policy.
func (s *Store) track(f int32, k pageid.Key) {
	s.evictMu.Lock()
	s.pol.insert(f, k)
	s.evictMu.Unlock()
}

// claimFrame returns a frame that is write-locked, unindexed and empty,
// evicting (and writing back) a page if no frame is free.
func (s *Store) claimFrame(ctx context.Context) (int32, error) {
	var waited time.Duration
	var failedAt time.Time // first failed write-back of a victim
	var refused error      // why dirty victims are skipped
	probed := false        // a dirty victim's write-back was tried after a refusal
	if r := s.wbRefused.Load(); r != nil && time.Since(r.at) < wbRefusedFor {
		refused = r.err
		if s.ndirty.Load() >= int64(len(s.frames)) {
			// Every page is dirty: one write-back tells whether the
			// remote takes them again.
			refused, probed = nil, true
		}
	}
	for attempt := 0; ; attempt++ {
		claim := s.claim
		if refused != nil {
			claim = s.claimClean
		}
		f, free := s.takeVictim(claim, 0)
		if free {
			return f, nil
		}
		if f < 0 && refused != nil {
			if !probed {
				// No clean page: try a dirty one's write-back once, in
				// case the remote takes them again.
				refused, probed = nil, true
				continue
			}
			return -1, fmt.Errorf("%w: no clean page: %w", ErrCacheFull, refused)
		}
		if f < 0 {
			// Every frame is busy (being loaded, read, or flushed). That
			// passes within a round trip; wait with backoff, bounded.
			if attempt < 8 {
				runtime.Gosched()
				continue
			}
			d := min(time.Duration(attempt)*20*time.Microsecond, 5*time.Millisecond)
			if waited += d; waited > maxClaimWait {
				return -1, ErrCacheFull
			}
			t := time.NewTimer(d)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return -1, ctx.Err()
			}
			continue
		}
		fr := &s.frames[f]
		if !fr.valid {
			// Discarded (trimmed) page: nothing to write back or unindex.
			return f, nil
		}
		k := fr.key
		if s.dirty(f) {
			s.kickWriteback()
			pg := s.page(f)
			if err := s.remote.WritePages(ctx, []pageid.Key{k}, [][]byte{pg}); err != nil {
				// Keep the page: it is the only copy of an acknowledged write.
				fr.mu.Unlock()
				s.track(f, k)
				s.wbFailures.Add(1)
				if failedAt.IsZero() {
					failedAt = time.Now()
				}
				if !s.retryable(err) && ctx.Err() == nil {
					// A read must not fail because a write-back did: evict
					// a clean page instead.
					refused = fmt.Errorf("writing back page %v: %w", k, err)
					s.wbRefused.Store(&refusal{at: time.Now(), err: refused})
					continue
				}
				if !s.retryable(err) || time.Since(failedAt) >= s.opt.RetryFor {
					return -1, fmt.Errorf("writing back page %v: %w", k, err)
				}
				if err := sleepCtx(ctx, retryBackoff); err != nil {
					return -1, err
				}
				continue
			}
			s.writeBacks.Add(1)
			s.evictWBs.Add(1)
			s.writeBacksTaken()
			s.markClean(f)
		}
		s.evicted(f, k)
		return f, nil
	}
}

// takeVictim takes a free frame (free is true) or, failing that, the
// policy's victim among the frames claim accepts (-1 if none, if claim is
// nil, or after tries failed claims when tries > 0); either comes
// write-locked.
func (s *Store) takeVictim(claim func(int32) bool, tries int) (f int32, free bool) {
	s.evictMu.Lock()
	if n := len(s.free); n > 0 {
		f := s.free[n-1]
		s.free = s.free[:n-1]
		s.evictMu.Unlock()
		s.frames[f].mu.Lock()
		return f, true
	}
	if claim == nil {
		s.evictMu.Unlock()
		return -1, false
	}
	f = s.pol.victim(claim, tries)
	s.evictMu.Unlock()
	return f, false
}

// Stats returns a snapshot of the counters.
func (s *Store) Stats() Stats {
	st := Stats{
		Hits: s.hits.Load(), Misses: s.misses.Load(), PrefetchHits: s.lzHits.Load(),
		RemoteReads: s.remoteReads.Load(), AsyncLoads: s.asyncLoads.Load(), Evictions: s.evictions.Load(),
		WriteBacks: s.writeBacks.Load(), SharedMissesWaiting: s.waits.Load(),
		WritebackFailures: s.wbFailures.Load(), EvictionWriteBacks: s.evictWBs.Load(),
		FreshWrites: s.freshWrites.Load(), Frames: len(s.frames), UncachedReads: s.uncached.Load(),
		ReadAheadPages: s.ra.placed.Load(), ReadAheadHits: s.ra.hits.Load(), ReadAheadDropped: s.ra.dropped.Load(),
		ShadowPages: s.shadow.pages.Load(),
	}
	st.DirtyPages = s.dirtyCount()
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		st.ResidentPages += sh.m.len()
		sh.mu.Unlock()
	}
	return st
}

// Check verifies the cache's internal consistency: every indexed frame
// holds its key, indexed + free + loading frames account for all frames.
// Call it when the store is quiescent (tests call it in cleanup).
func (s *Store) Check() error {
	s.evictMu.Lock()
	defer s.evictMu.Unlock()
	seen := make([]bool, len(s.frames))
	indexed := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		for k, f := range sh.m.all() {
			if g, ok := sh.m.get(k); !ok || g != f {
				sh.mu.Unlock()
				return fmt.Errorf("pagestore: index holds %v (frame %d) where a lookup cannot find it", k, f)
			}
			fr := &s.frames[f]
			if fr.key != k || !fr.valid {
				sh.mu.Unlock()
				return fmt.Errorf("pagestore: index maps %v to frame %d holding %v (valid=%v)", k, f, fr.key, fr.valid)
			}
			if seen[f] {
				sh.mu.Unlock()
				return fmt.Errorf("pagestore: frame %d indexed twice", f)
			}
			seen[f] = true
			indexed++
		}
		sh.mu.Unlock()
	}
	dirty := 0
	for i := range s.frames {
		if s.frames[i].wb.Load() {
			return fmt.Errorf("pagestore: frame %d still marked as being flushed", i)
		}
		if s.dirty(int32(i)) {
			dirty++
		}
	}
	if n := s.dirtyCount(); n != dirty {
		return fmt.Errorf("pagestore: %d dirty frames counted, %d marked", n, dirty)
	}
	for _, f := range s.free {
		if seen[f] {
			return fmt.Errorf("pagestore: frame %d both free and indexed", f)
		}
		if s.dirty(f) {
			return fmt.Errorf("pagestore: free frame %d is dirty", f)
		}
		seen[f] = true
	}
	discarded := 0
	for i := range s.frames {
		if !seen[i] {
			fr := &s.frames[i]
			if fr.valid || s.dirty(int32(i)) {
				return fmt.Errorf("pagestore: frame %d neither indexed nor free but holds a page", i)
			}
			discarded++
		}
	}
	if n := s.pol.size(); n != indexed+discarded {
		return fmt.Errorf("pagestore: policy tracks %d frames, index holds %d and %d are discarded", n, indexed, discarded)
	}
	return nil
}
