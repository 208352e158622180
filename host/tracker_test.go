package host

import (
	"context"
	"os"
	"slices"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd3-go/pd3/fs"
	"github.com/pd3-go/pd3/internal/shm"
	"github.com/pd3-go/pd3/internal/testutil"
)

// residency asks the kernel (mincore) which pages of p it caches.
func residency(t *testing.T, p string, size int) []bool {
	t.Helper()
	f, err := os.Open(p)
	require.NoError(t, err)
	defer f.Close()
	out := make([]bool, (size+4095)/4096)
	require.NoError(t, shm.Residency(f, int64(size), func(i int64, r bool) { out[i] = r }))
	return out
}

// settle waits until mincore's view of p stops changing (read-ahead in
// flight has landed): two looks 50 ms apart that agree, within 10 s.
func settle(t *testing.T, p string, size int) {
	t.Helper()
	prev := residency(t, p, size)
	require.Eventually(t, func() bool {
		cur := residency(t, p, size)
		same := slices.Equal(prev, cur)
		prev = cur
		return same
	}, 10*time.Second, 50*time.Millisecond, "the page cache of %s settles", p)
}

// trackedHost starts a memory node and a host with the agent and its
// page-cache tracker, mounted in a new directory.
func trackedHost(t *testing.T) (context.Context, *Host, string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root for the mount, eBPF and drop_caches")
	}
	if err := fs.Available(); err != nil {
		t.Skip(err)
	}
	testutil.LockPageCache(t)
	ctx, cancel := context.WithCancel(context.Background())
	mn, err := StartMemnode(ctx, MemnodeConfig{})
	require.NoError(t, err)
	t.Cleanup(func() { cancel(); mn.Close() })
	dir := t.TempDir()
	h, err := Start(ctx, Config{Memnode: mn.Addr, Volumes: []VolumeSpec{{"disk0", 16 << 20}}, DPU: EmbeddedAgent, Mount: dir, CacheBytes: 4 << 20})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, h.Close(context.Background())) })
	require.NotNil(t, h.Tracker, "tracker off: %v", h.TrackerErr)
	return ctx, h, dir
}

// zeroFile writes a file of size zero bytes in dir and returns its path
// and inode number.
func zeroFile(t *testing.T, dir string, size int) (string, uint64) {
	t.Helper()
	p := dir + "/data"
	require.NoError(t, os.WriteFile(p, make([]byte, size), 0o644))
	var st syscall.Stat_t
	require.NoError(t, syscall.Stat(p, &st))
	return p, st.Ino
}

// inKernelView reports whether page i of inode ino is in h's kernel Host
// View.
func inKernelView(t *testing.T, h *Host, ino uint64, i int) bool {
	k, ok := h.FS.KeyOf(ino, uint64(i))
	require.True(t, ok)
	return h.KernelView.Set.Contains(uint64(k))
}

// TestTrackerSleepsWhenIdle: with nothing happening on the mount the
// tracker's reader stays asleep (polling every 2 ms, it woke about 150
// times in this window), and the first reads after the idle spell still
// reach Host View.
func TestTrackerSleepsWhenIdle(t *testing.T) {
	ctx, h, dir := trackedHost(t)
	const size = 1 << 20
	p := dir + "/data"
	require.NoError(t, os.WriteFile(p, make([]byte, size), 0o644))
	sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	require.NoError(t, h.Tracker.Sync(sctx))

	before := h.Tracker.Wakeups.Load()
	// The idle window: a timed poll would wake the reader here (the last
	// drain after Sync may fall in it: one wakeup).
	time.Sleep(300 * time.Millisecond)
	assert.LessOrEqual(t, h.Tracker.Wakeups.Load()-before, uint64(1), "the reader woke with nothing to read")

	// Out of the kernel's cache, then read again: the adds must arrive.
	f, err := os.Open(p)
	require.NoError(t, err)
	defer f.Close()
	require.NoError(t, unix.Fadvise(int(f.Fd()), 0, size, unix.FADV_DONTNEED))
	events := h.Tracker.Events.Load()
	_, err = f.ReadAt(make([]byte, 64<<10), 0)
	require.NoError(t, err)
	require.NoError(t, h.Tracker.Sync(sctx))
	assert.Greater(t, h.Tracker.Events.Load(), events, "the reads after the idle spell reached the tracker")
}

// TestTrackerFollowsKernelPageCache: reading part of a file through the
// mount puts exactly the pages the kernel caches (mincore's answer) in the
// kernel Host View, and dropping the caches takes them out again.
func TestTrackerFollowsKernelPageCache(t *testing.T) {
	ctx, h, dir := trackedHost(t)

	const size = 4 << 20
	p, ino := zeroFile(t, dir, size)
	inView := func(i int) bool { return inKernelView(t, h, ino, i) }
	sync := func() {
		sctx, c := context.WithTimeout(ctx, 10*time.Second)
		defer c()
		require.NoError(t, h.Tracker.Sync(sctx))
	}
	testutil.DropCaches(t)
	sync()
	for i := range size / 4096 {
		require.False(t, inView(i), "page %d in view after drop_caches", i)
	}

	// This VM reclaims page cache eagerly (DAMON), so a page may leave
	// between any two looks. The view, synced after the first look and
	// read before the second, must agree with the kernel on every page
	// whose residency did not change between the looks. A look that saw
	// more than a few pages go is taken again, reads and all; so is one
	// that disagreed, once: a read-ahead the mount was still serving
	// after the page cache looked settled shows as pages in the view that
	// mincore does not count yet (it counts a page once its read is done).
	// A tracker that is wrong disagrees on every look.
	var before, view, after []bool
	cached, changed, disagreed := 0, 0, 0
	for attempt := 0; attempt < 5; attempt++ {
		f, err := os.Open(p)
		require.NoError(t, err)
		buf := make([]byte, 256<<10)
		_, err = f.ReadAt(buf, 1<<20)
		require.NoError(t, err)
		_, err = f.ReadAt(buf[:4096], 3<<20)
		require.NoError(t, err)
		require.NoError(t, f.Close())
		// The reads started asynchronous read-ahead: its pages are in the
		// page cache (and in the view) at once, but mincore counts a page
		// only once its read completed. Let the read-ahead land first.
		settle(t, p, size)
		before = residency(t, p, size)
		sync()
		view = make([]bool, size/4096)
		for i := range view {
			view[i] = inView(i)
		}
		after = residency(t, p, size)
		cached, changed = 0, 0
		disagree := 0
		for i, r := range after {
			if r != before[i] {
				changed++
				continue
			}
			if r {
				cached++
			}
			if r != view[i] {
				disagree++
			}
		}
		if changed < 8 && (disagree == 0 || disagreed > 0) {
			break
		}
		if disagree > 0 {
			disagreed++
		}
		t.Logf("look %d: %d pages changed residency while we looked, the view disagreed on %d; again", attempt+1, changed, disagree)
	}
	for i, r := range after {
		if r == before[i] {
			assert.Equal(t, r, view[i], "page %d: kernel caches it %v", i, r)
		}
	}
	assert.Less(t, changed, 8, "pages reclaimed while we looked")
	assert.GreaterOrEqual(t, cached, 65-changed, "the reads cached at least the pages they read")
	assert.Less(t, cached, size/4096, "and not the whole file")
	assert.Zero(t, h.Tracker.Lost())

	testutil.DropCaches(t)
	sync()
	for i := range size / 4096 {
		assert.False(t, inView(i), "page %d still in view after drop_caches", i)
	}
	stats := h.KernelView.Files()
	require.NotEmpty(t, stats)
}

// TestTrackerMutesFilesTheMountReadsAhead: a file read as a stream through
// the mount, which then reads it ahead itself, is muted in the kernel: its
// events stop at the tracepoints, and Host View holds none of its pages
// while the stream's windows are held. Once they are gone (the reader
// closed the file) the file is heard again.
func TestTrackerMutesFilesTheMountReadsAhead(t *testing.T) {
	ctx, h, dir := trackedHost(t)
	const size = 16 << 20
	p, ino := zeroFile(t, dir, size)
	f, err := os.Open(p)
	require.NoError(t, err)
	defer f.Close()
	require.NoError(t, f.Sync())
	sync := func() {
		sctx, c := context.WithTimeout(ctx, 10*time.Second)
		defer c()
		require.NoError(t, h.Tracker.Sync(sctx))
	}
	heldPages := func() int {
		n := 0
		for i := range size / 4096 {
			if inKernelView(t, h, ino, i) {
				n++
			}
		}
		return n
	}

	require.NoError(t, unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED))
	buf := make([]byte, 1<<20)
	// A quarter of the file: the windows after it stay held (the reader
	// has not closed it or sought elsewhere), so the file stays muted.
	for off := int64(0); off < size/4; off += int64(len(buf)) {
		_, err := f.ReadAt(buf, off)
		require.NoError(t, err)
	}
	sync()
	require.NotZero(t, h.Tracker.Mutes.Load(), "the stream muted the file")
	require.Equal(t, 1, h.Tracker.MutedFiles())
	assert.Zero(t, heldPages(), "Host View holds pages of a muted file")
	hr, _, _ := h.FS.ReadAheadStats()
	require.NotZero(t, hr, "the mount read the file ahead")

	// The reader closes the file: its windows go, and it is heard again.
	require.NoError(t, f.Close())
	require.Eventually(t, func() bool { return h.Tracker.MutedFiles() == 0 }, 10*time.Second, time.Millisecond, "the file is unmuted")
	g, err := os.Open(p)
	require.NoError(t, err)
	defer g.Close()
	require.NoError(t, unix.Fadvise(int(g.Fd()), 0, 0, unix.FADV_DONTNEED))
	sync()
	_, err = g.ReadAt(buf[:4096], 12<<20)
	require.NoError(t, err)
	sync()
	assert.NotZero(t, heldPages(), "a read after the stream reached Host View")
}

// TestTrackerFollowsLargeFilesOnly: the tracker follows the files of
// fs.FollowFrom bytes or more, from the write that grows a file there or
// its open; reading a smaller file sends the tracker nothing. A file the
// kernel forgets is no longer followed, and is again from its next open.
func TestTrackerFollowsLargeFilesOnly(t *testing.T) {
	ctx, h, dir := trackedHost(t)
	sync := func() {
		sctx, c := context.WithTimeout(ctx, 10*time.Second)
		defer c()
		require.NoError(t, h.Tracker.Sync(sctx))
	}
	readCold := func(p string, n int) {
		f, err := os.Open(p)
		require.NoError(t, err)
		defer f.Close()
		require.NoError(t, unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED))
		_, err = f.ReadAt(make([]byte, n), 0)
		require.NoError(t, err)
	}
	small := dir + "/small"
	require.NoError(t, os.WriteFile(small, make([]byte, 64<<10), 0o644))
	sync()
	require.Zero(t, h.Tracker.FollowedFiles(), "a file below fs.FollowFrom")
	events := h.Tracker.Events.Load()
	readCold(small, 64<<10)
	sync()
	assert.Equal(t, events, h.Tracker.Events.Load(), "reading a small file sent events")

	// Grown past FollowFrom by a write: followed from then on.
	f, err := os.OpenFile(small, os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.WriteAt(make([]byte, 4096), fs.FollowFrom)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	assert.Equal(t, 1, h.Tracker.FollowedFiles(), "a file grown past fs.FollowFrom")
	events = h.Tracker.Events.Load()
	readCold(small, 64<<10)
	sync()
	assert.Greater(t, h.Tracker.Events.Load(), events, "reading a followed file sent no events")

	// The kernel forgets the file (drop_caches 2: dentries and inodes,
	// once nothing holds it): not followed until it is opened again.
	syscall.Sync()
	require.Eventually(t, func() bool {
		require.NoError(t, os.WriteFile("/proc/sys/vm/drop_caches", []byte("2"), 0))
		return h.Tracker.FollowedFiles() == 0
	}, 10*time.Second, 50*time.Millisecond, "the forgotten file is still followed")
	readCold(small, 4096)
	assert.Equal(t, 1, h.Tracker.FollowedFiles(), "followed again from its open")
}
