package dpu

import (
	"context"
	"encoding/binary"
	"net"
	"testing"
	"time"

	"github.com/pd3-go/pd3/hostview"
	"github.com/pd3-go/pd3/internal/shm"
	"github.com/pd3-go/pd3/loadingzone"
	"github.com/pd3-go/pd3/memnode"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type rig struct {
	e   *Engine
	hv  *hostview.Set
	lz  *loadingzone.Zone
	vol memnode.VolumeInfo
}

func newRig(t *testing.T, lzRecords int) *rig {
	t.Helper()
	ctx := context.Background()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := &memnode.Server{Store: memnode.NewStore(0)}
	go srv.Serve(ctx, ln)
	c, err := memnode.Dial(ctx, ln.Addr().String(), memnode.ClientOptions{})
	require.NoError(t, err)
	vol, err := c.Create(ctx, "v", 1<<20)
	require.NoError(t, err)
	region, err := shm.Create("", loadingzone.Size(lzRecords))
	require.NoError(t, err)
	lz, err := loadingzone.Format(region.Bytes(), lzRecords, 1)
	require.NoError(t, err)
	hv := hostview.New(1024, 1)
	lz.OnDrop = func(k uint64) { hv.Delete(k) }
	e := NewEngine(c, hv, lz, 64)
	t.Cleanup(func() {
		e.Close()
		assert.NoError(t, lz.Check())
		assert.NoError(t, hv.Check())
		region.Close()
		c.Close()
		srv.Close()
	})
	return &rig{e: e, hv: hv, lz: lz, vol: vol}
}

func versioned(v uint64) []byte {
	p := make([]byte, memnode.PageSize)
	binary.LittleEndian.PutUint64(p, v)
	return p
}

// TestWriteBackNeverLeavesOldCopy: after a write-back of page k returns,
// the Loading Zone must not serve an older version of k — whether the old
// copy was placed before the write-back or was still in flight.
func TestWriteBackNeverLeavesOldCopy(t *testing.T) {
	r := newRig(t, 256)
	ctx := context.Background()
	dst := make([]byte, memnode.PageSize)
	for i := uint64(0); i < 200; i++ {
		k := memnode.MakeKey(r.vol.ID, i%256)
		require.NoError(t, r.e.WritePages(ctx, []memnode.Key{k}, [][]byte{versioned(2 * i)}))
		if i%2 == 0 {
			// Old copy already placed.
			placed := r.e.Placed.Load()
			r.e.Prefetch(k)
			require.Eventually(t, func() bool { return r.e.Placed.Load() > placed }, 5*time.Second, time.Millisecond)
			assert.True(t, r.hv.Contains(uint64(k)), "a placed page is in Host View")
		} else {
			// Old copy in flight: the prefetch is queued before the write.
			r.e.Prefetch(k)
		}
		require.NoError(t, r.e.WritePages(ctx, []memnode.Key{k}, [][]byte{versioned(2*i + 1)}))
		assert.False(t, r.hv.Contains(uint64(k)), "a written-back page leaves Host View")
		// Let any in-flight prefetch complete, then look.
		time.Sleep(200 * time.Microsecond)
		if r.lz.CheckAndReturn(uint64(k), dst) == memnode.PageSize {
			require.Equal(t, 2*i+1, binary.LittleEndian.Uint64(dst), "Loading Zone served a page older than its write-back (round %d)", i)
		}
	}
	assert.Positive(t, r.lz.Invalidated.Load(), "placed copies were invalidated")
	t.Logf("invalidated %d, stale in-flight dropped %d", r.lz.Invalidated.Load(), r.e.Stale.Load())
}

// TestPrefetchAfterWriteSeesIt: a prefetch issued after a write-back
// returns reads the written data (same connection, in order).
func TestPrefetchAfterWriteSeesIt(t *testing.T) {
	r := newRig(t, 64)
	ctx := context.Background()
	dst := make([]byte, memnode.PageSize)
	for i := uint64(1); i <= 50; i++ {
		k := memnode.MakeKey(r.vol.ID, 7)
		require.NoError(t, r.e.WritePages(ctx, []memnode.Key{k}, [][]byte{versioned(i)}))
		placed := r.e.Placed.Load()
		r.e.Prefetch(k)
		require.Eventually(t, func() bool { return r.e.Placed.Load() > placed }, 5*time.Second, time.Millisecond)
		require.Equal(t, memnode.PageSize, r.lz.CheckAndReturn(uint64(k), dst))
		require.Equal(t, i, binary.LittleEndian.Uint64(dst))
	}
}

func TestDuplicatePrefetchesAreDeduped(t *testing.T) {
	r := newRig(t, 64)
	k := memnode.MakeKey(r.vol.ID, 3)
	for i := 0; i < 20; i++ {
		r.e.Prefetch(k)
	}
	require.Eventually(t, func() bool { return r.e.Placed.Load()+r.e.Deduped.Load() == 20 || r.e.Issued.Load() > 1 }, 5*time.Second, time.Millisecond)
	assert.Positive(t, r.e.Deduped.Load())
}
