package pacer

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func run(t *testing.T, rate float64, arr Arrivals, n int) []time.Time {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	out := make(chan time.Time, n)
	go Run(ctx, rate, arr, 1, out)
	var got []time.Time
	for s := range out {
		got = append(got, s)
		if len(got) == n {
			cancel()
		}
	}
	return got[:n]
}

func TestScheduleRate(t *testing.T) {
	for _, arr := range []Arrivals{Uniform, Poisson} {
		t.Run(arr.String(), func(t *testing.T) {
			const rate, n = 20000.0, 4000
			got := run(t, rate, arr, n)
			span := got[n-1].Sub(got[0]).Seconds()
			assert.InDelta(t, rate, float64(n-1)/span, rate*0.1, "mean rate of the schedule")
			gaps := make([]float64, 0, n-1)
			for i := 1; i < n; i++ {
				require.False(t, got[i].Before(got[i-1]), "schedule goes backwards at %d", i)
				gaps = append(gaps, got[i].Sub(got[i-1]).Seconds()*rate)
			}
			// Exponential gaps have a standard deviation equal to their
			// mean; even ones have none.
			var m, v float64
			for _, g := range gaps {
				m += g
			}
			m /= float64(len(gaps))
			for _, g := range gaps {
				v += (g - m) * (g - m)
			}
			cv := math.Sqrt(v/float64(len(gaps))) / m
			if arr == Poisson {
				assert.InDelta(t, 1.0, cv, 0.15)
			} else {
				assert.Less(t, cv, 0.01)
			}
		})
	}
}

func TestCancelClosesOut(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	out := make(chan time.Time) // read once: then Run waits in the send
	done := make(chan struct{})
	go func() { Run(ctx, 1e6, Poisson, 1, out); close(done) }()
	<-out // Run is sending; the next send waits, as nothing reads
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
	_, ok := <-out
	assert.False(t, ok)
}

func TestParseArrivals(t *testing.T) {
	for _, s := range []string{"poisson", "uniform"} {
		a, ok := ParseArrivals(s)
		require.True(t, ok)
		assert.Equal(t, s, a.String())
	}
	_, ok := ParseArrivals("bursty")
	assert.False(t, ok)
}
