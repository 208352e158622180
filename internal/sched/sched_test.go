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

// onThreads runs f on n goroutines locked to their threads at once, so
// that the runtime needs n threads of their own, and returns each
// thread's id and f's result there.
func onThreads(n int, f func() uint32) map[int]uint32 {
	type res struct {
		tid int
		v   uint32
	}
	got, release := make(chan res), make(chan struct{})
	for range n {
		go func() {
			runtime.LockOSThread() // exits with the goroutine: the thread goes too
			got <- res{unix.Gettid(), f()}
			<-release
		}()
	}
	out := map[int]uint32{}
	for range n {
		r := <-got
		out[r.tid] = r.v
	}
	close(release)
	return out
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
	for tid, p := range onThreads(2, self) {
		require.Equal(t, uint32(unix.SCHED_NORMAL), p, "thread %d", tid)
	}
	// This thread runs niced; Batch keeps its nice value.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	prio, err := unix.Getpriority(unix.PRIO_PROCESS, 0) // the raw call: 20-nice
	require.NoError(t, err)
	require.NoError(t, unix.Setpriority(unix.PRIO_PROCESS, 0, 3))
	defer unix.Setpriority(unix.PRIO_PROCESS, 0, 20-prio) // before the unlock
	defer func() {
		// Back to the normal class for the next test in this process.
		for range 16 {
			if n, err := movePass(unix.SCHED_BATCH, unix.SCHED_NORMAL); err != nil || n == 0 {
				break
			}
		}
	}()

	moved, err := Batch()
	require.NoError(t, err)
	require.Positive(t, moved)
	before := policies(t)
	for tid, p := range before {
		require.Equal(t, uint32(unix.SCHED_BATCH), p, "thread %d", tid)
	}
	a, err := unix.SchedGetAttr(0, 0)
	require.NoError(t, err)
	require.Equal(t, int32(3), a.Nice, "the nice value is kept")

	// More threads at once than the process has: some are started now.
	started := 0
	for tid, p := range onThreads(len(before)+2, self) {
		require.Equal(t, uint32(unix.SCHED_BATCH), p, "thread %d", tid)
		if _, ok := before[tid]; !ok {
			started++
		}
	}
	require.Positive(t, started, "no thread started after Batch")

	moved, err = Batch()
	require.NoError(t, err)
	require.Zero(t, moved, "a second Batch finds nothing to move")
}
