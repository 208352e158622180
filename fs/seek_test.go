package fs_test

import (
	"fmt"
	"os"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// TestSeekDataSeesCachedWrites: lseek(SEEK_DATA, SEEK_HOLE) answers with
// the file as its writer sees it, bytes still in the kernel's writeback
// cache included. go-fuse's answer from the size the filesystem knows
// said ENXIO (no data) at offset 0 of a file just written, which a
// sparse-aware copier would take for a file of holes.
func TestSeekDataSeesCachedWrites(t *testing.T) {
	addr := startNode(t, 0)
	e := mount(t, addr, "", 0)
	f, err := os.OpenFile(e.path("f"), os.O_CREATE|os.O_RDWR|os.O_TRUNC, 0o644)
	require.NoError(t, err)
	defer f.Close()
	page := make([]byte, 4096)
	for i := range page {
		page[i] = 'd'
	}
	const far = 1 << 20
	_, err = f.WriteAt(page, 0)
	require.NoError(t, err)
	_, err = f.WriteAt(page, far)
	require.NoError(t, err)
	const size = far + 4096

	check := func(when string) {
		fd := int(f.Fd())
		for _, off := range []int64{0, 100, far + 10} {
			got, err := unix.Seek(fd, off, unix.SEEK_DATA)
			if assert.NoError(t, err, "%s: SEEK_DATA at %d", when, off) {
				assert.Equal(t, off, got, "%s: SEEK_DATA at %d, which holds data", when, off)
			}
		}
		hole, err := unix.Seek(fd, 0, unix.SEEK_HOLE)
		if assert.NoError(t, err, "%s: SEEK_HOLE at 0", when) {
			assert.True(t, hole >= 4096 && hole <= size, "%s: SEEK_HOLE at 0 says %d", when, hole)
		}
		_, err = unix.Seek(fd, size, unix.SEEK_DATA)
		assert.ErrorIs(t, err, syscall.ENXIO, "%s: SEEK_DATA at the end", when)
	}
	check("in the kernel's cache")
	require.NoError(t, f.Sync())
	check("after fsync")
}

// TestSyncfsAfterUnlinks: syncfs(2) succeeds after files were written,
// closed and unlinked. The kernel still held their inodes and wrote back
// the times it had changed (the unlink's ctime) as SETATTRs, which the
// mount, having freed the files, answered ENOENT: syncfs failed with it
// (stress-ng's io stressor, after touch-like churn).
func TestSyncfsAfterUnlinks(t *testing.T) {
	addr := startNode(t, 0)
	e := mount(t, addr, "", 0)
	for i := range 50 {
		p := e.path(fmt.Sprintf("t%d", i))
		require.NoError(t, os.WriteFile(p, []byte("z"), 0o644))
		require.NoError(t, os.Remove(p))
	}
	d, err := os.Open(e.dir)
	require.NoError(t, err)
	defer d.Close()
	assert.NoError(t, unix.Syncfs(int(d.Fd())))
}

// TestSpecialFiles: mknod makes FIFOs, sockets and device nodes (their
// numbers kept), a FIFO on the mount carries bytes, and all of them
// come back after a remount.
func TestSpecialFiles(t *testing.T) {
	addr := startNode(t, 0)
	e := mount(t, addr, "", 0)
	dev := int(unix.Mkdev(1, 3))
	made := map[string]struct {
		mode uint32
		dev  int
	}{
		"fifo": {unix.S_IFIFO | 0o640, 0},
		"sock": {unix.S_IFSOCK | 0o600, 0},
		"chr":  {unix.S_IFCHR | 0o600, dev},
		"blk":  {unix.S_IFBLK | 0o600, dev},
		"reg":  {unix.S_IFREG | 0o644, 0},
	}
	for name, m := range made {
		require.NoError(t, unix.Mknod(e.path(name), m.mode, m.dev), name)
	}
	check := func(when string) {
		for name, m := range made {
			var st unix.Stat_t
			if assert.NoError(t, unix.Lstat(e.path(name), &st), "%s: %s", when, name) {
				assert.Equal(t, m.mode, st.Mode, "%s: %s's mode", when, name)
				assert.EqualValues(t, m.dev, st.Rdev, "%s: %s's device number", when, name)
			}
		}
	}
	check("made")

	done := make(chan error, 1)
	go func() {
		w, err := os.OpenFile(e.path("fifo"), os.O_WRONLY, 0)
		if err == nil {
			_, err = w.Write([]byte("through the fifo"))
			w.Close()
		}
		done <- err
	}()
	r, err := os.Open(e.path("fifo"))
	require.NoError(t, err)
	got := make([]byte, 64)
	n, err := r.Read(got)
	r.Close()
	require.NoError(t, err)
	require.NoError(t, <-done)
	assert.Equal(t, "through the fifo", string(got[:n]))

	dir := e.dir
	e.unmount()
	e = mount(t, addr, dir, 0)
	check("after a remount")
	for name := range made {
		require.NoError(t, os.Remove(e.path(name)), name)
	}
}
