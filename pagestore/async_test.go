package pagestore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pd3-go/pd3/internal/testutil"
	"github.com/pd3-go/pd3/pageid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// asyncRemote reads asynchronously on a goroutine of its own after a random
// delay of up to maxDelay, as a connection's reader would.
type asyncRemote struct {
	*Faults
	mem      *MemRemote
	maxDelay time.Duration
	started  atomic.Int64
}

func newAsyncRemote(maxDelay time.Duration) *asyncRemote {
	mem := NewMemRemote()
	return &asyncRemote{Faults: NewFaults(mem), mem: mem, maxDelay: maxDelay}
}

func (a *asyncRemote) ReadPageAsync(k pageid.Key, dst []byte, done func(error)) {
	a.started.Add(1)
	d := time.Duration(rand.Int64N(int64(a.maxDelay) + 1))
	go func() {
		time.Sleep(d) // the fake remote's latency
		done(a.ReadPage(context.Background(), k, dst))
	}()
}

// getAsync is GetAsync as the NBD reader uses it: Get when it would block.
func getAsync(ctx context.Context, s *Store, k pageid.Key, dst []byte) error {
	ch := make(chan error, 1)
	finished, err := s.GetAsync(k, dst, func(err error) { ch <- err })
	switch {
	case errors.Is(err, ErrWouldBlock):
		return s.Get(ctx, k, dst)
	case finished:
		return err
	}
	return <-ch
}

// TestAsyncModel runs goroutines over a cache of 8 frames, each reading
// and writing its own pages with GetAsync, Get and Put while the others
// evict them, plus Flushes: every read returns the reader's last write.
func TestAsyncModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(testutil.Seed(t), 7))
	rem := newAsyncRemote(200 * time.Microsecond)
	const workers, volPages = 4, 64
	s := newTestStore(t, rem, 8, "", volPages)
	ctx := context.Background()
	var wg sync.WaitGroup
	var asyncDone, wouldBlock atomic.Int64
	for w := 0; w < workers; w++ {
		seed := rng.Uint64()
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(seed, uint64(w)))
			model := map[pageid.Key][]byte{}
			buf := make([]byte, pageid.Size)
			for i := 0; i < 3000; i++ {
				k := pageid.MakeKey(1, uint64(r.IntN(volPages/workers)*workers+w))
				switch op := r.IntN(10); {
				case op == 0:
					if !assert.NoError(t, s.Flush(ctx)) {
						return
					}
				case op <= 3:
					p := fill(k, uint64(i))
					if !assert.NoError(t, s.Put(ctx, k, p)) {
						return
					}
					model[k] = p
				default:
					var err error
					if op <= 7 {
						ch := make(chan error, 1)
						var finished bool
						finished, err = s.GetAsync(k, buf, func(err error) { ch <- err })
						switch {
						case errors.Is(err, ErrWouldBlock):
							wouldBlock.Add(1)
							err = s.Get(ctx, k, buf)
						case !finished:
							err = <-ch
							asyncDone.Add(1)
						}
					} else {
						err = s.Get(ctx, k, buf)
					}
					if !assert.NoError(t, err) {
						return
					}
					want, ok := model[k]
					if !ok {
						want = make([]byte, pageid.Size)
					}
					if !assert.Equal(t, want, buf, fmt.Sprintf("worker %d step %d page %v", w, i, k)) {
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	assert.Positive(t, asyncDone.Load(), "some misses completed asynchronously")
	assert.Positive(t, wouldBlock.Load(), "some reads found their page busy")
	assert.Zero(t, s.async.Load(), "loads left in flight")
	t.Logf("async misses %d, would block %d, remote async reads %d", asyncDone.Load(), wouldBlock.Load(), rem.started.Load())
}

// TestAsyncMissBlocksWriters: a write to a page whose asynchronous load
// is in flight waits for it, and a blocking read of it shares the load.
func TestAsyncMissBlocksWriters(t *testing.T) {
	rem := newAsyncRemote(0)
	k := pageid.MakeKey(1, 3)
	require.NoError(t, rem.WritePages(context.Background(), []pageid.Key{k}, [][]byte{fill(k, 1)}))
	release := make(chan struct{})
	gated := &gatedRemote{asyncRemote: rem, release: release}
	s := newTestStore(t, gated, 4, "", 16)
	ctx := context.Background()
	buf := make([]byte, pageid.Size)
	done := make(chan error, 1)
	finished, err := s.GetAsync(k, buf, func(err error) { done <- err })
	require.NoError(t, err)
	require.False(t, finished)

	// A second GetAsync of the same page cannot take it while it loads.
	other := make([]byte, pageid.Size)
	_, err = s.GetAsync(k, other, func(error) { t.Error("second load started") })
	assert.ErrorIs(t, err, ErrWouldBlock)

	putDone := make(chan error, 1)
	go func() { putDone <- s.Put(ctx, k, fill(k, 2)) }()
	getDone := make(chan error, 1)
	go func() { getDone <- s.Get(ctx, k, other) }()
	select {
	case <-putDone:
		t.Fatal("Put finished while the page was loading")
	case <-getDone:
		t.Fatal("Get finished while the page was loading")
	case <-time.After(20 * time.Millisecond):
	}
	close(release)
	require.NoError(t, <-done)
	assert.Equal(t, fill(k, 1), buf)
	require.NoError(t, <-putDone)
	require.NoError(t, <-getDone)
	require.NoError(t, s.Get(ctx, k, buf))
	assert.Equal(t, fill(k, 2), buf)
	assert.Equal(t, int64(1), rem.started.Load(), "one remote read")
}

type gatedRemote struct {
	*asyncRemote
	release chan struct{}
}

func (g *gatedRemote) ReadPageAsync(k pageid.Key, dst []byte, done func(error)) {
	g.asyncRemote.ReadPageAsync(k, dst, func(err error) {
		<-g.release
		done(err)
	})
}

// TestAsyncNeverEvictsDirty: GetAsync evicts only clean pages (a dirty one
// needs a write-back, which blocks), and says so when none is left.
func TestAsyncNeverEvictsDirty(t *testing.T) {
	rem := newAsyncRemote(0)
	s := newTestStore(t, rem, 4, "", 16)
	ctx := context.Background()
	for p := uint64(0); p < 4; p++ {
		require.NoError(t, s.Put(ctx, pageid.MakeKey(1, p), fill(pageid.MakeKey(1, p), 1)))
	}
	buf := make([]byte, pageid.Size)
	_, err := s.GetAsync(pageid.MakeKey(1, 9), buf, func(error) { t.Error("load started") })
	assert.ErrorIs(t, err, ErrWouldBlock)
	assert.Zero(t, rem.mem.Writes.Load(), "nothing written back")
	require.NoError(t, s.Flush(ctx))
	require.NoError(t, getAsync(ctx, s, pageid.MakeKey(1, 9), buf))
	assert.Equal(t, int64(1), rem.started.Load())
	// The failed remote's error reaches the reader, and the frame is
	// free again.
	rem.Fail.Store(true)
	err = getAsync(ctx, s, pageid.MakeKey(1, 10), buf)
	assert.ErrorIs(t, err, ErrInjected)
	rem.Fail.Store(false)
	require.NoError(t, getAsync(ctx, s, pageid.MakeKey(1, 10), buf))
	assert.Equal(t, make([]byte, pageid.Size), buf)
	assert.Zero(t, s.async.Load())
}

// With more than three quarters of the cache dirty, the paths that must
// not wait take only free frames: the policy's search for a clean page
// among dirty ones looks at up to four times every frame, under the
// eviction lock, and the NBD reader would make it for every miss (fio
// verify over NBD under -race: 19 s with the search, 6 s without). After
// a flush they take clean pages again.
func TestAsyncLeavesAMostlyDirtyCacheToBlockingPaths(t *testing.T) {
	for _, pol := range PolicyNames {
		t.Run(pol, func(t *testing.T) {
			rem := newAsyncRemote(0)
			s := newTestStore(t, rem, 64, pol, 1024)
			ctx := context.Background()
			dirtyThenClean(t, s, 52, 12) // of 64 frames
			buf := make([]byte, pageid.Size)
			_, err := s.GetAsync(pageid.MakeKey(1, 200), buf, func(error) { t.Error("load started") })
			assert.ErrorIs(t, err, ErrWouldBlock)
			assert.ErrorIs(t, s.PutNow(pageid.MakeKey(1, 201), fill(pageid.MakeKey(1, 201), 1)), ErrWouldBlock)
			assert.False(t, s.Resident(pageid.MakeKey(1, 201)))

			require.NoError(t, s.Flush(ctx))
			require.NoError(t, getAsync(ctx, s, pageid.MakeKey(1, 200), buf))
			require.NoError(t, s.PutNow(pageid.MakeKey(1, 201), fill(pageid.MakeKey(1, 201), 2)))
			require.NoError(t, s.Get(ctx, pageid.MakeKey(1, 201), buf))
			assert.Equal(t, fill(pageid.MakeKey(1, 201), 2), buf)
		})
	}
}

// Below the three-quarters rule, dirty pages can still fill the head of
// the policy's queue (S3-FIFO evicts the oldest of its small queue first:
// here 40 dirty pages before 24 clean ones). A non-blocking claim looks
// at cleanTries of them at most, then leaves the write to a blocking
// path, instead of going round them under evictMu.
func TestNonBlockingClaimsStopAfterCleanTries(t *testing.T) {
	rem := newAsyncRemote(0)
	s := newTestStore(t, rem, 64, "s3fifo", 1024)
	ctx := context.Background()
	dirtyThenClean(t, s, 40, 24)
	buf := make([]byte, pageid.Size)
	claim, asked := s.claimClean, 0
	s.claimClean = func(f int32) bool { asked++; return claim(f) }
	err := s.PutNow(pageid.MakeKey(1, 200), fill(pageid.MakeKey(1, 200), 1))
	assert.ErrorIs(t, err, ErrWouldBlock)
	assert.Equal(t, cleanTries, asked, "claims a non-blocking write asked for")

	// The blocking path still writes it, and the store stays consistent.
	require.NoError(t, s.Put(ctx, pageid.MakeKey(1, 200), fill(pageid.MakeKey(1, 200), 1)))
	require.NoError(t, s.Get(ctx, pageid.MakeKey(1, 200), buf))
	assert.Equal(t, fill(pageid.MakeKey(1, 200), 1), buf)
}

// dirtyThenClean fills s with dirty pages 0..dirty-1 of volume 1, then
// clean pages from 100 on, in that order.
func dirtyThenClean(t *testing.T, s *Store, dirty, clean uint64) {
	t.Helper()
	ctx := context.Background()
	for p := range dirty {
		require.NoError(t, s.Put(ctx, pageid.MakeKey(1, p), fill(pageid.MakeKey(1, p), 1)))
	}
	buf := make([]byte, pageid.Size)
	for p := range clean {
		require.NoError(t, s.Get(ctx, pageid.MakeKey(1, 100+p), buf))
	}
}

// PutNow takes a page when it can without waiting, and leaves it alone
// (ErrWouldBlock) when not; what it took is dirty, read back as written
// and written back by a flush.
func TestPutNow(t *testing.T) {
	rem := newAsyncRemote(0)
	s := newTestStore(t, rem, 4, "", 16)
	ctx := context.Background()
	k := func(p uint64) pageid.Key { return pageid.MakeKey(1, p) }
	buf := make([]byte, pageid.Size)

	require.NoError(t, s.PutNow(k(0), fill(k(0), 1)), "a free frame")
	require.NoError(t, s.Get(ctx, k(1), buf))
	require.NoError(t, s.PutNow(k(1), fill(k(1), 1)), "a cached clean page")
	require.NoError(t, s.PutNow(k(0), fill(k(0), 2)), "a cached dirty page")
	for p := uint64(2); p < 4; p++ {
		require.NoError(t, s.Get(ctx, k(p), buf))
	}
	require.NoError(t, s.PutNow(k(5), fill(k(5), 1)), "a clean page's frame (2 of 4 dirty)")

	// A page someone holds: PutNow does not wait for it.
	f, ok := s.lookup(k(1))
	require.True(t, ok)
	s.frames[f].mu.RLock()
	assert.ErrorIs(t, s.PutNow(k(1), fill(k(1), 9)), ErrWouldBlock)
	s.frames[f].mu.RUnlock()

	assert.ErrorIs(t, s.PutNow(k(16), fill(k(16), 1)), pageid.ErrOutOfRange)
	assert.ErrorIs(t, s.PutNow(k(2), buf[:10]), ErrBadPage)

	require.NoError(t, s.Flush(ctx))
	for p, v := range map[uint64]uint64{0: 2, 1: 1, 5: 1} {
		got := make([]byte, pageid.Size)
		require.NoError(t, rem.mem.ReadPage(ctx, k(p), got))
		assert.Equal(t, fill(k(p), v), got, "page %d at the remote", p)
	}
}
