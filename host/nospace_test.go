package host

import (
	"context"
	"encoding/binary"
	"testing"
	"time"

	"github.com/pd3-go/pd3/internal/nbdclient"
	"github.com/pd3-go/pd3/internal/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestFullDiskAtThePersistentNode: over NBD, with the memory node's
// --persist directory on a small filesystem, writes are answered ENOSPC
// once it fills; reads succeed throughout (the host evicts clean pages, or
// reads past its cache, rather than fail a read because a write-back did);
// once there is room, writes succeed again with no restart; every page a
// FLUSH acknowledged is at the node.
func TestFullDiskAtThePersistentNode(t *testing.T) {
	dir, resize := testutil.SmallTmpfs(t, "3m")
	ctx := context.Background()
	node, err := StartMemnode(ctx, MemnodeConfig{Persist: dir})
	require.NoError(t, err)
	t.Cleanup(func() { node.Close() })
	h, err := Start(ctx, Config{
		Memnode: node.Addr, Volumes: []VolumeSpec{{"disk0", 64 << 20}},
		CacheBytes: 64 * 4096, NBDListen: "127.0.0.1:0",
	})
	require.NoError(t, err)
	t.Cleanup(func() { h.Close(ctx) })
	nc, err := nbdclient.Dial(h.NBDAddr, "disk0")
	require.NoError(t, err)
	defer nc.Close()

	page := func(i uint64, gen byte) []byte {
		p := make([]byte, 4096)
		for j := range p {
			p[j] = gen + byte(i) + byte(j*7)
		}
		binary.LittleEndian.PutUint64(p, i)
		return p
	}
	flushed := map[uint64][]byte{} // acknowledged by a FLUSH
	var batch map[uint64][]byte
	var refusal error
	for i := uint64(0); i < 4096 && refusal == nil; i++ { // 16 MiB: far more than the disk holds
		if batch == nil {
			batch = map[uint64][]byte{}
		}
		p := page(i, 1)
		if refusal = nc.Write(i*4096, p); refusal != nil {
			break
		}
		batch[i] = p
		if i%16 == 15 {
			if refusal = nc.Flush(); refusal == nil {
				for k, v := range batch {
					flushed[k] = v
				}
				batch = nil
			}
		}
	}
	require.Error(t, refusal, "16 MiB never filled a 3 MiB disk")
	assert.Contains(t, refusal.Error(), "ENOSPC")
	assert.Greater(t, len(flushed), 32)

	got := make([]byte, 4096)
	readAll := func() {
		for i, want := range flushed {
			require.NoError(t, nc.Read(i*4096, got), "page %d with the node's disk full", i)
			require.Equal(t, want, got, "page %d", i)
		}
		require.NoError(t, nc.Read(8000*4096, got), "a page never written")
		require.Equal(t, make([]byte, 4096), got)
	}
	readAll()
	assert.Error(t, nc.Flush(), "still full")
	readAll()

	resize("64m")
	require.Eventually(t, func() bool { return nc.Flush() == nil }, 15*time.Second, 20*time.Millisecond,
		"writes are taken again once there is room, with no restart")
	for k, v := range batch {
		flushed[k] = v
	}
	for i := uint64(5000); i < 5064; i++ {
		p := page(i, 2)
		require.NoError(t, nc.Write(i*4096, p))
		flushed[i] = p
	}
	require.NoError(t, nc.Flush())
	readAll()
	nc.Close()
	require.NoError(t, h.Close(ctx))
	vol, err := node.Server.Store.Open("disk0")
	require.NoError(t, err)
	for i, want := range flushed {
		require.NoError(t, node.Server.Store.ReadAt(vol.ID, i*4096, got))
		require.Equal(t, want, got, "page %d at the node", i)
	}
}
