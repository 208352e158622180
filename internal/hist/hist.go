// Package hist is a log-linear latency histogram: recording is a few
// arithmetic operations and an increment, with no allocation, so benchmark
// clients can record every operation. Relative error is below 1/64.
package hist

import (
	"math/bits"
	"time"
)

const (
	subBits = 6
	sub     = 1 << subBits
	nBucket = (64 - subBits + 1) * sub
)

// H records durations. The zero value is ready; it is not safe for
// concurrent use (give each goroutine its own and Merge).
type H struct {
	counts [nBucket]uint64
	n      uint64
	sum    time.Duration
	max    time.Duration
}

func index(v uint64) int {
	if v < sub {
		return int(v)
	}
	e := bits.Len64(v) - subBits // ≥ 1
	return e*sub + int(v>>(e-1)) - sub
}

func lower(i int) uint64 {
	if i < sub {
		return uint64(i)
	}
	e := i / sub
	m := uint64(i%sub + sub)
	return m << (e - 1)
}

// Record adds one observation.
func (h *H) Record(d time.Duration) {
	if d < 0 {
		d = 0
	}
	h.counts[index(uint64(d))]++
	h.n++
	h.sum += d
	if d > h.max {
		h.max = d
	}
}

// Merge adds o's observations to h.
func (h *H) Merge(o *H) {
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.n += o.n
	h.sum += o.sum
	h.max = max(h.max, o.max)
}

// Count is the number of observations.
func (h *H) Count() uint64 { return h.n }

// Mean is the average observation.
func (h *H) Mean() time.Duration {
	if h.n == 0 {
		return 0
	}
	return h.sum / time.Duration(h.n)
}

// Quantile returns the q-quantile (0 ≤ q ≤ 1), at bucket resolution.
func (h *H) Quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	rank := uint64(q * float64(h.n))
	if rank >= h.n {
		return h.max
	}
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen > rank {
			return time.Duration(lower(i))
		}
	}
	return h.max
}
