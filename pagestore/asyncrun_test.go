package pagestore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/pd3-go/pd3/internal/testutil"
	"github.com/pd3-go/pd3/pageid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// runsRemote is asyncRemote that also reads runs of pages asynchronously,
// one call each (counted in runs).
type runsRemote struct {
	*asyncRemote
	runs atomic.Int64
	gate chan struct{} // if not nil, each run's completion waits for a value
}

func (r *runsRemote) ReadPagesAsync(first pageid.Key, p []byte, done func(error)) {
	r.runs.Add(1)
	go func() {
		if r.gate != nil {
			<-r.gate
		}
		done(r.ReadPages(context.Background(), first, p))
	}()
}

// getPages is a multi-page GetAsync as the NBD reader uses it: ReadRange
// when it would block.
func getPages(ctx context.Context, s *Store, first pageid.Key, dst []byte) (async bool, err error) {
	ch := make(chan error, 1)
	finished, err := s.GetAsync(first, dst, func(err error) { ch <- err })
	switch {
	case errors.Is(err, ErrWouldBlock):
		return false, s.ReadRange(ctx, first.Volume(), first.Page()*pageid.Size, dst)
	case finished:
		return false, err
	}
	return true, <-ch
}

// TestAsyncRunsModel: goroutines over a cache of 8 frames each read runs
// of up to 6 pages of their own block with GetAsync and write single pages
// with Put, with Flushes between: every read returns the last writes, with
// runs read in one call each and with a remote that reads one page at a
// time.
func TestAsyncRunsModel(t *testing.T) {
	for _, runs := range []bool{true, false} {
		t.Run(fmt.Sprintf("runs=%v", runs), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(testutil.Seed(t), 9))
			ar := newAsyncRemote(200_000)
			var rem Remote = ar
			var rr *runsRemote
			if runs {
				rr = &runsRemote{asyncRemote: ar}
				rem = rr
			}
			const workers, block = 4, 16
			s := newTestStore(t, rem, 8, "", workers*block)
			ctx := context.Background()
			var wg sync.WaitGroup
			var asyncDone atomic.Int64
			for w := range workers {
				seed := rng.Uint64()
				wg.Add(1)
				go func() {
					defer wg.Done()
					r := rand.New(rand.NewPCG(seed, uint64(w)))
					model := make([][]byte, block)
					buf := make([]byte, 6*pageid.Size)
					for i := 0; i < 1500; i++ {
						switch op := r.IntN(10); {
						case op == 0:
							if !assert.NoError(t, s.Flush(ctx)) {
								return
							}
						case op <= 3:
							x := r.IntN(block)
							k := pageid.MakeKey(1, uint64(w*block+x))
							p := fill(k, uint64(i))
							if !assert.NoError(t, s.Put(ctx, k, p)) {
								return
							}
							model[x] = p
						default:
							n := 1 + r.IntN(6)
							x := r.IntN(block - n + 1)
							async, err := getPages(ctx, s, pageid.MakeKey(1, uint64(w*block+x)), buf[:n*pageid.Size])
							if !assert.NoError(t, err) {
								return
							}
							if async {
								asyncDone.Add(1)
							}
							for y := range n {
								want := model[x+y]
								if want == nil {
									want = make([]byte, pageid.Size)
								}
								if !assert.Equal(t, want, buf[y*pageid.Size:(y+1)*pageid.Size], "worker %d step %d page %d", w, i, x+y) {
									return
								}
							}
						}
					}
				}()
			}
			wg.Wait()
			assert.Positive(t, asyncDone.Load(), "some reads completed asynchronously")
			assert.Zero(t, s.async.Load(), "loads left in flight")
			if runs {
				assert.Positive(t, rr.runs.Load(), "runs read in one call")
			}
		})
	}
}

// TestAsyncRunReadsEachRunOnce: a read of 8 pages of which 2 are cached
// and 1 is in the Loading Zone sends one remote read per run of the other
// five, straight into the reply, counts them once, and caches them; read
// again, it is all hits. Reads too long, empty or past the volume are
// refused before anything starts.
func TestAsyncRunReadsEachRunOnce(t *testing.T) {
	ar := newAsyncRemote(0)
	rem := &runsRemote{asyncRemote: ar, gate: make(chan struct{})}
	ctx := context.Background()
	for i := range 8 {
		k := pageid.MakeKey(1, uint64(i))
		require.NoError(t, rem.WritePages(ctx, []pageid.Key{k}, [][]byte{fill(k, 1)}))
	}
	lzKey := pageid.MakeKey(1, 6)
	s, err := New(rem, Options{CacheBytes: 32 * pageid.Size, Prefetched: oneZone{lzKey, fill(lzKey, 3)}})
	require.NoError(t, err)
	s.AddVolume(pageid.VolumeInfo{ID: 1, Name: "v", Size: 64 * pageid.Size})
	t.Cleanup(func() { assert.NoError(t, s.Check()) })
	for _, i := range []uint64{2, 5} {
		k := pageid.MakeKey(1, i)
		require.NoError(t, s.Put(ctx, k, fill(k, 2)))
	}
	want := func(i int) []byte {
		k := pageid.MakeKey(1, uint64(i))
		switch i {
		case 2, 5:
			return fill(k, 2)
		case 6:
			return fill(k, 3)
		}
		return fill(k, 1)
	}

	st0 := s.Stats() // the Puts' misses
	dst := make([]byte, 8*pageid.Size)
	done := make(chan error, 1)
	finished, err := s.GetAsync(pageid.MakeKey(1, 0), dst, func(err error) { done <- err })
	require.NoError(t, err)
	require.False(t, finished)
	assert.Equal(t, int64(3), rem.runs.Load(), "runs 0-1, 3-4 and 7")
	assert.Equal(t, int64(5), s.async.Load(), "five pages loading")
	for range 3 {
		rem.gate <- struct{}{}
	}
	require.NoError(t, <-done)
	for i := range 8 {
		assert.Equal(t, want(i), dst[i*pageid.Size:(i+1)*pageid.Size], "page %d", i)
		assert.True(t, s.Resident(pageid.MakeKey(1, uint64(i))), "page %d cached", i)
	}
	st := s.Stats()
	assert.Equal(t, uint64(2), st.Hits-st0.Hits)
	assert.Equal(t, uint64(6), st.Misses-st0.Misses)
	assert.Equal(t, uint64(1), st.PrefetchHits-st0.PrefetchHits)
	assert.Equal(t, uint64(5), st.RemoteReads-st0.RemoteReads)
	assert.Zero(t, s.async.Load())

	clear(dst)
	finished, err = s.GetAsync(pageid.MakeKey(1, 0), dst, func(error) { t.Error("done called for hits") })
	require.NoError(t, err)
	assert.True(t, finished)
	for i := range 8 {
		assert.Equal(t, want(i), dst[i*pageid.Size:(i+1)*pageid.Size], "page %d", i)
	}
	assert.Equal(t, uint64(10), s.Stats().Hits-st0.Hits)

	for _, c := range []struct {
		first uint64
		bytes int
		want  error
	}{
		{0, (MaxAsyncPages + 1) * pageid.Size, ErrBadPage},
		{0, 0, ErrBadPage},
		{0, pageid.Size + 1, ErrBadPage},
		{60, 8 * pageid.Size, pageid.ErrOutOfRange},
		{1<<pageid.PageBits - 1, 2 * pageid.Size, pageid.ErrOutOfRange},
	} {
		finished, err := s.GetAsync(pageid.MakeKey(1, c.first), make([]byte, c.bytes), func(error) { t.Error("done called") })
		assert.True(t, finished, "page %d, %d bytes", c.first, c.bytes)
		assert.ErrorIs(t, err, c.want, "page %d, %d bytes", c.first, c.bytes)
	}
	assert.Equal(t, int64(3), rem.runs.Load(), "nothing read for refused reads")
}

// TestAsyncRunFailure: a failed run leaves its pages uncached and tells
// the caller once; a read that cannot take frames for every miss without
// waiting gives back those it took and starts nothing.
func TestAsyncRunFailure(t *testing.T) {
	ar := newAsyncRemote(0)
	rem := &runsRemote{asyncRemote: ar}
	s := newTestStore(t, rem, 8, "", 64)
	ctx := context.Background()

	// 8 frames, a quarter of them (2) for asynchronous loads.
	ar.Fail.Store(true)
	dst := make([]byte, 2*pageid.Size)
	async, err := getPages(ctx, s, pageid.MakeKey(1, 10), dst)
	assert.True(t, async)
	assert.ErrorIs(t, err, ErrInjected)
	for i := range 2 {
		assert.False(t, s.Resident(pageid.MakeKey(1, uint64(10+i))), "failed page %d not cached", 10+i)
	}
	assert.Zero(t, s.async.Load())
	ar.Fail.Store(false)

	// Three misses would hold more: nothing is claimed or read.
	before := rem.runs.Load()
	finished, err := s.GetAsync(pageid.MakeKey(1, 20), make([]byte, 3*pageid.Size), func(error) { t.Error("done called") })
	assert.False(t, finished)
	assert.ErrorIs(t, err, ErrWouldBlock)
	assert.Equal(t, before, rem.runs.Load())
	assert.Zero(t, s.async.Load())
	for i := range 3 {
		assert.False(t, s.Resident(pageid.MakeKey(1, uint64(20+i))))
	}
	async, err = getPages(ctx, s, pageid.MakeKey(1, 20), make([]byte, 2*pageid.Size))
	assert.True(t, async)
	assert.NoError(t, err)
}

// TestPutNowPages: PutNow takes a run of pages when every one can be
// taken without waiting; at the first that cannot it stops with
// ErrWouldBlock, and the blocking path writes the run again. A run past
// the volume or too long stores nothing.
func TestPutNowPages(t *testing.T) {
	rem := newAsyncRemote(0)
	s := newTestStore(t, rem, 8, "", 32)
	ctx := context.Background()
	k := func(p uint64) pageid.Key { return pageid.MakeKey(1, p) }
	run := func(first uint64, n int, v uint64) []byte {
		var p []byte
		for i := range n {
			p = append(p, fill(k(first+uint64(i)), v)...)
		}
		return p
	}

	require.NoError(t, s.PutNow(k(4), run(4, 3, 1)))
	got := make([]byte, 3*pageid.Size)
	require.NoError(t, s.ReadRange(ctx, 1, 4*pageid.Size, got))
	assert.Equal(t, run(4, 3, 1), got)

	buf := make([]byte, pageid.Size)
	require.NoError(t, s.Get(ctx, k(9), buf))
	f, ok := s.lookup(k(9))
	require.True(t, ok)
	s.frames[f].mu.RLock()
	assert.ErrorIs(t, s.PutNow(k(8), run(8, 3, 2)), ErrWouldBlock, "page 9 is held")
	assert.True(t, s.Resident(k(8)), "the page before the held one is written")
	assert.False(t, s.Resident(k(10)), "the pages after it are not")
	s.frames[f].mu.RUnlock()
	require.NoError(t, s.WriteRange(ctx, 1, 8*pageid.Size, run(8, 3, 2)))

	assert.ErrorIs(t, s.PutNow(k(30), run(30, 3, 1)), pageid.ErrOutOfRange)
	assert.False(t, s.Resident(k(30)), "nothing stored past the volume's end")
	assert.ErrorIs(t, s.PutNow(k(0), run(0, MaxAsyncPages+1, 1)), ErrBadPage)

	require.NoError(t, s.Flush(ctx))
	for p, v := range map[uint64]uint64{4: 1, 5: 1, 6: 1, 8: 2, 9: 2, 10: 2} {
		got := make([]byte, pageid.Size)
		require.NoError(t, rem.mem.ReadPage(ctx, k(p), got))
		assert.Equal(t, fill(k(p), v), got, "page %d at the remote", p)
	}
}
