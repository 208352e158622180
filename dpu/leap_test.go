package dpu

import (
	"context"
	"testing"
	"time"

	"github.com/pd3-go/pd3/pageid"
	"github.com/pd3-go/pd3/pagestore"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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

// Leap must see the host's misses whichever way the page store takes
// them: one page, one page without blocking (the NBD and page-protocol
// readers' path), or a multi-page run (NBD and FUSE reads).
func TestLeapRemoteSeesEveryKindOfMiss(t *testing.T) {
	for _, tc := range []struct {
		name string
		miss func(t *testing.T, s *pagestore.Store, vol uint16, first uint64)
	}{
		{"ReadPage", func(t *testing.T, s *pagestore.Store, vol uint16, first uint64) {
			buf := make([]byte, pageid.Size)
			for p := first; p < first+12; p++ {
				require.NoError(t, s.Get(context.Background(), pageid.MakeKey(vol, p), buf))
			}
		}},
		{"ReadPageAsync", func(t *testing.T, s *pagestore.Store, vol uint16, first uint64) {
			buf := make([]byte, pageid.Size)
			for p := first; p < first+12; p++ {
				done := make(chan error, 1)
				finished, err := s.GetAsync(pageid.MakeKey(vol, p), buf, func(err error) { done <- err })
				require.NoError(t, err)
				require.False(t, finished, "page %d was a miss", p)
				require.NoError(t, <-done)
			}
		}},
		{"ReadPages", func(t *testing.T, s *pagestore.Store, vol uint16, first uint64) {
			require.NoError(t, s.ReadRange(context.Background(), vol, first*pageid.Size, make([]byte, 12*pageid.Size)))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, 64)
			leap := NewLeap(func() uint64 { return 0 })
			s, err := pagestore.New(LeapRemote{Engine: r.e, L: leap}, pagestore.Options{CacheBytes: 64 * pageid.Size})
			require.NoError(t, err)
			s.AddVolume(r.vol)
			tc.miss(t, s, r.vol.ID, 100)
			assert.NotZero(t, leap.Predictions.Load(), "12 sequential misses and Leap found no trend: it never saw them")
			require.Eventually(t, func() bool { return r.e.Placed.Load() > 0 }, 5*time.Second, time.Millisecond, "the predicted pages reach the Loading Zone")
			require.NoError(t, s.Check())
		})
	}
}
