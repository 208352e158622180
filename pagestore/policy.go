package pagestore

import (
	"fmt"
	"sync/atomic"

	"github.com/pd3-go/pd3/pageid"
)

// policy decides which cache frame to evict. Every method but hit is called
// with Cache.evictMu held; hit is called concurrently and must only touch
// atomics.
type policy interface {
	// hit records an access to a resident frame.
	hit(f int32)
	// insert makes frame f, now holding key k, a candidate for eviction.
	insert(f int32, k pageid.Key)
	// victim removes and returns a frame that claim accepted, or -1 when
	// no frame could be claimed. claim fails for frames in use; the policy
	// keeps such frames and moves on, giving up after tries failed claims
	// when tries > 0 (a caller that must not wait would rather fail).
	victim(claim func(f int32) bool, tries int) int32
	// size reports how many frames the policy tracks (for check).
	size() int
}

// PolicyNames lists the eviction policies NewCache accepts.
var PolicyNames = []string{"s3fifo", "clock"}

// CheckPolicy reports whether name is an eviction policy Options.Policy
// accepts ("" is the default, s3fifo).
func CheckPolicy(name string) error {
	switch name {
	case "", "s3fifo", "clock":
		return nil
	}
	return fmt.Errorf("unknown eviction policy %q (have %v)", name, PolicyNames)
}

func newPolicy(name string, frames int) (policy, error) {
	switch name {
	case "", "s3fifo":
		return newS3FIFO(frames), nil
	case "clock":
		return newClock(frames), nil
	}
	return nil, fmt.Errorf("pagestore: %w", CheckPolicy(name))
}

// clock is the second-chance algorithm over all frames.
type clock struct {
	ref  []atomic.Uint32
	in   []bool
	n    int
	hand int
}

func newClock(frames int) *clock {
	return &clock{ref: make([]atomic.Uint32, frames), in: make([]bool, frames)}
}

func (c *clock) hit(f int32) {
	if c.ref[f].Load() == 0 {
		c.ref[f].Store(1)
	}
}

func (c *clock) insert(f int32, _ pageid.Key) {
	c.ref[f].Store(0)
	if !c.in[f] {
		c.in[f] = true
		c.n++
	}
}

func (c *clock) victim(claim func(int32) bool, tries int) int32 {
	failed := 0
	// Two sweeps clear every reference bit; a third finds the claimable.
	for i := 0; i < 3*len(c.in); i++ {
		f := int32(c.hand)
		c.hand++
		if c.hand == len(c.in) {
			c.hand = 0
		}
		if !c.in[f] {
			continue
		}
		if c.ref[f].Load() != 0 {
			c.ref[f].Store(0)
			continue
		}
		if claim(f) {
			c.in[f] = false
			c.n--
			return f
		}
		if failed++; failed == tries {
			return -1
		}
	}
	return -1
}

func (c *clock) size() int { return c.n }

// s3fifo is S3-FIFO (Yang et al., SOSP'23): a small FIFO that filters
// one-hit wonders, a main FIFO with reinsertion, and a ghost FIFO of keys
// recently evicted from the small queue (as many as there are frames).
type s3fifo struct {
	freq      []atomic.Uint32
	small     ring[int32]
	main      ring[int32]
	ghost     ghost
	smallCap  int
	keyOfHint []pageid.Key // key of each frame, recorded at insert for the ghost
}

func newS3FIFO(frames int) *s3fifo {
	return &s3fifo{
		freq:      make([]atomic.Uint32, frames),
		small:     newRing[int32](frames),
		main:      newRing[int32](frames),
		ghost:     newGhost(frames),
		smallCap:  max(frames/10, 1),
		keyOfHint: make([]pageid.Key, frames),
	}
}

func (s *s3fifo) hit(f int32) {
	if v := s.freq[f].Load(); v < 3 {
		s.freq[f].CompareAndSwap(v, v+1)
	}
}

func (s *s3fifo) insert(f int32, k pageid.Key) {
	s.freq[f].Store(0)
	s.keyOfHint[f] = k
	if s.ghost.take(k) {
		s.main.push(f)
		return
	}
	s.small.push(f)
}

func (s *s3fifo) victim(claim func(int32) bool, tries int) int32 {
	failed := 0
	for i := 0; i < 4*len(s.freq); i++ {
		if s.small.len() > s.smallCap || (s.main.len() == 0 && s.small.len() > 0) {
			f := s.small.pop()
			if s.freq[f].Load() > 1 {
				s.freq[f].Store(0)
				s.main.push(f)
				continue
			}
			if claim(f) {
				s.ghost.remember(s.keyOfHint[f])
				return f
			}
			s.small.push(f)
			if failed++; failed == tries {
				return -1
			}
			continue
		}
		if s.main.len() == 0 {
			return -1
		}
		f := s.main.pop()
		if v := s.freq[f].Load(); v > 0 {
			s.freq[f].Store(v - 1)
			s.main.push(f)
			continue
		}
		if claim(f) {
			return f
		}
		s.main.push(f)
		if failed++; failed == tries {
			return -1
		}
	}
	return -1
}

func (s *s3fifo) size() int { return s.small.len() + s.main.len() }

// ring is a fixed-capacity FIFO.
type ring[T any] struct {
	buf        []T
	head, size int
}

func newRing[T any](n int) ring[T] { return ring[T]{buf: make([]T, n)} }

func (r *ring[T]) len() int { return r.size }

func (r *ring[T]) push(v T) {
	if r.size == len(r.buf) {
		panic("pagestore: policy ring overflow")
	}
	r.buf[(r.head+r.size)%len(r.buf)] = v
	r.size++
}

func (r *ring[T]) pop() T {
	v := r.buf[r.head]
	r.head++
	if r.head == len(r.buf) {
		r.head = 0
	}
	r.size--
	return v
}
