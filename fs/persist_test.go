package fs_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pd3-go/pd3/fs"
	"github.com/pd3-go/pd3/host"
	"github.com/pd3-go/pd3/internal/fsmodel"
	"github.com/pd3-go/pd3/internal/testutil"
	"github.com/pd3-go/pd3/memnode"
	"github.com/pd3-go/pd3/pageid"
	"github.com/pd3-go/pd3/pagestore"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestRemount: after a clean unmount a new host sees the same tree and
// bytes, with the cache far smaller than the data so most of it comes
// from the memory node.
func TestRemount(t *testing.T) {
	addr := startNode(t, 0)
	e := mount(t, addr, "", 1<<20)
	rng := rand.New(rand.NewPCG(testutil.Seed(t), 1))
	require.NoError(t, os.MkdirAll(e.path("src/pkg/deep"), 0o755))
	for i := range 20 {
		b := make([]byte, rng.IntN(300_000))
		for j := range b {
			b[j] = byte(rng.Uint32())
		}
		require.NoError(t, os.WriteFile(e.path(fmt.Sprintf("src/pkg/deep/f%d", i)), b, 0o644))
	}
	require.NoError(t, os.Symlink("pkg/deep/f1", e.path("src/link")))
	require.NoError(t, os.Link(e.path("src/pkg/deep/f2"), e.path("src/hard")))
	require.NoError(t, os.Rename(e.path("src/pkg/deep/f3"), e.path("src/moved")))
	require.NoError(t, os.Remove(e.path("src/pkg/deep/f4")))
	want := fsmodel.Tree(t, e.dir)
	dir := e.dir
	e.unmount()

	e = mount(t, addr, dir, 1<<20)
	assert.Equal(t, want, fsmodel.Tree(t, e.dir))
	assert.Equal(t, uint64(2), nlink(t, e.path("src/hard")))
}

// TestCrashKeepsFsynced: a host that goes away without writing anything
// back loses nothing that was fsynced; files created after the last
// snapshot leave no orphan volumes behind.
func TestCrashKeepsFsynced(t *testing.T) {
	addr := startNode(t, 0)
	e := mount(t, addr, "", 1<<20)
	synced := bytes.Repeat([]byte("fsynced "), 100_000)
	f, err := os.Create(e.path("durable"))
	require.NoError(t, err)
	_, err = f.Write(synced)
	require.NoError(t, err)
	require.NoError(t, f.Sync())
	require.NoError(t, f.Close())
	require.NoError(t, os.WriteFile(e.path("volatile"), []byte("maybe"), 0o644))
	dir := e.dir
	e.crash()

	e = mount(t, addr, dir, 1<<20)
	got, err := os.ReadFile(e.path("durable"))
	require.NoError(t, err)
	assert.True(t, bytes.Equal(synced, got), "fsynced file differs after the crash")
	_, err = os.Stat(e.path("volatile"))
	assert.ErrorIs(t, err, os.ErrNotExist, "never fsynced, never snapshotted")
	vols, err := e.c.List(context.Background())
	require.NoError(t, err)
	var names []string
	for _, v := range vols {
		names = append(names, v.Name)
	}
	// The file's volume is named after its inode, or is one made ahead if
	// the pool filled between the file's asking and its looking (pool.go).
	vol := e.fs.VolumeOf(inode(t, e.path("durable")))
	require.NotEmpty(t, vol, "the fsynced file has a data volume")
	assert.ElementsMatch(t, []string{"fs.pd3.meta", vol}, names, "orphan volumes left after the crash")
}

func inode(t *testing.T, p string) uint64 {
	t.Helper()
	var st syscall.Stat_t
	require.NoError(t, syscall.Stat(p, &st))
	return st.Ino
}

// TestConcurrentFiles: writers on their own files and on disjoint ranges
// of one shared file, with readers checking what they read, under -race.
func TestConcurrentFiles(t *testing.T) {
	e := mount(t, startNode(t, 0), "", 2<<20)
	const writers, chunk, rounds = 4, 64 << 10, 8
	shared, err := os.Create(e.path("shared"))
	require.NoError(t, err)
	defer shared.Close()
	var wg sync.WaitGroup
	errs := make(chan error, 2*writers)
	for w := range writers {
		wg.Add(2)
		go func() {
			defer wg.Done()
			for r := range rounds {
				b := bytes.Repeat([]byte{byte(w*rounds + r)}, chunk)
				if err := os.WriteFile(e.path(fmt.Sprintf("own%d", w)), b, 0o644); err != nil {
					errs <- err
					return
				}
				if _, err := shared.WriteAt(b, int64(w*chunk)); err != nil {
					errs <- err
					return
				}
			}
		}()
		go func() {
			defer wg.Done()
			for range rounds * 4 {
				b, err := os.ReadFile(e.path(fmt.Sprintf("own%d", w)))
				if os.IsNotExist(err) {
					continue
				}
				if err != nil {
					errs <- err
					return
				}
				// Reads are not atomic with respect to a rewrite (truncate,
				// then write) on any Linux filesystem; what must hold is
				// that every byte is one this writer wrote, or a zero.
				for _, c := range b {
					if c != 0 && (int(c) < w*rounds || int(c) >= (w+1)*rounds) {
						errs <- fmt.Errorf("own%d holds byte %d, written to no file of writer %d", w, c, w)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	for w := range writers {
		b, err := os.ReadFile(e.path(fmt.Sprintf("own%d", w)))
		require.NoError(t, err)
		assert.Equal(t, bytes.Repeat([]byte{byte(w*rounds + rounds - 1)}, chunk), b, "own%d after the last round", w)
	}
	b, err := os.ReadFile(e.path("shared"))
	require.NoError(t, err)
	require.Len(t, b, writers*chunk)
	for w := range writers {
		assert.Equal(t, bytes.Repeat([]byte{byte(w*rounds + rounds - 1)}, chunk), b[w*chunk:(w+1)*chunk], "writer %d", w)
	}
}

// TestNoSpace: a memory node without room gives ENOSPC at fsync, and the
// filesystem keeps working for what fits.
func TestNoSpace(t *testing.T) {
	e := mount(t, startNode(t, 8<<20), "", 32<<20)
	f, err := os.Create(e.path("big"))
	require.NoError(t, err)
	defer f.Close()
	_, err = f.Write(make([]byte, 4<<20))
	require.NoError(t, err)
	_, err = f.Write(bytes.Repeat([]byte{1}, 16<<20))
	require.NoError(t, err, "the page store takes the write")
	assert.ErrorIs(t, f.Sync(), syscall.ENOSPC)
	require.NoError(t, f.Truncate(1<<20))
	require.NoError(t, f.Sync(), "after truncating, everything fits")
}

// TestVolumesShareTheCache: a volume written over NBD reads the same
// through volumes/, and the other way round.
func TestVolumesShareTheCache(t *testing.T) {
	addr := startNode(t, 0)
	e := mount(t, addr, "", 0, host.VolumeSpec{Name: "disk0", Size: 8 << 20})
	p := e.path("volumes/disk0")
	fi, err := os.Stat(p)
	require.NoError(t, err)
	assert.Equal(t, int64(8<<20), fi.Size())
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	require.NoError(t, err)
	defer f.Close()
	_, err = f.WriteAt([]byte("via fuse"), 4096)
	require.NoError(t, err)
	got := make([]byte, 8)
	require.NoError(t, e.st.ReadRange(context.Background(), e.nbd[0].ID, 4096, got))
	assert.Equal(t, "via fuse", string(got), "the page store (NBD's path) sees the FUSE write")
	require.NoError(t, e.st.WriteRange(context.Background(), e.nbd[0].ID, 8192, []byte("via nbd!")))
	_, err = f.ReadAt(got, 8192)
	require.NoError(t, err)
	assert.Equal(t, "via nbd!", string(got), "no kernel page cache hides the NBD write")
	out, err := exec.Command("ls", e.path("volumes")).CombinedOutput()
	require.NoError(t, err)
	assert.Equal(t, "disk0", strings.TrimSpace(string(out)))
}

// TestLease: a second host cannot open a mounted filesystem; after a
// crash it waits out the lease; a host whose lease is taken over stops
// changing anything (EROFS) instead of fighting the new owner.
func TestLease(t *testing.T) {
	addr := startNode(t, 0)
	e := mount(t, addr, "", 0)
	ctx := context.Background()
	c2, err := memnode.Dial(ctx, addr, memnode.ClientOptions{})
	require.NoError(t, err)
	defer c2.Close()
	st2, err := pagestore.New(memnode.Remote{C: c2}, pagestore.Options{CacheBytes: 1 << 20})
	require.NoError(t, err)
	start := time.Now()
	_, err = fs.Open(ctx, fs.Config{Backend: c2, Store: st2, LeaseTTL: time.Second})
	assert.ErrorIs(t, err, fs.ErrMounted)
	assert.Less(t, time.Since(start), 5*time.Second)

	// Another host takes the word over behind e's back.
	meta, err := c2.Open(ctx, "fs.pd3.meta")
	require.NoError(t, err)
	cur, err := c2.CompareAndSwap(ctx, meta.ID, 4096, 0, 0)
	require.NoError(t, err)
	foreign := uint64(time.Now().Add(time.Hour).Unix())<<32 | 12345
	prev, err := c2.CompareAndSwap(ctx, meta.ID, 4096, cur, foreign)
	require.NoError(t, err)
	require.Equal(t, cur, prev)
	require.Eventually(t, func() bool {
		err := os.WriteFile(e.path("after"), []byte("x"), 0o644)
		return errors.Is(err, syscall.EROFS)
	}, 5*time.Second, 50*time.Millisecond, "the fenced host still accepts changes")
	err = e.m.Unmount(ctx)
	assert.ErrorIs(t, err, fs.ErrMounted, "a fenced host writes no metadata, even at unmount")
	e.m = nil
	e.c.Close()
}

// TestCrashedHostLeaseExpires: after a crash the next host waits for the
// lease (1 s here) instead of failing.
func TestCrashedHostLeaseExpires(t *testing.T) {
	addr := startNode(t, 0)
	e := mount(t, addr, "", 0)
	dir := e.dir
	e.crash()
	start := time.Now()
	mount(t, addr, dir, 0)
	assert.Less(t, time.Since(start), 4*time.Second)
}

// TestFsyncWritesOnlyItsFile: fsync of one file leaves another file's
// dirty pages in the host cache (they are not its durability), and a
// crash then keeps the fsynced file whole.
func TestFsyncWritesOnlyItsFile(t *testing.T) {
	addr := startNode(t, 0)
	e := mount(t, addr, "", 16<<20)
	other := bytes.Repeat([]byte{0xBB}, 1<<20)
	require.NoError(t, os.WriteFile(e.path("other"), other, 0o644))
	before := e.st.Stats().DirtyPages
	f, err := os.Create(e.path("synced"))
	require.NoError(t, err)
	data := bytes.Repeat([]byte{0xAA}, 1<<20)
	_, err = f.Write(data)
	require.NoError(t, err)
	require.NoError(t, f.Sync())
	require.NoError(t, f.Close())
	assert.GreaterOrEqual(t, e.st.Stats().DirtyPages, before, "fsync of one file wrote back another's pages")
	assert.Positive(t, e.st.Stats().DirtyPages)
	dir := e.dir
	e.crash()
	e = mount(t, addr, dir, 16<<20)
	got, err := os.ReadFile(e.path("synced"))
	require.NoError(t, err)
	assert.True(t, bytes.Equal(data, got))
}

// TestOnWriteSeesWrittenPages: every page a write puts in the host cache
// is reported (the agent's Host View adds them), unaligned edges included,
// and nothing else is.
func TestOnWriteSeesWrittenPages(t *testing.T) {
	var mu sync.Mutex
	seen := map[uint64]bool{}
	e := mountWith(t, startNode(t, 0), "", 0, func(c *fs.Config) {
		c.OnWrite = func(first pageid.Key, pages int) {
			mu.Lock()
			defer mu.Unlock()
			for i := range pages {
				seen[first.Page()+uint64(i)] = true
			}
		}
	})
	f, err := os.Create(e.path("f"))
	require.NoError(t, err)
	defer f.Close()
	_, err = f.WriteAt([]byte("0123456789"), 4090) // pages 0 and 1
	require.NoError(t, err)
	_, err = f.WriteAt(make([]byte, 2*4096), 5*4096) // pages 5 and 6
	require.NoError(t, err)
	require.NoError(t, f.Sync())
	mu.Lock()
	defer mu.Unlock()
	for _, p := range []uint64{0, 1, 5, 6} {
		assert.True(t, seen[p], "page %d", p)
	}
	for p := range seen {
		assert.Contains(t, []uint64{0, 1, 5, 6}, p, "page %d was not written", p)
	}
}

// TestUnlinkFreesVolumesByUnmount: the volumes of unlinked files are
// deleted at the memory node in the background, and those still queued
// when the filesystem is unmounted are deleted before the unmount ends.
func TestUnlinkFreesVolumesByUnmount(t *testing.T) {
	addr := startNode(t, 0)
	e := mount(t, addr, "", 1<<20)
	for i := range 50 { // past inlineMax: each has a volume
		require.NoError(t, os.WriteFile(e.path(fmt.Sprintf("f%d", i)), make([]byte, 5000), 0o644))
	}
	for i := range 50 {
		require.NoError(t, os.Remove(e.path(fmt.Sprintf("f%d", i))))
	}
	e.unmount()
	c, err := memnode.Dial(context.Background(), addr, memnode.ClientOptions{})
	require.NoError(t, err)
	defer c.Close()
	vols, err := c.List(context.Background())
	require.NoError(t, err)
	require.Len(t, vols, 1, "only the metadata volume is left: %v", vols)
	assert.Equal(t, "fs.pd3.meta", vols[0].Name)
}

// TestCreateTakesVolumesMadeAhead: from the first file that outgrows its
// inode on, the mount keeps empty file volumes made ahead and such a file
// takes one; the files
// made so keep their data across a remount, and new files on the next
// mount never take their volumes. (TestUnlinkFreesVolumesByUnmount sees
// the unused ones deleted at unmount.)
func TestCreateTakesVolumesMadeAhead(t *testing.T) {
	addr := startNode(t, 0)
	e := mount(t, addr, "", 1<<20)
	// Past inlineMax: files of a page or less take no volume.
	big := func(s string) []byte { return append([]byte(s), make([]byte, 5000)...) }
	require.NoError(t, os.WriteFile(e.path("first"), big("first"), 0o644))
	require.Eventually(t, func() bool { return e.fs.VolumesMadeAhead() == fs.PoolSize }, 10*time.Second, 10*time.Millisecond)
	for i := range 10 {
		require.NoError(t, os.WriteFile(e.path(fmt.Sprintf("f%d", i)), big(fmt.Sprintf("file %d", i)), 0o644))
	}
	dir := e.dir
	e.unmount()

	e = mount(t, addr, dir, 1<<20)
	names := func() []string {
		vols, err := e.c.List(context.Background())
		require.NoError(t, err)
		var out []string
		for _, v := range vols {
			out = append(out, v.Name)
		}
		return out
	}
	made := 0
	for _, n := range names() {
		if strings.HasPrefix(n, "fs.pd3.v") {
			made++
		}
	}
	assert.Equal(t, 10, made, "the ten files' volumes were made ahead, and no unused one is left: %v", names())
	assert.Len(t, names(), 12, "meta, first and the ten")
	for i := range 10 {
		got, err := os.ReadFile(e.path(fmt.Sprintf("f%d", i)))
		require.NoError(t, err)
		assert.Equal(t, big(fmt.Sprintf("file %d", i)), got)
	}
	for i := range 40 { // past the pool: made ahead on this mount too, under new names
		require.NoError(t, os.WriteFile(e.path(fmt.Sprintf("g%d", i)), big("g"), 0o644))
	}
	for i := range 10 {
		got, err := os.ReadFile(e.path(fmt.Sprintf("f%d", i)))
		require.NoError(t, err)
		assert.Equal(t, big(fmt.Sprintf("file %d", i)), got, "a new file took an old one's volume")
	}
}
