package memnode

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// heapHeld is the Go heap memory the process holds from the operating
// system.
func heapHeld() uint64 {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapSys - m.HeapReleased
}

// TestChurnedVolumesGiveTheirMemoryBack: a node whose volumes are written,
// deleted and made again holds about the memory of the pages it stores,
// not the runtime's twice-the-live-heap (650 MiB held for 256 MiB stored
// after four rounds, before the reclaimer). Trims of whole chunks free
// theirs too.
func TestChurnedVolumesGiveTheirMemoryBack(t *testing.T) {
	const size = 256 << 20
	debug.FreeOSMemory()
	base := heapHeld()
	s := NewStore(0)
	buf := make([]byte, ChunkSize)
	fill := func(id uint16) {
		for off := uint64(0); off < size; off += ChunkSize {
			require.NoError(t, s.WriteAt(id, off, buf))
		}
	}
	reclaimed := func(before uint64) {
		require.Eventually(t, func() bool { return s.Reclaims() > before && !s.reclaim.running.Load() },
			10*time.Second, time.Millisecond, "a reclaim after %d MiB freed", reclaimStep>>20)
	}
	for round := range 4 {
		name := fmt.Sprint("v", round)
		v, err := s.Create(name, size)
		require.NoError(t, err)
		fill(v.ID)
		if round == 0 {
			continue
		}
		runs := s.Reclaims()
		if round%2 == 1 {
			require.NoError(t, s.Delete(fmt.Sprint("v", round-1)))
		} else {
			prev, err := s.Create(fmt.Sprint("t", round), size) // trimmed, not deleted
			require.NoError(t, err)
			fill(prev.ID)
			require.NoError(t, s.Trim(prev.ID, 0, size))
			require.NoError(t, s.Delete(fmt.Sprint("v", round-1)))
		}
		reclaimed(runs)
		held := heapHeld() - base
		t.Logf("round %d: %d MiB stored, %d MiB of heap held", round, s.Used()>>20, held>>20)
		require.LessOrEqual(t, held, s.Used()+64<<20, "heap held after round %d", round)
	}
}
