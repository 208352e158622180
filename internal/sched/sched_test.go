package sched

import (
	"os"
	"runtime"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// policies is the scheduling class of every thread of the process.
func policies(t *testing.T) map[int]uint32 {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/task")
	require.NoError(t, err)
	out := map[int]uint32{}
	for _, e := range ents {
		tid, err := strconv.Atoi(e.Name())
		require.NoError(t, err)
		p, err := Policy(tid)
		if err != nil {
			continue // exited since the listing
		}
		out[tid] = p
	}
	return out
}

// onNewThread runs f on a thread the runtime starts for it and returns
// f's result.
func onNewThread(f func() uint32) uint32 {
	got := make(chan uint32)
	go func() {
		// A locked goroutine that exits takes its thread with it, so the
		// next one needs a thread started now.
		runtime.LockOSThread()
		got <- f()
	}()
	return <-got
}

func TestBatchMovesEveryThreadAndThoseStartedLater(t *testing.T) {
	self := func() uint32 {
		p, err := Policy(0)
		if err != nil {
			return 1 << 31
		}
		return p
	}
	// Without Batch, threads run in the normal class (the test's own
	// process, started by go test).
	require.Equal(t, uint32(unix.SCHED_NORMAL), onNewThread(self))
	// This thread runs niced; Batch keeps its nice value.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	require.NoError(t, unix.Setpriority(unix.PRIO_PROCESS, 0, 3))

	moved, err := Batch()
	require.NoError(t, err)
	require.Positive(t, moved)
	for tid, p := range policies(t) {
		require.Equal(t, uint32(unix.SCHED_BATCH), p, "thread %d", tid)
	}
	for range 4 {
		require.Equal(t, uint32(unix.SCHED_BATCH), onNewThread(self), "a thread started after Batch")
	}
	a, err := unix.SchedGetAttr(0, 0)
	require.NoError(t, err)
	require.Equal(t, int32(3), a.Nice, "the nice value is kept")

	moved, err = Batch()
	require.NoError(t, err)
	require.Zero(t, moved, "a second Batch finds nothing to move")
}
