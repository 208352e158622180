package fs_test

import (
	"os"
	"os/signal"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// TestSignalsDoNotFailFsync: a signal to a thread blocked in fsync(2) or
// write(2) on the mount makes the kernel send an INTERRUPT, and go-fuse
// ends the request's context; the mount must finish the request anyway,
// as a local filesystem does, because a program that is not told to
// retry an fsync takes EINTR for a failed one (PostgreSQL stops). Go's
// os.File retries EINTR itself, so the test makes the system calls bare.
func TestSignalsDoNotFailFsync(t *testing.T) {
	addr := startNode(t, 0)
	e := mount(t, addr, "", 1<<20)
	f, err := os.Create(e.path("f"))
	require.NoError(t, err)
	defer f.Close()
	fd := int(f.Fd())

	sig := make(chan os.Signal, 64)
	signal.Notify(sig, syscall.SIGUSR1)
	defer signal.Stop(sig)
	tid := make(chan int, 1)
	done := make(chan struct{})
	var eintr, calls int
	go func() {
		defer close(done)
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		tid <- unix.Gettid()
		chunk := make([]byte, 1<<20)
		for i := range 40 {
			for j := range chunk {
				chunk[j] = byte(i + j)
			}
			if _, err := unix.Pwrite(fd, chunk, int64(i)<<20); err == unix.EINTR {
				eintr++
			}
			calls++
			if err := unix.Fsync(fd); err == unix.EINTR {
				eintr++
			}
			calls++
		}
	}()
	thread := <-tid
	tick := time.NewTicker(200 * time.Microsecond)
	defer tick.Stop()
	sent := 0
	for running := true; running; {
		select {
		case <-done:
			running = false
		case <-tick.C:
			if unix.Tgkill(os.Getpid(), thread, syscall.SIGUSR1) == nil {
				sent++
			}
		}
	}
	t.Logf("%d signals sent during %d writes and fsyncs", sent, calls)
	assert.Zero(t, eintr, "writes or fsyncs failed with EINTR")
}
