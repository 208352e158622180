package procgov

import (
	"runtime"
	"sync"
	"sync/atomic"
)

// Governor sets the process's GOMAXPROCS by what it serves: lone Ps after
// a run of reads answered from memory one at a time, every P as soon as
// anything else comes. A nil *Governor does nothing: the process keeps
// the GOMAXPROCS it started with.
type Governor struct {
	max, lone int
	set       func(int) int // runtime.GOMAXPROCS; tests count calls instead

	run   atomic.Int32 // lone hits in a row (counting on while low)
	after atomic.Int32 // lone hits in a row that take the process low
	low   atomic.Bool  // running with lone Ps
	mu    sync.Mutex   // orders the set calls

	// Switches counts the changes of GOMAXPROCS made, down and up.
	Switches atomic.Uint64
}

// HitsBeforeLow is how many lone hits in a row first take the process
// down to its lone Ps: a host that mixes hits with misses, or with other
// requests, never gets there and never pays a switch.
const HitsBeforeLow = 64

// maxHitsBeforeLow caps the back-off: a host that keeps coming back up
// soon after going low (many connections, each mostly alone for a
// moment) needs ever longer runs, doubling each time, up to this.
const maxHitsBeforeLow = 1 << 16

// runCap is where a run stops counting while the process is low: far
// past what the back-off compares it with, far below where an int32
// wraps (a day of hits at 27 K/s).
const runCap = 1 << 30

// New returns a governor that runs the process with lone Ps after
// HitsBeforeLow lone hits in a row and with its GOMAXPROCS now at
// anything else; nil (no governor) when lone <= 0 or the process already
// runs with lone Ps or fewer.
func New(lone int) *Governor {
	return NewWith(lone, runtime.GOMAXPROCS(0), runtime.GOMAXPROCS)
}

// NewWith is New for a process of max Ps whose GOMAXPROCS is changed by
// set: tests count the switches instead of making them.
func NewWith(lone, max int, set func(int) int) *Governor {
	if lone <= 0 || lone >= max {
		return nil
	}
	g := &Governor{max: max, lone: lone, set: set}
	g.after.Store(HitsBeforeLow)
	return g
}

// Hit records a read answered from memory while it was the only request
// in flight.
func (g *Governor) Hit() {
	if g == nil || g.low.Load() && g.run.Load() >= runCap {
		return // low long enough for the back-off; the count must not wrap
	}
	if g.run.Add(1) < g.after.Load() || g.low.Load() {
		return
	}
	g.mu.Lock()
	if !g.low.Load() {
		g.set(g.lone)
		g.Switches.Add(1)
		g.low.Store(true)
		// An Other that reset the run before seeing low set must not
		// leave its request with lone Ps: one of the two sees the
		// other's store (both are sequentially consistent atomics).
		if g.run.Load() < g.after.Load() {
			g.set(g.max)
			g.Switches.Add(1)
			g.low.Store(false)
		}
	}
	g.mu.Unlock()
}

// Other records any other request: a miss, a write, a request with others
// in flight, a filesystem or page-protocol request. It restores every P
// before the caller goes on.
func (g *Governor) Other() {
	if g == nil {
		return
	}
	run := g.run.Load()
	if run != 0 {
		g.run.Store(0)
	}
	if !g.low.Load() {
		return
	}
	g.mu.Lock()
	if g.low.Load() {
		g.set(g.max)
		g.Switches.Add(1)
		g.low.Store(false)
		// Low for fewer than four runs' worth of hits: the next run
		// must be twice as long. Low for longer: back to the start.
		if after := g.after.Load(); run-after < 4*after {
			g.after.Store(min(2*after, maxHitsBeforeLow))
		} else {
			g.after.Store(HitsBeforeLow)
		}
	}
	g.mu.Unlock()
}

// Low reports whether the process runs with its lone Ps now.
func (g *Governor) Low() bool { return g != nil && g.low.Load() }
