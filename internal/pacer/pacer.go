// Package pacer releases events on a schedule to within tens of
// microseconds, for open-loop load generators.
//
// Go's timers are the wrong tool for this: an idle runtime waits for the
// next timer in the netpoller, which sleeps in whole milliseconds, so a
// time.Sleep wakes 0.5 ms late in the median and 1.1 ms late at the 99th
// percentile (measured on the 2-core benchmark VM). A latency measured from
// the scheduled send time would then be mostly the generator's own lateness.
// The pacer instead sleeps in nanosleep(2) on an OS thread of its own with a
// timer slack of 1 ns.
package pacer

import (
	"context"
	"math/rand/v2"
	"runtime"
	"time"

	"golang.org/x/sys/unix"
)

// Arrivals is the spacing between scheduled events.
type Arrivals int

const (
	// Poisson spaces events by exponentially distributed gaps: independent
	// arrivals, as from many users, so requests sometimes queue even below
	// saturation.
	Poisson Arrivals = iota
	// Uniform spaces events evenly.
	Uniform
)

func (a Arrivals) String() string {
	if a == Uniform {
		return "uniform"
	}
	return "poisson"
}

// ParseArrivals reads "poisson" or "uniform".
func ParseArrivals(s string) (Arrivals, bool) {
	switch s {
	case "poisson":
		return Poisson, true
	case "uniform":
		return Uniform, true
	}
	return 0, false
}

// Run sends the scheduled time of each event on out, rate events per
// second on average, until ctx is done; then it closes out. It never skips
// an event: when out is full it waits, and the events due meanwhile follow
// at once, still carrying their scheduled times, so a consumer that measures
// latency from them counts the wait (no coordinated omission).
func Run(ctx context.Context, rate float64, arr Arrivals, seed uint64, out chan<- time.Time) {
	defer close(out)
	if rate <= 0 {
		return
	}
	// The thread ends with this goroutine, so its timer slack stays here.
	runtime.LockOSThread()
	_ = unix.Prctl(unix.PR_SET_TIMERSLACK, 1, 0, 0, 0)
	rng := rand.New(rand.NewPCG(seed, 0x9ace))
	mean := float64(time.Second) / rate
	next := time.Now()
	for ctx.Err() == nil {
		gap := mean
		if arr == Poisson {
			gap *= rng.ExpFloat64()
		}
		next = next.Add(time.Duration(gap))
		sleepUntil(ctx, next)
		select {
		case out <- next:
		case <-ctx.Done():
		}
	}
}

// sleepUntil returns at t, or a little after, or when ctx is done (checked
// at least every 10 ms).
func sleepUntil(ctx context.Context, t time.Time) {
	for ctx.Err() == nil {
		d := time.Until(t)
		if d <= 0 {
			return
		}
		ts := unix.NsecToTimespec(min(d, 10*time.Millisecond).Nanoseconds())
		_ = unix.Nanosleep(&ts, nil) // EINTR (runtime signals): loop and recompute
	}
}
