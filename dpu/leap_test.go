package dpu

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestLeapFindsTrends(t *testing.T) {
	var hits uint64
	l := NewLeap(func() uint64 { return hits })
	var out []uint64
	for p := uint64(100); p < 100+9*3; p += 3 {
		out = l.Miss(p, out[:0])
	}
	// After 9 misses with stride 3 (8 deltas), the trend is found.
	assert.Equal(t, []uint64{127, 130, 133, 136}, out)

	// Prefetch hits deepen the next prediction (hits+2 → power of two, ≤ 8).
	hits = 10
	out = l.Miss(127, out[:0])
	assert.Len(t, out, 8)
	// No hits: depth may halve, never below half the previous (8 → 4).
	out = l.Miss(130, out[:0])
	assert.Len(t, out, 4)
}

func TestLeapMajorityAmidNoise(t *testing.T) {
	l := NewLeap(func() uint64 { return 0 })
	seq := []uint64{10, 11, 12, 50, 13, 14, 15, 16, 17}
	var out []uint64
	for _, p := range seq {
		out = l.Miss(p, out[:0])
	}
	// Deltas: 1,1,38,-37,1,1,1,1 → majority 1 in the last 8.
	assert.Equal(t, []uint64{18, 19, 20, 21}, out)
}

func TestLeapRandomHasNoTrend(t *testing.T) {
	l := NewLeap(func() uint64 { return 0 })
	var out []uint64
	x := uint64(12345)
	for i := 0; i < 100; i++ {
		x = x*6364136223846793005 + 1442695040888963407
		out = l.Miss(x>>40, out)
	}
	assert.Empty(t, out)
	assert.Zero(t, l.Predictions.Load())
}
