package memnode

import (
	"runtime/debug"
	"sync/atomic"
)

// reclaimStep is how many bytes of freed chunks make the store give
// memory back to the operating system.
const reclaimStep = 64 << 20

// reclaimer gives the memory of freed chunks back to the operating system
// soon after they are freed (docs/decisions.md, 35). A chunk is Go heap,
// and the runtime collects when its heap has grown to twice what was live
// at the last collection: a node whose volumes were deleted and made again
// held up to 2.5 times the page memory it stored, past its --capacity.
// After every reclaimStep bytes freed, a goroutine (one at a time, gone
// when done) collects and returns the free memory.
type reclaimer struct {
	freed   atomic.Uint64 // bytes freed since the last reclaim began
	running atomic.Bool
	// runs counts reclaims finished (tests wait on it).
	runs atomic.Uint64
}

// freedChunk counts a chunk freed and starts a reclaim once reclaimStep
// bytes wait for one.
func (r *reclaimer) freedChunk() {
	if r.freed.Add(ChunkSize) < reclaimStep || !r.running.CompareAndSwap(false, true) {
		return
	}
	go r.loop()
}

func (r *reclaimer) loop() {
	for {
		r.freed.Store(0)
		debug.FreeOSMemory()
		r.runs.Add(1)
		r.running.Store(false)
		// Frees counted while this ran, with running still set, started
		// nothing: take them up unless a new goroutine did.
		if r.freed.Load() < reclaimStep || !r.running.CompareAndSwap(false, true) {
			return
		}
	}
}
