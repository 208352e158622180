package fs_test

import (
	"errors"
	"os"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/pd3-go/pd3/fs"
	"github.com/pd3-go/pd3/internal/procgov"
	"github.com/pd3-go/pd3/internal/sockio"
	"github.com/pd3-go/pd3/pageid"
)

// READs and WRITEs count as requests the host serves while they run, as
// the NBD and page servers' do: the memory-node reader that consults the
// count must see FUSE load too (sockio.Reader.DirectIf).
func TestReadsAndWritesCountAsServed(t *testing.T) {
	var busy sockio.Busy
	var during atomic.Int64 // the count seen inside a READ
	e := mountWith(t, startNode(t, 0), "", 0, func(c *fs.Config) {
		c.Busy = &busy
		c.OnRead = func(pageid.Key, int, uint64) { during.Store(int64(busy.Count())) }
	})
	data := randomBytes(64 << 10) // past the inode: the file gets a volume
	w, err := os.Create(e.path("f"))
	require.NoError(t, err)
	_, err = w.Write(data)
	require.NoError(t, err)
	require.NoError(t, w.Sync()) // the kernel's write-back cache has sent every WRITE
	require.NoError(t, w.Close())
	assert.Zero(t, busy.Count(), "a WRITE left counted")
	f := directFile(t, e.path("f"), os.O_RDONLY)
	buf := alignedBuf(4096)
	_, err = f.ReadAt(buf, 8192)
	require.NoError(t, err)
	assert.Equal(t, data[8192:8192+4096], buf)
	assert.EqualValues(t, 1, during.Load(), "a READ was not counted while served")
	assert.Zero(t, busy.Count(), "a READ left counted")
}

// Every request the mount answers, not only READs and WRITEs, has every P
// back before it runs (servedFS): a host on its lone Ps through a run of
// cached NBD reads must not serve a stream of metadata requests on them.
func TestEveryRequestBringsEveryPBack(t *testing.T) {
	var busy sockio.Busy
	g := procgov.NewWith(1, 2, func(int) int { return 2 }) // counts, changes nothing
	e := mountWith(t, startNode(t, 0), "", 0, func(c *fs.Config) { c.Busy, c.Procs = &busy, g })
	require.NoError(t, os.WriteFile(e.path("f"), []byte("x"), 0o644))
	missing := func(err error) error {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return err
	}
	for _, tc := range []struct {
		name string
		op   func() error
	}{
		{"MKDIR", func() error { return os.Mkdir(e.path("d"), 0o755) }},
		{"RENAME", func() error { return os.Rename(e.path("d"), e.path("d2")) }},
		{"LOOKUP of a missing name", func() error { _, err := os.Stat(e.path("nothing")); return missing(err) }},
		{"SYMLINK", func() error { return os.Symlink("f", e.path("l")) }},
		{"READLINK", func() error { _, err := os.Readlink(e.path("l")); return err }},
		{"SETXATTR", func() error { return unix.Setxattr(e.path("f"), "user.k", []byte("v"), 0) }},
		{"STATFS", func() error { var st unix.Statfs_t; return unix.Statfs(e.path(""), &st) }},
		{"UNLINK", func() error { return os.Remove(e.path("l")) }},
		{"RMDIR", func() error { return os.Remove(e.path("d2")) }},
	} {
		// Room for the back-off's longest run (65 536 hits), even if a
		// request the kernel sends late (a RELEASE) breaks one.
		for i := 0; !g.Low() && i < 1<<20; i++ {
			g.Hit()
		}
		require.True(t, g.Low(), "the governor went low before %s", tc.name)
		require.NoError(t, tc.op(), tc.name)
		assert.False(t, g.Low(), "%s was served on the lone Ps", tc.name)
	}
	assert.Zero(t, busy.Count(), "a request left counted")
}
