package pagestore

import (
	"math/bits"

	"github.com/pd3-go/pd3/pageid"
)

// ghost is S3-FIFO's ghost queue: the keys most recently evicted from the
// small queue, asked "was k evicted lately?" when k comes back. A key is
// remembered for the next span remembers after its own (the queue's
// length in the paper), then forgotten.
//
// It is a table of 8-slot buckets, one cache line each, not a FIFO and a
// Go map: a remember or a question touches one line, where the map and its
// ring missed the cache three to five times (docs/decisions.md, 12). A slot keeps 32
// bits of its key's hash and the sequence number it was remembered at; a
// slot older than span is free. A bucket whose eight slots are all live
// gives its oldest to the new key, so the ghost may forget a key early:
// 0.9% of keys at most at this table's size
// (TestGhostForgetsFewEarlyAndInventsNone). It answers yes for a key it
// was not told only when 32 bits of hash collide. Either mistake only
// puts a page in the other queue: no hit ratio of BenchmarkPolicyHitRatio
// moved by more than 0.04 points.
type ghost struct {
	slots []ghostSlot
	shift uint // 64 - log2(buckets): a bucket is the top bits of a hash
	span  uint32
	seq   uint32 // sequence of the last remember, never 0
}

// ghostSlot is free while seq is 0 or more than span remembers old.
type ghostSlot struct{ fp, seq uint32 }

const ghostWays = 8 // 8 × 8 bytes: one cache line per bucket

func newGhost(span int) ghost {
	span = min(max(span, 1), 1<<31)
	// span/4 to span/2 buckets keep a bucket's expected live keys at 2–4
	// of its 8 slots: 16–32 bytes a frame, less than the FIFO and map took.
	log := bits.Len64(uint64(max(span/ghostBucketShare, 1) - 1))
	return ghost{
		slots: make([]ghostSlot, (1<<log)*ghostWays),
		shift: uint(64 - log),
		span:  uint32(span),
	}
}

const ghostBucketShare = 4

// where returns k's bucket and the 32 bits of its hash a slot keeps.
func (g *ghost) where(k pageid.Key) ([]ghostSlot, uint32) {
	h := uint64(k) * 0x9E3779B97F4A7C15
	b := h >> g.shift
	return g.slots[b*ghostWays : b*ghostWays+ghostWays : b*ghostWays+ghostWays], uint32(h)
}

// live: remembered within span remembers (one fewer for a key that saw
// the sequence wrap past 0, once every 2^32 remembers).
func (g *ghost) live(s *ghostSlot) bool { return s.seq != 0 && g.seq-s.seq < g.span }

// remember records that k was evicted from the small queue.
func (g *ghost) remember(k pageid.Key) {
	if g.seq++; g.seq == 0 {
		g.seq = 1
	}
	b, fp := g.where(k)
	// k's own slot if it has one (a key is in a bucket once), else a free
	// one, else the oldest. Free slots are cleared on the way, so that no
	// slot outlives 2^32 remembers and comes back to life.
	use := -1
	for i := range b {
		switch {
		case !g.live(&b[i]):
			b[i].seq = 0
			if use < 0 || b[use].seq != 0 {
				use = i
			}
		case b[i].fp == fp:
			b[i].seq = g.seq
			return
		case use < 0 || b[use].seq != 0 && g.seq-b[i].seq > g.seq-b[use].seq:
			use = i
		}
	}
	b[use] = ghostSlot{fp, g.seq}
}

// take reports whether k was remembered within the last span remembers,
// and forgets it.
func (g *ghost) take(k pageid.Key) bool {
	b, fp := g.where(k)
	for i := range b {
		if b[i].fp == fp && g.live(&b[i]) {
			b[i].seq = 0
			return true
		}
	}
	return false
}
