package procgov

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type setter struct {
	mu    sync.Mutex
	calls []int
}

func (s *setter) set(n int) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls = append(s.calls, n)
	return 0
}

func TestGovernorSwitches(t *testing.T) {
	var s setter
	g := NewWith(1, 2, s.set)
	require.NotNil(t, g)
	for range HitsBeforeLow - 1 {
		g.Hit()
	}
	assert.Empty(t, s.calls, "not before a run of lone hits")
	assert.False(t, g.Low())
	g.Hit()
	assert.Equal(t, []int{1}, s.calls, "one P after the run")
	assert.True(t, g.Low())
	for range 1000 {
		g.Hit()
	}
	assert.Equal(t, []int{1}, s.calls, "no switch while it stays low")
	g.Other()
	assert.Equal(t, []int{1, 2}, s.calls, "every P back at another request")
	assert.False(t, g.Low())
	assert.Equal(t, uint64(2), g.Switches.Load())
	g.Other()
	assert.Equal(t, []int{1, 2}, s.calls)
}

func TestGovernorRunIsBrokenByOtherRequests(t *testing.T) {
	var s setter
	g := NewWith(1, 4, s.set)
	for i := range 10 * HitsBeforeLow {
		if i%(HitsBeforeLow/2) == 0 {
			g.Other() // a miss now and then: a host that mixes never switches
		}
		g.Hit()
	}
	assert.Empty(t, s.calls)
}

func TestNoGovernor(t *testing.T) {
	var s setter
	for _, tc := range []struct{ lone, max int }{{0, 2}, {-1, 2}, {1, 1}, {2, 2}, {3, 2}} {
		g := NewWith(tc.lone, tc.max, s.set)
		assert.Nil(t, g, "lone %d of %d", tc.lone, tc.max)
		for range 2 * HitsBeforeLow {
			g.Hit()
		}
		g.Other()
		assert.False(t, g.Low())
	}
	assert.Empty(t, s.calls)
}

func TestGovernorConcurrent(t *testing.T) {
	var s setter
	g := NewWith(1, 2, s.set)
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 5000 {
				if (i+w)%97 == 0 {
					g.Other()
				} else {
					g.Hit()
				}
			}
		}()
	}
	wg.Wait()
	g.Other()
	require.False(t, g.Low())
	for i, n := range s.calls {
		assert.Equal(t, []int{1, 2}[i%2], n, "switches alternate down and up")
	}
}

// A host that comes back up soon after going low needs ever longer runs;
// one that stayed low for a while starts over.
func TestGovernorBacksOffWhenItFlaps(t *testing.T) {
	var s setter
	g := NewWith(1, 2, s.set)
	low := func(hits int) {
		t.Helper()
		for range hits {
			g.Hit()
		}
	}
	want := []int{}
	for _, after := range []int{HitsBeforeLow, 2 * HitsBeforeLow, 4 * HitsBeforeLow} {
		low(after - 1)
		assert.False(t, g.Low(), "a run of %d is not enough", after-1)
		low(1)
		require.True(t, g.Low(), "a run of %d is", after)
		g.Other() // straight back up: flapping
		want = append(want, 1, 2)
	}
	assert.Equal(t, want, s.calls)
	low(8 * HitsBeforeLow)
	require.True(t, g.Low())
	low(4 * 8 * HitsBeforeLow) // a long stay low
	g.Other()
	low(HitsBeforeLow)
	assert.True(t, g.Low(), "after a long stay low the run is short again")

	g.Other()
	for range 20 {
		low(int(g.after.Load())) // down, and straight back up
		g.Other()
	}
	assert.Equal(t, int32(maxHitsBeforeLow), g.after.Load(), "the back-off is capped")
}

func TestGovernorRunDoesNotWrap(t *testing.T) {
	var s setter
	g := NewWith(1, 2, s.set)
	for range HitsBeforeLow {
		g.Hit()
	}
	require.True(t, g.Low())
	g.run.Store(runCap - 1)
	g.Hit()
	g.Hit()
	assert.Equal(t, int32(runCap), g.run.Load(), "a low process stops counting at the cap")
	g.Other()
	assert.False(t, g.Low())
	assert.Equal(t, int32(HitsBeforeLow), g.after.Load(), "a long stay low starts the back-off over")
}
