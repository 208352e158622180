package hostview

import (
	"fmt"
	"math/bits"
	"runtime"
	"sync"
)

// Set is the Host View: a sharded, bucketized cuckoo set of page keys. Each
// bucket holds 8 32-bit fingerprints in four uint64 words (32 bytes, two
// buckets per cache line); a key lives in one of two buckets, the second
// derived from the first and the fingerprint (partial-key cuckoo hashing),
// so entries can move without knowing their key.
//
// The set is approximate in one direction only: two keys with the same
// bucket pair and fingerprint are indistinguishable (probability about
// 16/2^32 per lookup), which makes Contains report a key the host does not
// hold. For Host View that costs a prefetch that is not issued — the miss is
// then served by the host's direct path — never a wrong page.
//
// Safe for concurrent use: each shard has its own mutex. Key 0 is never
// stored (no page has it: volume ids start at 1).
type Set struct {
	shards    []shard
	shardBits uint
}

type shard struct {
	mu      sync.Mutex
	words   []uint64 // 4 words = 8 fingerprints per bucket
	mask    uint64   // buckets - 1
	n       int
	stash   []stashEntry // entries that found no room after maxKicks
	rng     uint64
	dropped uint64 // adds lost because the stash was full
	_       [32]byte
}

type stashEntry struct {
	fp  uint32
	idx uint64
}

const (
	slots     = 8
	words     = slots / 2
	maxKicks  = 500
	maxStash  = 16
	loadLimit = 0.90
	lanes     = 0x0000000100000001
	highs     = 0x8000000080000000
)

// New returns a set sized for capacity keys spread over shards shards
// (rounded up to a power of two).
func New(capacity, shards int) *Set {
	if shards < 1 {
		shards = 1
	}
	sb := uint(bits.Len(uint(shards - 1)))
	s := &Set{shards: make([]shard, 1<<sb), shardBits: sb}
	per := capacity/len(s.shards) + 1
	nb := uint64(1)
	for float64(nb*slots)*loadLimit < float64(per) {
		nb <<= 1
	}
	for i := range s.shards {
		sh := &s.shards[i]
		sh.words = make([]uint64, nb*words)
		sh.mask = nb - 1
		sh.rng = uint64(i)*0x9E3779B97F4A7C15 + 1
	}
	return s
}

// hash mixes k (the murmur3 finaliser): good avalanche, a few cycles.
func hash(k uint64) uint64 {
	k ^= k >> 33
	k *= 0xff51afd7ed558ccd
	k ^= k >> 33
	k *= 0xc4ceb9fe1a85ec53
	k ^= k >> 33
	return k
}

// locate returns the shard, first bucket and fingerprint of k.
func (s *Set) locate(k uint64) (*shard, uint64, uint32) {
	h := hash(k)
	fp := uint32(h >> 32)
	if fp == 0 {
		fp = 1
	}
	sh := &s.shards[(h>>24)&(uint64(len(s.shards))-1)]
	return sh, h & sh.mask, fp
}

// alt is the other bucket of fingerprint fp in bucket i; alt(alt(i)) == i.
func (sh *shard) alt(i uint64, fp uint32) uint64 {
	return (i ^ (uint64(fp) * 0x5bd1e9955bd1e995 >> 17)) & sh.mask
}

// has reports whether bucket i holds fp, comparing two fingerprints per
// 64-bit word (SWAR zero-lane test).
func (sh *shard) has(i uint64, fp uint32) bool {
	w := sh.words[i*words : i*words+words : i*words+words]
	pat := uint64(fp) * lanes
	x0, x1, x2, x3 := w[0]^pat, w[1]^pat, w[2]^pat, w[3]^pat
	z := (x0 - lanes) &^ x0
	z |= (x1 - lanes) &^ x1
	z |= (x2 - lanes) &^ x2
	z |= (x3 - lanes) &^ x3
	return z&highs != 0
}

// full is the load at which adds are refused.
func (sh *shard) full() int { return int(float64((sh.mask+1)*slots) * 0.95) }

func (sh *shard) slot(i uint64, j int) uint32 {
	return uint32(sh.words[i*words+uint64(j/2)] >> (32 * (j % 2)))
}

func (sh *shard) setSlot(i uint64, j int, fp uint32) {
	p := &sh.words[i*words+uint64(j/2)]
	sh2 := 32 * (j % 2)
	*p = *p&^(0xffffffff<<sh2) | uint64(fp)<<sh2
}

func (sh *shard) find(i uint64, fp uint32) int {
	for j := 0; j < slots; j++ {
		if sh.slot(i, j) == fp {
			return j
		}
	}
	return -1
}

func (sh *shard) containsLocked(i uint64, fp uint32) bool {
	if sh.has(i, fp) || sh.has(sh.alt(i, fp), fp) {
		return true
	}
	return sh.inStash(i, fp)
}

func (sh *shard) inStash(i uint64, fp uint32) bool {
	for _, e := range sh.stash {
		if e.fp == fp && (e.idx == i || e.idx == sh.alt(i, fp)) {
			return true
		}
	}
	return false
}

// Contains reports whether k is in the set.
func (s *Set) Contains(k uint64) bool {
	sh, i, fp := s.locate(k)
	sh.mu.Lock()
	ok := sh.containsLocked(i, fp)
	sh.mu.Unlock()
	return ok
}

// Add inserts k; it reports false if k was already present.
func (s *Set) Add(k uint64) bool {
	sh, i, fp := s.locate(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.containsLocked(i, fp) {
		return false
	}
	if sh.n >= sh.full() {
		// Past 95% load every insert would kick hundreds of entries before
		// failing; refuse at once (a false negative: a redundant prefetch).
		sh.dropped++
		return false
	}
	sh.n++
	sh.insert(i, fp)
	return true
}

func (sh *shard) insert(i uint64, fp uint32) {
	for _, b := range [2]uint64{i, sh.alt(i, fp)} {
		if j := sh.find(b, 0); j >= 0 {
			sh.setSlot(b, j, fp)
			return
		}
	}
	// Kick a random resident to its other bucket, and repeat.
	b := i
	for kick := 0; kick < maxKicks; kick++ {
		sh.rng ^= sh.rng << 13
		sh.rng ^= sh.rng >> 7
		sh.rng ^= sh.rng << 17
		j := int(sh.rng % slots)
		victim := sh.slot(b, j)
		sh.setSlot(b, j, fp)
		fp = victim
		b = sh.alt(b, fp)
		if j := sh.find(b, 0); j >= 0 {
			sh.setSlot(b, j, fp)
			return
		}
	}
	if len(sh.stash) < maxStash {
		sh.stash = append(sh.stash, stashEntry{fp, b})
		return
	}
	// The table is over-full: this entry is lost (a false negative, which
	// costs a redundant prefetch at worst).
	sh.dropped++
	sh.n--
}

// Delete removes k; it reports whether k was present.
func (s *Set) Delete(k uint64) bool {
	sh, i, fp := s.locate(k)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	for _, b := range [2]uint64{i, sh.alt(i, fp)} {
		if j := sh.find(b, fp); j >= 0 {
			sh.setSlot(b, j, 0)
			sh.n--
			sh.refill()
			return true
		}
	}
	for x, e := range sh.stash {
		if e.fp == fp && (e.idx == i || e.idx == sh.alt(i, fp)) {
			sh.stash = append(sh.stash[:x], sh.stash[x+1:]...)
			sh.n--
			return true
		}
	}
	return false
}

// refill moves a stashed entry back into the table once room may exist.
func (sh *shard) refill() {
	if len(sh.stash) == 0 {
		return
	}
	e := sh.stash[len(sh.stash)-1]
	for _, b := range [2]uint64{e.idx, sh.alt(e.idx, e.fp)} {
		if j := sh.find(b, 0); j >= 0 {
			sh.setSlot(b, j, e.fp)
			sh.stash = sh.stash[:len(sh.stash)-1]
			return
		}
	}
}

// ContainsBatch sets out[i] to whether keys[i] is in the set, using PD3's
// batched lookup (Fig. 5): hash and touch every key's first bucket, search
// them all, then hash, touch and search second buckets only for the keys
// not found. Touching first lets the memory loads of a batch overlap.
func (s *Set) ContainsBatch(keys []uint64, out []bool) {
	const chunk = 32
	var idx [chunk]uint64
	var fps [chunk]uint32
	var shs [chunk]*shard
	for len(keys) > 0 {
		n := min(len(keys), chunk)
		var sink uint64
		for j := 0; j < n; j++ {
			shs[j], idx[j], fps[j] = s.locate(keys[j])
		}
		// One shard at a time under its lock; with few shards this is a
		// couple of passes over n keys.
		for si := range s.shards {
			sh := &s.shards[si]
			mine := false
			for j := 0; j < n && !mine; j++ {
				mine = shs[j] == sh
			}
			if !mine {
				continue
			}
			sh.mu.Lock()
			for j := 0; j < n; j++ {
				if shs[j] == sh {
					sink += sh.words[idx[j]*words]
				}
			}
			for j := 0; j < n; j++ {
				if shs[j] == sh {
					out[j] = sh.has(idx[j], fps[j])
				}
			}
			for j := 0; j < n; j++ {
				if shs[j] == sh && !out[j] {
					idx[j] = sh.alt(idx[j], fps[j])
					sink += sh.words[idx[j]*words]
				}
			}
			for j := 0; j < n; j++ {
				if shs[j] == sh && !out[j] {
					out[j] = sh.has(idx[j], fps[j]) || (len(sh.stash) > 0 && sh.inStash(idx[j], fps[j]))
				}
			}
			sh.mu.Unlock()
		}
		runtime.KeepAlive(sink) // the touching loads must happen
		keys, out = keys[n:], out[n:]
	}
}

// Len returns the number of keys in the set.
func (s *Set) Len() int {
	n := 0
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += sh.n
		sh.mu.Unlock()
	}
	return n
}

// Bytes returns the memory the table occupies.
func (s *Set) Bytes() int {
	n := 0
	for i := range s.shards {
		n += len(s.shards[i].words) * 8
	}
	return n
}

// Dropped counts adds lost to an over-full table.
func (s *Set) Dropped() uint64 {
	var n uint64
	for i := range s.shards {
		sh := &s.shards[i]
		sh.mu.Lock()
		n += sh.dropped
		sh.mu.Unlock()
	}
	return n
}

// Check verifies that the count matches the occupied slots and that every
// fingerprint sits in one of its two buckets' pair (tests call it).
func (s *Set) Check() error {
	for si := range s.shards {
		sh := &s.shards[si]
		sh.mu.Lock()
		occ := len(sh.stash)
		for i := uint64(0); i <= sh.mask; i++ {
			for j := 0; j < slots; j++ {
				if sh.slot(i, j) != 0 {
					occ++
				}
			}
		}
		n := sh.n
		sh.mu.Unlock()
		if occ != n {
			return fmt.Errorf("hostview: shard %d counts %d keys but holds %d", si, n, occ)
		}
	}
	return nil
}

// ShardOf returns the shard index of k, so callers can give each agent
// core the keys of its own shard.
func (s *Set) ShardOf(k uint64) int {
	return int((hash(k) >> 24) & (uint64(len(s.shards)) - 1))
}
