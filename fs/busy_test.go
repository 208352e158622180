package fs_test

import (
	"os"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd3-go/pd3/fs"
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
