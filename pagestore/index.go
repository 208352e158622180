package pagestore

import (
	"iter"
	"math/bits"

	"github.com/pd3-go/pd3/pageid"
)

// index maps the page keys of one shard to their frames. It is an
// open-addressing table with linear probing, not a Go map: a key and its
// frame share a 16-byte slot, four to a cache line, so a lookup of a
// random key misses the cache about once where the map's control word
// and slot group missed two or three times (docs/decisions.md, 12).
//
// A deletion shifts the slots behind it back (no tombstones), so probes
// stay short however many pages come and go. The table doubles when three
// quarters full; it never shrinks (a shard holds at most the cache's
// frames). Sized for a shard's share of the frames, a table is at most
// half full when the cache is (32–64 bytes a frame, at most 1.6% of the
// cache), and a shard grows only if it holds half again its share.
// Callers hold the shard's lock.
type index struct {
	slots []indexSlot
	shift uint // 64 - log2(len(slots)): a home slot is the top bits of a hash
	n     int
}

type indexSlot struct {
	k  pageid.Key
	f1 int32 // frame + 1; 0 marks a free slot
}

func newIndex(hint int) index {
	var x index
	x.alloc(max(hint*2, 8))
	return x
}

// alloc gives x an empty table of at least n slots (a power of two).
func (x *index) alloc(n int) {
	log := bits.Len64(uint64(n - 1))
	x.slots = make([]indexSlot, 1<<log)
	x.shift = uint(64 - log)
	x.n = 0
}

func (x *index) home(k pageid.Key) uint64 {
	// Not the shard's multiplier: the shard took that hash's top bits,
	// which are therefore the same for every key here.
	return uint64(k) * 0xFF51AFD7ED558CCD >> x.shift
}

func (x *index) len() int { return x.n }

// get returns k's frame.
func (x *index) get(k pageid.Key) (int32, bool) {
	mask := uint64(len(x.slots) - 1)
	for i := x.home(k); ; i = (i + 1) & mask {
		s := &x.slots[i]
		if s.f1 == 0 {
			return 0, false
		}
		if s.k == k {
			return s.f1 - 1, true
		}
	}
}

// add maps k to f unless k is present; it reports whether it did.
func (x *index) add(k pageid.Key, f int32) bool {
	if (x.n+1)*4 > len(x.slots)*3 {
		x.grow()
	}
	mask := uint64(len(x.slots) - 1)
	for i := x.home(k); ; i = (i + 1) & mask {
		s := &x.slots[i]
		if s.f1 == 0 {
			*s = indexSlot{k, f + 1}
			x.n++
			return true
		}
		if s.k == k {
			return false
		}
	}
}

func (x *index) grow() {
	old := x.slots
	x.alloc(2 * len(old))
	for _, s := range old {
		if s.f1 != 0 {
			x.add(s.k, s.f1-1)
		}
	}
}

// remove unmaps k if it maps to f, and reports whether it did.
func (x *index) remove(k pageid.Key, f int32) bool {
	mask := uint64(len(x.slots) - 1)
	i := x.home(k)
	for ; ; i = (i + 1) & mask {
		s := &x.slots[i]
		if s.f1 == 0 {
			return false
		}
		if s.k == k {
			if s.f1 != f+1 {
				return false
			}
			break
		}
	}
	// Shift back every later slot of the run whose home is not between
	// the hole and it (cyclically): each stays reachable from its home.
	hole := i
	for j := (i + 1) & mask; x.slots[j].f1 != 0; j = (j + 1) & mask {
		h := x.home(x.slots[j].k)
		if (j-h)&mask >= (j-hole)&mask {
			x.slots[hole] = x.slots[j]
			hole = j
		}
	}
	x.slots[hole] = indexSlot{}
	x.n--
	return true
}

// all yields every key and its frame.
func (x *index) all() iter.Seq2[pageid.Key, int32] {
	return func(yield func(pageid.Key, int32) bool) {
		for _, s := range x.slots {
			if s.f1 != 0 && !yield(s.k, s.f1-1) {
				return
			}
		}
	}
}
