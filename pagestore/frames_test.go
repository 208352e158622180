package pagestore

import (
	"context"
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd3-go/pd3/pageid"
)

// TestFramesOutsideTheHeap: a cache whose frames are mapped outside the
// Go heap (the default but under the race detector) adds to the heap only
// its tables, so the collector's pacing is not scaled by the cache's size
// (docs/decisions.md, 42); and it serves as one in the heap does: pages
// written, evicted, written back and read again.
func TestFramesOutsideTheHeap(t *testing.T) {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	big, err := newStore(NewMemRemote(), Options{CacheBytes: 256 << 20}, false)
	require.NoError(t, err)
	runtime.ReadMemStats(&after)
	assert.Less(t, after.HeapAlloc-min(after.HeapAlloc, before.HeapAlloc), uint64(64<<20),
		"a 256 MiB cache adds less than 64 MiB to the heap (its page table and policy)")
	runtime.KeepAlive(big)

	rem := NewMemRemote()
	s, err := newStore(rem, Options{CacheBytes: 16 * pageid.Size, Policy: "s3fifo"}, false)
	require.NoError(t, err)
	s.AddVolume(pageid.VolumeInfo{ID: 1, Name: "v", Size: 64 * pageid.Size})
	ctx := context.Background()
	for p := range uint64(64) {
		k := pageid.MakeKey(1, p)
		require.NoError(t, s.Put(ctx, k, fill(k, 1)))
	}
	require.NoError(t, s.Flush(ctx))
	buf := make([]byte, pageid.Size)
	for p := range uint64(64) {
		k := pageid.MakeKey(1, p)
		require.NoError(t, s.Get(ctx, k, buf))
		assert.Equal(t, fill(k, 1), buf, "page %d", p)
		assert.Equal(t, fill(k, 1), rem.Page(k), "page %d at the remote", p)
	}
	assert.Positive(t, s.Stats().Evictions, "frames were reused")
	require.NoError(t, s.Check())
}
