package memnode

import (
	"crypto/subtle"
	"encoding/binary"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/pd3-go/pd3/pageid"
)

// Store is the memory of a node: named volumes of lazily allocated chunks.
// It is safe for concurrent use; the server calls it from one goroutine per
// connection.
type Store struct {
	capacity uint64 // bytes of chunk memory allowed; 0 = unlimited
	used     atomic.Uint64

	// mu guards the volume tables; chunk data has its own locks.
	mu     sync.RWMutex
	byName map[string]*volume
	byID   map[uint16]*volume
	nextID uint16

	persist *persister // nil: memory only

	// reclaim gives freed chunks' memory back to the OS (reclaim.go).
	reclaim reclaimer

	// Test hooks (nil in production): afterFenceCheck runs in a fenced
	// write between its token check and its mutation, beforeRaise when a
	// raise of a fence to token starts.
	afterFenceCheck func()
	beforeRaise     func(token uint64)
}

type volume struct {
	info   pageid.VolumeInfo // ID and Name; Size is in size
	chunks *chunkTable
	// size is the volume's size in bytes; RESIZE grows it after the
	// chunk table, so a request checked against it indexes the table.
	size atomic.Uint64
	// stored is the bytes of chunk memory the volume holds (VolumeInfo.Stored).
	stored atomic.Uint64
	// deleted is set when the volume is removed, so that requests that
	// looked it up before the delete do not resurrect chunks.
	deleted atomic.Bool
	// fence is the newest fencing token a writer presented (0: none yet);
	// writes through a window with an older token are refused.
	fence atomic.Uint64
	// fenceMu makes a write's token check and its copy one step with
	// respect to a raise of the fence: writes hold it shared from the
	// check until their bytes are in place, a raise holds it exclusive
	// while it stores the new token. A write that passed its check
	// before a newer holder presented its token has landed before that
	// holder's BIND is answered, never after. Lock order: fenceMu, then
	// Store.mu, then a chunk's mu.
	fenceMu sync.RWMutex
}

// chunk is ChunkSize bytes allocated on first write. Its lock makes one
// request's bytes atomic with respect to another's, as an RDMA NIC does for
// a single verb on one cache line; across chunks there is no atomicity.
type chunk struct {
	mu    sync.RWMutex
	data  []byte      // nil until written
	sums  []uint32    // each page's checksum (sums.go); allocated with data
	dirty atomic.Bool // changed since the last checkpoint (persistent stores)
}

// NewStore returns an empty store that allocates at most capacity bytes of
// chunk memory (0: no limit).
func NewStore(capacity uint64) *Store {
	return &Store{
		capacity: capacity,
		byName:   make(map[string]*volume),
		byID:     make(map[uint16]*volume),
		nextID:   1,
	}
}

// Used reports the bytes of chunk memory allocated.
func (s *Store) Used() uint64 { return s.used.Load() }

// Reclaims counts the times freed chunks' memory was given back to the
// operating system (reclaim.go).
func (s *Store) Reclaims() uint64 { return s.reclaim.runs.Load() }

// Capacity is the most bytes of chunk memory the store allocates (0:
// unlimited).
func (s *Store) Capacity() uint64 { return s.capacity }

// span runs fn on each chunk-sized piece of the n bytes at off of volume
// id, after checking the range. Without alloc, c is nil for a hole of a
// sparse volume.
func (s *Store) span(id uint16, off uint64, p []byte, alloc bool, fn func(v *volume, c *chunk, at, co uint64, q []byte) error) error {
	v, err := s.volume(id)
	if err != nil {
		return err
	}
	if err := v.check(off, uint64(len(p))); err != nil {
		return err
	}
	for len(p) > 0 {
		co := off % ChunkSize
		n := min(uint64(len(p)), ChunkSize-co)
		if err := fn(v, v.chunks.get(off/ChunkSize, alloc), off, co, p[:n]); err != nil {
			return fmt.Errorf("%d bytes at %d of volume %q: %w", len(p), off, v.info.Name, err)
		}
		p = p[n:]
		off += n
	}
	return nil
}

// ReadAt copies len(p) bytes at off of volume id into p. Unwritten bytes
// read as zeroes.
func (s *Store) ReadAt(id uint16, off uint64, p []byte) error {
	return s.span(id, off, p, false, func(_ *volume, c *chunk, _, co uint64, q []byte) error {
		if c == nil {
			clear(q)
			return nil
		}
		c.mu.RLock()
		defer c.mu.RUnlock()
		if c.data == nil {
			clear(q)
			return nil
		}
		if err := c.verifyLocked(co, uint64(len(q))); err != nil {
			return err
		}
		copy(q, c.data[co:])
		return nil
	})
}

// Allocated appends to b a bitmap of the chunks under the n bytes at off
// of volume id, one bit per chunk from the one holding off, lowest bit
// first: set if the chunk holds memory (written since it was last freed).
// A clear bit's bytes read as zeroes; a set bit's may too (partly trimmed,
// or written with zeroes).
func (s *Store) Allocated(id uint16, off, n uint64, b []byte) ([]byte, error) {
	v, err := s.volume(id)
	if err != nil {
		return b, err
	}
	if n > MaxMap {
		return b, fmt.Errorf("%w: a map of %d bytes", ErrTooLarge, n)
	}
	if err := v.checkRange(off, n); err != nil {
		return b, err
	}
	if n == 0 {
		return b, nil
	}
	first, last := off/ChunkSize, (off+n-1)/ChunkSize
	at := len(b)
	b = append(b, make([]byte, (last-first)/8+1)...)
	for i := first; i <= last; i++ {
		if j := v.chunks.holeEnd(i); j > i {
			i = j - 1 // a missing segment of a sparse volume
			continue
		}
		c := v.chunks.get(i, false)
		if c == nil {
			continue
		}
		c.mu.RLock()
		if c.data != nil {
			b[at+int((i-first)/8)] |= 1 << ((i - first) % 8)
		}
		c.mu.RUnlock()
	}
	return b, nil
}

// WriteAt copies p to off of volume id, allocating chunks as needed; on a
// persistent store it returns once the write is on stable storage.
func (s *Store) WriteAt(id uint16, off uint64, p []byte) error {
	seq, err := s.write(id, off, p)
	if err == nil {
		err = s.Durable(seq)
	}
	return err
}

// admit refuses a mutation that carries data while a persistent store's
// disk is full (pageid.ErrNoSpace), before it changes anything.
func (s *Store) admit() error {
	if s.persist == nil || s.persist.log == nil {
		return nil
	}
	return s.persist.log.admit()
}

// write applies p and, on a persistent store, logs it (one entry per chunk,
// appended under the chunk's lock so the log orders writes to a chunk as
// memory does). It returns the sequence number to wait for.
func (s *Store) write(id uint16, off uint64, p []byte) (uint64, error) {
	return s.change(id, off, p, false, func(d, q []byte) { copy(d, q) })
}

// XorAt adds p to the bytes at off of volume id by exclusive or; on a
// persistent store it returns once the change is on stable storage.
func (s *Store) XorAt(id uint16, off uint64, p []byte) error {
	seq, err := s.xor(id, off, p)
	if err == nil {
		err = s.Durable(seq)
	}
	return err
}

// xor is write for OpXor. Every page it touches is checked first (a
// corrupt page is refused, not changed and sealed), and the log holds the
// bytes that result, so a replay writes them again unchanged.
func (s *Store) xor(id uint16, off uint64, p []byte) (uint64, error) {
	return s.change(id, off, p, true, func(d, q []byte) { subtle.XORBytes(d, d, q) })
}

// change sets the len(p) bytes at off with apply(bytes, p's part), chunk
// by chunk under each chunk's lock, reseals them and logs what they
// became. The pages about to change are checked first: all of them with
// whole, else those it changes in part.
func (s *Store) change(id uint16, off uint64, p []byte, whole bool, apply func(d, q []byte)) (uint64, error) {
	if err := s.admit(); err != nil {
		return 0, err
	}
	var seq uint64
	err := s.span(id, off, p, true, func(v *volume, c *chunk, at, co uint64, q []byte) error {
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.data == nil {
			if err := s.allocLocked(v, c); err != nil {
				return err
			}
		} else if whole {
			if err := c.verifyLocked(co, uint64(len(q))); err != nil {
				return err
			}
		} else if err := c.verifyPartialLocked(co, uint64(len(q))); err != nil {
			return err
		}
		d := c.data[co : co+uint64(len(q))]
		apply(d, q)
		c.sealLocked(co, uint64(len(q)))
		return s.logLocked(c, opLogWrite, v.info.ID, at, 0, d, &seq)
	})
	return seq, err
}

// apply writes without logging: loading page files (dirty false: the
// bytes are already there) and replaying the log (dirty true: the next
// checkpoint must write them before the log that holds them is deleted).
func (s *Store) apply(id uint16, off uint64, p []byte, dirty bool) error {
	return s.span(id, off, p, true, func(v *volume, c *chunk, _, co uint64, q []byte) error {
		c.mu.Lock()
		defer c.mu.Unlock()
		if err := s.allocLocked(v, c); err != nil {
			return err
		}
		copy(c.data[co:], q)
		c.sealLocked(co, uint64(len(q)))
		if dirty {
			c.dirty.Store(true)
		}
		return nil
	})
}

// logLocked appends a mutation of chunk c (its lock held) to the log and
// marks the chunk for the next checkpoint.
func (s *Store) logLocked(c *chunk, op byte, vol uint16, at, count uint64, payload []byte, seq *uint64) error {
	if s.persist == nil {
		return nil
	}
	c.dirty.Store(true)
	n, err := s.persist.log.append(op, vol, at, count, payload)
	if err != nil {
		return err
	}
	*seq = n
	if n%1024 == 0 {
		s.maybeCheckpoint()
	}
	return nil
}

// allocLocked gives c its memory; c.mu must be held for writing.
func (s *Store) allocLocked(v *volume, c *chunk) error {
	if c.data != nil {
		return nil
	}
	if v.deleted.Load() {
		return pageid.ErrNoVolume
	}
	for {
		u := s.used.Load()
		if s.capacity != 0 && u+ChunkSize > s.capacity {
			return pageid.ErrNoMemory
		}
		if s.used.CompareAndSwap(u, u+ChunkSize) {
			break
		}
	}
	c.data = make([]byte, ChunkSize)
	c.sums = make([]uint32, pagesPerChunk)
	v.stored.Add(ChunkSize)
	return nil
}

// raiseFence makes token the volume's fence unless a newer one is there;
// it reports false for a token older than the fence (its holder has been
// superseded). Raises are rare and serialised under mu; one is saved with
// the volume table before it counts, so a persistent node that restarts
// still refuses the superseded writer.
func (s *Store) raiseFence(v *volume, token uint64) (bool, error) {
	if s.beforeRaise != nil {
		s.beforeRaise(token)
	}
	v.fenceMu.Lock() // wait for the writes that passed the old fence
	s.mu.Lock()
	cur := v.fence.Load()
	var tok uint64
	var err error
	if token > cur {
		v.fence.Store(token)
		tok, err = s.logTableLocked(opLogFence, v.info.ID, 0, token, v.info.Name)
	}
	s.mu.Unlock()
	v.fenceMu.Unlock()
	switch {
	case token < cur:
		return false, nil
	case token > cur && err == nil:
		err = s.Durable(tok)
	}
	return true, err
}

// fenced runs write, a mutation of v through a window holding token, if
// token is not older than v's fence; the check and the mutation are one
// step with respect to raiseFence (volume.fenceMu).
func (s *Store) fenced(v *volume, token uint64, write func() error) error {
	v.fenceMu.RLock()
	defer v.fenceMu.RUnlock()
	if token < v.fence.Load() {
		return fmt.Errorf("volume %q: token %d: %w", v.info.Name, token, pageid.ErrFenced)
	}
	if s.afterFenceCheck != nil {
		s.afterFenceCheck()
	}
	return write()
}

// Fence returns the volume's fencing token (0: none presented yet).
func (s *Store) Fence(id uint16) (uint64, error) {
	v, err := s.volume(id)
	if err != nil {
		return 0, err
	}
	return v.fence.Load(), nil
}

// current is v's info with the memory it holds now.
func (v *volume) current() pageid.VolumeInfo {
	info := v.info
	info.Size = v.size.Load()
	info.Stored = v.stored.Load()
	return info
}

func (s *Store) freeChunk(c *chunk) {
	c.mu.Lock()
	freed := c.data != nil
	if freed {
		c.data, c.sums = nil, nil
		s.used.Add(^uint64(ChunkSize - 1))
	}
	c.mu.Unlock()
	if freed {
		s.reclaim.freedChunk()
	}
}

// Trim zeroes n bytes at off; chunks covered entirely are freed. On a
// persistent store it returns once the trim is on stable storage.
func (s *Store) Trim(id uint16, off, n uint64) error {
	seq, err := s.trim(id, off, n, true)
	if err == nil {
		err = s.Durable(seq)
	}
	return err
}

func (s *Store) applyTrim(id uint16, off, n uint64) error {
	_, err := s.trim(id, off, n, false)
	return err
}

func (s *Store) trim(id uint16, off, n uint64, log bool) (uint64, error) {
	if log {
		if err := s.admit(); err != nil {
			return 0, err
		}
	}
	v, err := s.volume(id)
	if err != nil {
		return 0, err
	}
	if err := v.checkRange(off, n); err != nil {
		return 0, fmt.Errorf("trim: %w", err)
	}
	size := v.size.Load()
	var seq uint64
	end := off + n
	for off < end {
		co := off % ChunkSize
		m := min(end-off, ChunkSize-co)
		c := v.chunks.get(off/ChunkSize, false)
		if c == nil { // a hole: nothing to free or log
			off += m
			if next := v.chunks.holeEnd(off / ChunkSize); next*ChunkSize > off {
				off = min(next*ChunkSize, end)
			}
			continue
		}
		// The last chunk of a volume may be short; covering up to the
		// volume's end counts as covering the chunk.
		chunkEnd := min(ChunkSize, size-(off-co))
		c.mu.Lock()
		if co == 0 && m >= chunkEnd {
			if c.data != nil {
				c.data, c.sums = nil, nil
				s.used.Add(^uint64(ChunkSize - 1))
				v.stored.Add(^uint64(ChunkSize - 1))
				s.reclaim.freedChunk()
			}
		} else if c.data != nil {
			if err := c.verifyPartialLocked(co, m); err != nil {
				c.mu.Unlock()
				return 0, fmt.Errorf("trim of %d bytes at %d of volume %q: %w", m, off, v.info.Name, err)
			}
			clear(c.data[co : co+m])
			c.sealLocked(co, m)
		}
		if log {
			if err := s.logLocked(c, opLogTrim, id, off, m, nil, &seq); err != nil {
				c.mu.Unlock()
				return 0, err
			}
		} else if s.persist != nil {
			c.dirty.Store(true) // replayed: the page file must learn it
		}
		c.mu.Unlock()
		off += m
	}
	return seq, nil
}

// atomic8 runs f on the 8-byte little-endian word at off and returns the
// word's previous value.
func (s *Store) atomic8(id uint16, off uint64, lastSeq *uint64, f func(old uint64) uint64) (uint64, error) {
	v, err := s.volume(id)
	if err != nil {
		return 0, err
	}
	if off%8 != 0 {
		return 0, fmt.Errorf("%w: offset %d", ErrMisaligned, off)
	}
	if err := v.check(off, 8); err != nil {
		return 0, err
	}
	c := v.chunks.get(off/ChunkSize, true)
	co := off % ChunkSize
	c.mu.Lock()
	defer c.mu.Unlock()
	var old uint64
	if c.data != nil {
		if err := c.verifyLocked(co, 8); err != nil {
			return 0, err
		}
		old = binary.LittleEndian.Uint64(c.data[co:])
	}
	nw := f(old)
	if nw == old {
		return old, nil
	}
	if err := s.allocLocked(v, c); err != nil {
		return 0, err
	}
	binary.LittleEndian.PutUint64(c.data[co:], nw)
	c.sealLocked(co, 8)
	var seq uint64
	if err := s.logLocked(c, opLogWrite, id, off, 0, c.data[co:co+8], &seq); err != nil {
		return 0, err
	}
	*lastSeq = seq
	return old, nil
}

// CompareAndSwap stores new at off if the word there equals old; it returns
// the word's previous value either way.
func (s *Store) CompareAndSwap(id uint16, off, old, new uint64) (uint64, error) {
	var seq uint64
	prev, err := s.atomic8(id, off, &seq, func(cur uint64) uint64 {
		if cur == old {
			return new
		}
		return cur
	})
	if err == nil {
		err = s.Durable(seq)
	}
	return prev, err
}

// FetchAndAdd adds delta to the word at off and returns its previous value.
func (s *Store) FetchAndAdd(id uint16, off, delta uint64) (uint64, error) {
	var seq uint64
	prev, err := s.atomic8(id, off, &seq, func(cur uint64) uint64 { return cur + delta })
	if err == nil {
		err = s.Durable(seq)
	}
	return prev, err
}

// Check verifies the store's accounting; tests call it in cleanup.
func (s *Store) Check() error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	var n uint64
	for id, v := range s.byID {
		if v.info.ID != id || s.byName[v.info.Name] != v {
			return fmt.Errorf("memnode: volume tables disagree on %d/%q", id, v.info.Name)
		}
		var held uint64
		v.chunks.each(func(_ uint64, c *chunk) {
			c.mu.RLock()
			if c.data != nil {
				held += ChunkSize
			}
			c.mu.RUnlock()
		})
		if st := v.stored.Load(); st != held {
			return fmt.Errorf("memnode: volume %q counts %d bytes stored but its chunks hold %d", v.info.Name, st, held)
		}
		n += held
	}
	if len(s.byName) != len(s.byID) {
		return fmt.Errorf("memnode: %d names for %d ids", len(s.byName), len(s.byID))
	}
	if u := s.used.Load(); u != n {
		return fmt.Errorf("memnode: used=%d but chunks hold %d", u, n)
	}
	return nil
}
