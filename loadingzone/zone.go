package loadingzone

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/pd3-go/pd3/internal/shm"
	"github.com/pd3-go/pd3/pageid"
)

// Layout of the shared region (all words little-endian, 8-aligned):
//
//	header, 4096 bytes
//	  0   magic
//	  8   records (N)
//	  16  index entries (M)
//	  24  epoch: the producer's incarnation; consumers ignore a zone whose
//	      epoch is not the one they attached to
//	  32  tail: records ever produced (slot = tail mod N)
//	  40  heartbeat: producer liveness counter
//	index, M words in buckets of 4: (slot+1)<<40 | tag<<24 | low 24 bits
//	      of the record's generation, 0 = empty; tag is 16 bits of the
//	      key's hash. Key k may sit in any entry of buckets b1(k), b2(k).
//	records, N × (64-byte header + 4096 data)
//	  0   state: generation<<8 | Empty/Writing/Produced/Consumed/Dropped
//	  8   key
//
// A record's data may only be trusted by a consumer that saw the record
// Produced with a generation, copied the data, and then moved the state
// from exactly that value to Consumed with a CAS: the producer changes the
// state (and bumps the generation) before touching the data, so a CAS that
// succeeds proves the copy was not torn and nobody else consumed it.

const (
	magic      = 0x5044334c5a4f4e45 // "PD3LZONE"
	headerSize = 4096
	recHeader  = 64
	recSize    = recHeader + pageid.Size

	offMagic     = 0
	offRecords   = 8
	offIndex     = 16
	offEpoch     = 24
	offTail      = 32
	offHeartbeat = 40
)

// Record states.
const (
	stEmpty    = 0
	stWriting  = 1
	stProduced = 2
	stConsumed = 3
	stDropped  = 4
)

// ErrLayout is returned when a region does not hold a Loading Zone.
var ErrLayout = errors.New("loadingzone: region is not a loading zone")

// Size returns the bytes a zone of n records needs.
func Size(n int) int { return headerSize + indexWords(n)*8 + n*recSize }

func indexWords(n int) int {
	m := 1
	for m < 4*n {
		m <<= 1
	}
	return m
}

// Zone is a Loading Zone over a shared byte region: one producer (the
// transfer engine; Place and Invalidate are serialised by a mutex so the
// engine may call them from several goroutines), any number of consumers
// (CheckAndReturn, lock-free and non-blocking).
type Zone struct {
	b       []byte
	n       uint64
	imask   uint64
	recBase int
	idxBase int

	epoch *atomic.Uint64
	tail  *atomic.Uint64
	beat  *atomic.Uint64

	// OnDrop, if set, is told the key of every record reclaimed before it
	// was consumed (so Host View can forget it). Called with the producer
	// lock held.
	OnDrop func(key uint64)

	pmu sync.Mutex // serialises producers

	// Counters.
	Placed, Hits, Misses, DroppedUnconsumed, Invalidated, IndexLost atomic.Uint64
}

// Format initialises b (at least Size(n) bytes, zeroed) as an empty zone of
// n records with the given epoch and returns it.
func Format(b []byte, n int, epoch uint64) (*Zone, error) {
	if n < 1 || len(b) < Size(n) {
		return nil, fmt.Errorf("loadingzone: %d bytes cannot hold %d records (need %d)", len(b), n, Size(n))
	}
	shm.U64(b, offRecords).Store(uint64(n))
	shm.U64(b, offIndex).Store(uint64(indexWords(n)))
	shm.U64(b, offEpoch).Store(epoch)
	shm.U64(b, offMagic).Store(magic)
	return Attach(b)
}

// Attach opens a zone formatted (possibly by another process) in b.
func Attach(b []byte) (*Zone, error) {
	if len(b) < headerSize || shm.U64(b, offMagic).Load() != magic {
		return nil, ErrLayout
	}
	n := shm.U64(b, offRecords).Load()
	m := shm.U64(b, offIndex).Load()
	if n == 0 || m == 0 || m&(m-1) != 0 || uint64(len(b)) < uint64(Size(int(n))) || m != uint64(indexWords(int(n))) {
		return nil, fmt.Errorf("%w: %d records, %d index words in %d bytes", ErrLayout, n, m, len(b))
	}
	z := &Zone{
		b: b, n: n, imask: m - 1,
		idxBase: headerSize,
		recBase: headerSize + int(m)*8,
		epoch:   shm.U64(b, offEpoch),
		tail:    shm.U64(b, offTail),
		beat:    shm.U64(b, offHeartbeat),
	}
	return z, nil
}

// Records is the zone's capacity.
func (z *Zone) Records() int { return int(z.n) }

// Epoch is the producer incarnation the zone was formatted with.
func (z *Zone) Epoch() uint64 { return z.epoch.Load() }

// Tail is the number of records ever produced.
func (z *Zone) Tail() uint64 { return z.tail.Load() }

// Beat advances the producer's heartbeat; Heartbeat reads it.
func (z *Zone) Beat()             { z.beat.Add(1) }
func (z *Zone) Heartbeat() uint64 { return z.beat.Load() }

func (z *Zone) state(slot uint64) *atomic.Uint64 { return shm.U64(z.b, z.recBase+int(slot)*recSize) }
func (z *Zone) key(slot uint64) *atomic.Uint64   { return shm.U64(z.b, z.recBase+int(slot)*recSize+8) }
func (z *Zone) data(slot uint64) []byte {
	o := z.recBase + int(slot)*recSize + recHeader
	return z.b[o : o+pageid.Size : o+pageid.Size]
}
func (z *Zone) idx(i uint64) *atomic.Uint64 { return shm.U64(z.b, z.idxBase+int(i)*8) }

func mix(k uint64) uint64 {
	k ^= k >> 31
	k *= 0x7fb5d329728ea185
	k ^= k >> 27
	k *= 0x81dadef4bc2dd44d
	k ^= k >> 33
	return k
}

const bucketWords = 4

// candidates returns the first index word of k's two buckets and k's tag.
func (z *Zone) candidates(k uint64) (b1, b2, tag uint64) {
	h := mix(k)
	nb := (z.imask + 1) / bucketWords
	b1 = (h % nb) * bucketWords
	b2 = ((h >> 32) % nb) * bucketWords
	return b1, b2, h >> 48
}

func entry(slot, tag, gen uint64) uint64 { return (slot+1)<<40 | tag<<24 | gen&0xffffff }

// live reports whether index entry e points at a record that is Produced
// with e's generation; it returns the slot and the record's state.
func (z *Zone) live(e uint64) (slot, st uint64, ok bool) {
	if e == 0 {
		return 0, 0, false
	}
	slot = e>>40 - 1
	if slot >= z.n {
		return 0, 0, false
	}
	st = z.state(slot).Load()
	return slot, st, st&0xff == stProduced && (st>>8)&0xffffff == e&0xffffff
}

// each calls f on the 8 index positions of k's buckets until f says stop.
func (z *Zone) each(k uint64, f func(i, tag uint64) bool) {
	b1, b2, tag := z.candidates(k)
	for _, b := range [2]uint64{b1, b2} {
		for i := b; i < b+bucketWords; i++ {
			if !f(i, tag) {
				return
			}
		}
		if b1 == b2 {
			return
		}
	}
}

// CheckAndReturn copies the prefetched page k into dst (pageid.Size bytes) and
// returns pageid.Size, consuming the record; it returns 0 if the zone does not
// hold k. It never blocks and never returns a torn or reclaimed page.
func (z *Zone) CheckAndReturn(k uint64, dst []byte) int {
	b1, b2, tag := z.candidates(k)
	for _, b := range [2]uint64{b1, b2} {
		for i := b; i < b+bucketWords; i++ {
			e := z.idx(i).Load()
			if (e>>24)&0xffff != tag {
				continue
			}
			slot, st, ok := z.live(e)
			if !ok || z.key(slot).Load() != k {
				continue
			}
			copy(dst[:pageid.Size], z.data(slot))
			if z.state(slot).CompareAndSwap(st, st&^0xff|stConsumed) {
				z.Hits.Add(1)
				return pageid.Size
			}
		}
	}
	z.Misses.Add(1)
	return 0
}

// Place produces page as key k, reclaiming the oldest record. If that record
// was never consumed it is dropped and OnDrop is told. The index entry is
// published before Tail moves.
//
// The producer keeps at most one index entry per record, the one of its
// current generation: reclaiming a record clears its entry. With 4 index
// words per record at least three quarters of the index are then zero,
// so Place finds a free position without reading any record's state (a
// cache miss each, in a zone of megabytes) unless a position holds k's
// tag.
func (z *Zone) Place(k uint64, page []byte) {
	z.pmu.Lock()
	defer z.pmu.Unlock()
	t := z.tail.Load()
	slot := t % z.n
	sw := z.state(slot)
	st := sw.Load()
	if st&0xff == stProduced && sw.CompareAndSwap(st, st&^0xff|stDropped) {
		z.DroppedUnconsumed.Add(1)
		if z.OnDrop != nil {
			z.OnDrop(z.key(slot).Load())
		}
	}
	if st&0xff != stEmpty {
		z.unindex(z.key(slot).Load(), slot)
	}
	gen := st>>8 + 1
	sw.Store(gen<<8 | stWriting)
	z.key(slot).Store(k)
	copy(z.data(slot), page[:pageid.Size])
	sw.Store(gen<<8 | stProduced)

	// Publish. An older record of the same key is superseded silently
	// (its key stays in Host View through this one). The entry goes to
	// a free position of whichever of k's two buckets has more of them
	// (two-choice balancing keeps overflow negligible); if all 8 hold
	// other live keys, the first one's record becomes unreachable
	// (counted; when reclaimed, OnDrop tells Host View).
	// One pass finds the free positions and clears the entry of an older
	// record of k, which frees its position too.
	b1, b2, tag := z.candidates(k)
	free, first := z.positions(b1, b2, func(i, e uint64) bool {
		if e != 0 && (e>>24)&0xffff == tag {
			if old, ost, ok := z.live(e); ok && old != slot && z.key(old).Load() == k {
				z.state(old).CompareAndSwap(ost, ost&^0xff|stDropped)
				z.idx(i).Store(0)
				return true
			}
		}
		return e == 0
	})
	if free[0] == 0 && free[1] == 0 {
		// Entries of records no longer live (consumed or dropped, not yet
		// reclaimed) may be taken.
		free, first = z.positions(b1, b2, func(_, e uint64) bool {
			_, _, ok := z.live(e)
			return !ok
		})
	}
	pos := b1
	switch {
	case free[0] >= free[1] && free[0] > 0:
		pos = first[0]
	case free[1] > 0:
		pos = first[1]
	default:
		z.IndexLost.Add(1)
	}
	z.idx(pos).Store(entry(slot, tag, gen))
	z.tail.Store(t + 1)
	z.Placed.Add(1)
}

// positions counts, in each of buckets b1 and b2, the index positions i
// whose entry e take says may be taken, and returns the lowest of each.
func (z *Zone) positions(b1, b2 uint64, take func(i, e uint64) bool) (n [2]int, first [2]uint64) {
	for x, b := range [2]uint64{b1, b2} {
		for i := b + bucketWords - 1; ; i-- {
			if take(i, z.idx(i).Load()) {
				n[x]++
				first[x] = i
			}
			if i == b {
				break
			}
		}
	}
	return n, first
}

// unindex clears the index entry of record slot, which held key k, if it
// still has one; the producer lock is held.
func (z *Zone) unindex(k, slot uint64) {
	b1, b2, _ := z.candidates(k)
	for _, b := range [2]uint64{b1, b2} {
		for i := b; i < b+bucketWords; i++ {
			if e := z.idx(i).Load(); e != 0 && e>>40-1 == slot {
				z.idx(i).Store(0)
				return
			}
		}
	}
}

// Invalidate drops any produced record of k, so a later CheckAndReturn
// cannot return it. The transfer engine calls it before a write-back of k
// is sent.
func (z *Zone) Invalidate(k uint64) bool {
	z.pmu.Lock()
	defer z.pmu.Unlock()
	return z.invalidateLocked(k)
}

// InvalidateRange is Invalidate of every key in [lo, hi) with a produced
// record, for ranges with more keys than the zone has records (a file
// trimmed past its size): one pass over the records. It calls dropped
// (if not nil) with each key it dropped.
func (z *Zone) InvalidateRange(lo, hi uint64, dropped func(k uint64)) {
	z.pmu.Lock()
	defer z.pmu.Unlock()
	for s := uint64(0); s < z.n; s++ {
		if z.state(s).Load()&0xff != stProduced {
			continue
		}
		if k := z.key(s).Load(); k >= lo && k < hi && z.invalidateLocked(k) && dropped != nil {
			dropped(k)
		}
	}
}

// invalidateLocked is Invalidate with the producer lock held.
func (z *Zone) invalidateLocked(k uint64) bool {
	dropped := false
	z.each(k, func(i, tag uint64) bool {
		e := z.idx(i).Load()
		if (e>>24)&0xffff != tag {
			return true
		}
		slot, st, ok := z.live(e)
		if !ok || z.key(slot).Load() != k {
			return true
		}
		if z.state(slot).CompareAndSwap(st, st&^0xff|stDropped) {
			dropped = true
			z.Invalidated.Add(1)
		}
		z.idx(i).Store(0)
		return true
	})
	return dropped
}

// Unconsumed counts records currently Produced (for tests and gauges).
func (z *Zone) Unconsumed() int {
	n := 0
	for s := uint64(0); s < z.n; s++ {
		if z.state(s).Load()&0xff == stProduced {
			n++
		}
	}
	return n
}

// Check verifies the zone's invariants: states are known, no two
// reachable index entries name the same record, and every reachable
// produced record holds a key that maps to that index position. Call it
// when the zone is quiescent.
func (z *Zone) Check() error {
	seen := map[uint64]uint64{}
	for i := uint64(0); i <= z.imask; i++ {
		e := z.idx(i).Load()
		if e == 0 {
			continue
		}
		// At most one entry per record, of its current generation: what
		// lets Place skip reading records' states.
		named := e>>40 - 1
		if named >= z.n || (z.state(named).Load()>>8)&0xffffff != e&0xffffff {
			return fmt.Errorf("loadingzone: index %d holds %#x, not the entry of a record's current generation", i, e)
		}
		if j, dup := seen[named]; dup {
			return fmt.Errorf("loadingzone: record %d indexed at %d and %d", named, j, i)
		}
		seen[named] = i
		slot, _, ok := z.live(e)
		if !ok {
			continue
		}
		b1, b2, tag := z.candidates(z.key(slot).Load())
		inB := func(b uint64) bool { return i >= b && i < b+bucketWords }
		if !inB(b1) && !inB(b2) || (z.idx(i).Load()>>24)&0xffff != tag {
			return fmt.Errorf("loadingzone: record %d (key %#x) indexed at foreign position %d", slot, z.key(slot).Load(), i)
		}
	}
	for s := uint64(0); s < z.n; s++ {
		if st := z.state(s).Load() & 0xff; st > stDropped || st == stWriting {
			return fmt.Errorf("loadingzone: record %d in state %d", s, st)
		}
	}
	return nil
}
