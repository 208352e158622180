package fs

import (
	"context"
	"sync"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd3-go/pd3/pageid"
)

// TestSmallFileMovesUnderConcurrentWriters: a write into a small file's
// inode races the write that moves the file to a volume; a reader runs
// alongside. The kernel serialises a file's writes (its inode lock), so
// the nodes are driven directly, as concurrent WRITEs of the writeback
// cache would drive them. No write is lost across the move and no read
// sees bytes never written. Run under -race.
func TestSmallFileMovesUnderConcurrentWriters(t *testing.T) {
	b := &slowDeletes{vols: map[string]pageid.VolumeInfo{}, release: make(chan struct{}), started: make(chan struct{}, 1)}
	close(b.release)
	ctx := context.Background()
	f := openOn(t, b)
	t.Cleanup(func() { assert.NoError(t, f.Close(ctx)) })
	const region = 3000 // the first fits the inode, the second does not
	fill := func(c byte) []byte {
		b := make([]byte, region)
		for i := range b {
			b[i] = c
		}
		return b
	}
	for round := range 200 {
		ino := uint64(1000 + round)
		f.mu.Lock()
		f.inodes[ino] = &inode{attrs: attrs{Ino: ino, Mode: syscall.S_IFREG | 0o644, Nlink: 1}}
		f.mu.Unlock()
		n := &node{f: f, ino: ino}
		start := make(chan struct{})
		var wg sync.WaitGroup
		for w := range 2 {
			wg.Go(func() {
				<-start
				_, e := n.Write(ctx, nil, fill(byte('a'+w)), int64(w*region))
				assert.Zero(t, e)
			})
		}
		wg.Go(func() {
			<-start
			for range 10 {
				res, e := n.Read(ctx, nil, make([]byte, 2*region), 0)
				if !assert.Zero(t, e) {
					return
				}
				got, _ := res.Bytes(nil)
				for i, c := range got {
					if c != 0 && c != byte('a'+i/region) {
						t.Errorf("round %d: byte %d is %q", round, i, c)
						return
					}
				}
			}
		})
		close(start)
		wg.Wait()
		res, e := n.Read(ctx, nil, make([]byte, 2*region), 0)
		require.Zero(t, e)
		got, _ := res.Bytes(nil)
		require.Len(t, got, 2*region, "round %d", round)
		for i, c := range got {
			require.Equal(t, byte('a'+i/region), c, "round %d: byte %d", round, i)
		}
	}
}
