package pagestore

import (
	"context"
	"encoding/binary"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd3-go/pd3/pageid"
)

// raRig is a store of 16 frames over a remote holding version 1 of
// every page of a 256-page volume 1.
func raRig(t *testing.T) (*Store, *MemRemote) {
	ctx := context.Background()
	rem := NewMemRemote()
	for p := range uint64(256) {
		k := pageid.MakeKey(1, p)
		require.NoError(t, rem.WritePages(ctx, []pageid.Key{k}, [][]byte{fill(k, 1)}))
	}
	s := newTestStore(t, rem, 16, "s3fifo", 256)
	t.Cleanup(s.StopReadAhead)
	return s, rem
}

// versions reads pages [first, first+n) of volume 1 as a stream and
// returns each page's version, checking that each page is its own.
func versions(t *testing.T, s *Store, first, n uint64) []uint64 {
	t.Helper()
	p := make([]byte, n*pageid.Size)
	require.NoError(t, s.ReadStream(context.Background(), 1, first*pageid.Size, p))
	v := make([]uint64, n)
	for i := range v {
		pg := p[i*pageid.Size:]
		require.Equal(t, uint64(pageid.MakeKey(1, first+uint64(i))), binary.LittleEndian.Uint64(pg), "page %d", first+uint64(i))
		v[i] = binary.LittleEndian.Uint64(pg[8:])
	}
	return v
}

func allOf(n int, v uint64) []uint64 {
	s := make([]uint64, n)
	for i := range s {
		s[i] = v
	}
	return s
}

// TestReadAheadServesStreamReads: pages read ahead are taken from the
// window, with no read of the remote; a read that straddles a window and
// pages no window holds gets both right; a window read to its end is
// freed.
func TestReadAheadServesStreamReads(t *testing.T) {
	s, _ := raRig(t)
	require.True(t, s.ReadAhead(pageid.MakeKey(1, 32), 32))
	assert.False(t, s.ReadAhead(pageid.MakeKey(1, 48), 32), "a window already holds page 48")
	s.ra.fill.Wait()
	reads := s.Stats().RemoteReads
	assert.Equal(t, allOf(32, 1), versions(t, s, 32, 32))
	st := s.Stats()
	assert.Equal(t, reads, st.RemoteReads, "nothing read from the remote")
	assert.EqualValues(t, 32, st.ReadAheadPages)
	assert.EqualValues(t, 32, st.ReadAheadHits)
	assert.Zero(t, s.ra.live.Load(), "the window read to its end is freed")

	require.True(t, s.ReadAhead(pageid.MakeKey(1, 100), 8))
	s.ra.fill.Wait()
	assert.Equal(t, allOf(16, 1), versions(t, s, 96, 16), "pages 96–99 and 108–111 from the remote, 100–107 from the window")
	assert.EqualValues(t, 40, s.Stats().ReadAheadHits)

	ctx := context.Background()
	for p := uint64(200); p < 204; p++ {
		k := pageid.MakeKey(1, p)
		require.NoError(t, s.Put(ctx, k, fill(k, 1)))
	}
	assert.False(t, s.ReadAhead(pageid.MakeKey(1, 200), 4), "cached pages are not read ahead")
}

// TestReadAheadIsNeverStale: a write, a zeroing or a volume's removal
// after a window was read drops it, so the stream read that comes next
// returns what was written.
func TestReadAheadIsNeverStale(t *testing.T) {
	ctx := context.Background()
	s, _ := raRig(t)
	require.True(t, s.ReadAhead(pageid.MakeKey(1, 0), 16))
	s.ra.fill.Wait()
	k := pageid.MakeKey(1, 5)
	require.NoError(t, s.Put(ctx, k, fill(k, 2)))
	want := allOf(16, 1)
	want[5] = 2
	assert.Equal(t, want, versions(t, s, 0, 16))
	assert.EqualValues(t, 16, s.Stats().ReadAheadDropped, "the written window was dropped unread")

	require.True(t, s.ReadAhead(pageid.MakeKey(1, 64), 16))
	s.ra.fill.Wait()
	require.NoError(t, s.ZeroRange(ctx, 1, 70*pageid.Size, 2*pageid.Size, false))
	p := make([]byte, 16*pageid.Size)
	require.NoError(t, s.ReadStream(ctx, 1, 64*pageid.Size, p))
	assert.Equal(t, make([]byte, 2*pageid.Size), p[6*pageid.Size:8*pageid.Size], "zeroed pages read as zeroes")
	assert.Equal(t, fill(pageid.MakeKey(1, 64), 1), p[:pageid.Size])

	require.True(t, s.ReadAhead(pageid.MakeKey(1, 128), 16))
	s.ra.fill.Wait()
	s.RemoveVolume(1)
	assert.Zero(t, s.ra.live.Load(), "a removed volume's windows are dropped")
}

// TestReadAheadRacesWrites: stream reads of windows being read ahead
// while a writer rewrites their pages never return a version older than
// the last write that had returned before the read began (-race checks
// the windows' buffers too).
func TestReadAheadRacesWrites(t *testing.T) {
	ctx := context.Background()
	s, _ := raRig(t)
	var done atomic.Uint64 // versions of page 20 written and returned
	done.Store(1)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		k := pageid.MakeKey(1, 20)
		for v := uint64(2); ; v++ {
			select {
			case <-stop:
				return
			default:
			}
			if !assert.NoError(t, s.Put(ctx, k, fill(k, v))) {
				return
			}
			done.Store(v)
		}
	})
	for r := range 4 {
		wg.Go(func() {
			for i := range 300 {
				first := uint64(16 + (i+r)%8)
				s.ReadAhead(pageid.MakeKey(1, first), 8)
				lo := done.Load()
				p := make([]byte, 16*pageid.Size)
				if !assert.NoError(t, s.ReadStream(ctx, 1, 16*pageid.Size, p)) {
					return
				}
				v := binary.LittleEndian.Uint64(p[4*pageid.Size+8:])
				if !assert.GreaterOrEqual(t, v, lo, "read %d of reader %d returned page 20 older than a write that had returned", i, r) {
					return
				}
			}
		})
	}
	for range 1200 {
		if t.Failed() {
			break
		}
		s.ReadAhead(pageid.MakeKey(1, 18), 4)
		versions(t, s, 16, 8)
	}
	close(stop)
	wg.Wait()
	t.Logf("read ahead %d pages, %d taken, %d dropped", s.Stats().ReadAheadPages, s.Stats().ReadAheadHits, s.Stats().ReadAheadDropped)
}

// TestSmallReadsTakeWindowPages: a miss of a page a window holds — a
// read too small for a stream read, by Get, GetAsync or a run of them,
// or one through ReadRange — copies it from the window, with no read of
// the remote, and the window is freed once every page is taken; a write
// to a page drops the window, so no later miss finds the old copy.
func TestSmallReadsTakeWindowPages(t *testing.T) {
	ctx := context.Background()
	rem := newAsyncRemote(0) // GetAsync of a run would block on a remote that cannot read asynchronously
	for p := range uint64(256) {
		k := pageid.MakeKey(1, p)
		require.NoError(t, rem.WritePages(ctx, []pageid.Key{k}, [][]byte{fill(k, 1)}))
	}
	s := newTestStore(t, rem, 16, "s3fifo", 256)
	t.Cleanup(s.StopReadAhead)
	require.True(t, s.ReadAhead(pageid.MakeKey(1, 64), 8))
	s.ra.fill.Wait()
	reads := s.Stats().RemoteReads
	buf := make([]byte, 4*pageid.Size)
	require.NoError(t, s.Get(ctx, pageid.MakeKey(1, 64), buf[:pageid.Size]))
	assert.Equal(t, fill(pageid.MakeKey(1, 64), 1), buf[:pageid.Size])
	finished, err := s.GetAsync(pageid.MakeKey(1, 65), buf[:pageid.Size], func(error) { t.Error("no round trip to wait for") })
	require.NoError(t, err)
	assert.True(t, finished, "answered at once")
	assert.Equal(t, fill(pageid.MakeKey(1, 65), 1), buf[:pageid.Size])
	require.NoError(t, s.ReadRange(ctx, 1, 66*pageid.Size, buf[:2*pageid.Size]))
	assert.Equal(t, fill(pageid.MakeKey(1, 67), 1), buf[pageid.Size:2*pageid.Size])
	finished, err = s.GetAsync(pageid.MakeKey(1, 68), buf, func(error) { t.Error("no round trip to wait for") })
	require.NoError(t, err)
	assert.True(t, finished, "a run of four answered at once")
	for i := range uint64(4) {
		assert.Equal(t, fill(pageid.MakeKey(1, 68+i), 1), buf[i*pageid.Size:(i+1)*pageid.Size])
	}
	st := s.Stats()
	assert.Equal(t, reads, st.RemoteReads, "nothing read from the remote")
	assert.EqualValues(t, 8, st.ReadAheadHits)
	assert.Zero(t, s.ra.live.Load(), "the window taken page by page is freed")

	require.True(t, s.ReadAhead(pageid.MakeKey(1, 80), 4))
	s.ra.fill.Wait()
	k := pageid.MakeKey(1, 81)
	require.NoError(t, s.Put(ctx, k, fill(k, 2)))
	require.NoError(t, s.Flush(ctx))
	s.discard(k) // out of the cache: the next read is a miss
	require.NoError(t, s.Get(ctx, k, buf[:pageid.Size]))
	assert.Equal(t, fill(k, 2), buf[:pageid.Size], "the write, not the window's copy")
	assert.Equal(t, fill(k, 2), rem.mem.Page(k))
}
