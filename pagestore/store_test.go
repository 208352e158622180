package pagestore

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pd3-go/pd3/internal/testutil"
	"github.com/pd3-go/pd3/pageid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func newTestStore(t testing.TB, remote Remote, pages int, policy string, volPages uint64) *Store {
	t.Helper()
	s, err := New(remote, Options{CacheBytes: int64(pages) * pageid.Size, Policy: policy})
	require.NoError(t, err)
	s.AddVolume(pageid.VolumeInfo{ID: 1, Name: "v", Size: volPages * pageid.Size})
	t.Cleanup(func() { assert.NoError(t, s.Check()) })
	return s
}

func fill(k pageid.Key, version uint64) []byte {
	p := make([]byte, pageid.Size)
	binary.LittleEndian.PutUint64(p, uint64(k))
	binary.LittleEndian.PutUint64(p[8:], version)
	p[pageid.Size-1] = byte(version)
	return p
}

func TestGetPutAndBounds(t *testing.T) {
	for _, pol := range PolicyNames {
		t.Run(pol, func(t *testing.T) {
			rem := NewMemRemote()
			s := newTestStore(t, rem, 8, pol, 100)
			ctx := context.Background()
			buf := make([]byte, pageid.Size)
			require.NoError(t, s.Get(ctx, pageid.MakeKey(1, 5), buf))
			assert.Equal(t, make([]byte, pageid.Size), buf)
			require.NoError(t, s.Put(ctx, pageid.MakeKey(1, 5), fill(5, 1)))
			require.NoError(t, s.Get(ctx, pageid.MakeKey(1, 5), buf))
			assert.Equal(t, fill(5, 1), buf)
			assert.ErrorIs(t, s.Get(ctx, pageid.MakeKey(1, 100), buf), pageid.ErrOutOfRange)
			assert.ErrorIs(t, s.Get(ctx, pageid.MakeKey(2, 0), buf), pageid.ErrNoVolume)
			assert.ErrorIs(t, s.Put(ctx, pageid.MakeKey(1, 0), buf[:10]), ErrBadPage)
			// Nothing reached the remote before Flush.
			assert.Equal(t, make([]byte, pageid.Size), rem.Page(pageid.MakeKey(1, 5)))
			require.NoError(t, s.Flush(ctx))
			assert.Equal(t, fill(5, 1), rem.Page(pageid.MakeKey(1, 5)))
			assert.Zero(t, s.Stats().DirtyPages)
		})
	}
}

// TestEvictionKeepsDirtyWrites writes far more pages than the cache holds,
// from several goroutines, with remote failures injected part of the time:
// every acknowledged write must be readable afterwards.
func TestEvictionKeepsDirtyWrites(t *testing.T) {
	for _, pol := range PolicyNames {
		t.Run(pol, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(testutil.Seed(t), 1))
			mem := NewMemRemote()
			rem := NewFaults(mem)
			const volPages = 512
			s := newTestStore(t, rem, 16, pol, volPages)
			ctx := context.Background()
			var mu sync.Mutex
			acked := make(map[pageid.Key]uint64)
			var wg sync.WaitGroup
			stop := make(chan struct{})
			flipped := make(chan struct{})
			flipSeed := rng.Uint64()
			go func() { // flip remote failures on and off
				defer close(flipped)
				r := rand.New(rand.NewPCG(flipSeed, 2))
				for {
					select {
					case <-stop:
						rem.Fail.Store(false)
						return
					case <-time.After(time.Duration(r.IntN(2000)) * time.Microsecond):
						rem.Fail.Store(r.IntN(4) == 0)
					}
				}
			}()
			for w := 0; w < 4; w++ {
				wg.Add(1)
				r := rand.New(rand.NewPCG(rng.Uint64(), uint64(w)))
				go func() {
					defer wg.Done()
					buf := make([]byte, pageid.Size)
					for i := 0; i < 2000; i++ {
						// Each writer owns pages ≡ w mod 4, so its model is exact.
						k := pageid.MakeKey(1, uint64(r.IntN(volPages/4)*4+w))
						if r.IntN(3) == 0 {
							if err := s.Get(ctx, k, buf); err != nil {
								continue
							}
							mu.Lock()
							want := acked[k]
							mu.Unlock()
							if got := binary.LittleEndian.Uint64(buf[8:]); want != 0 && got != want {
								t.Errorf("page %v: read version %d, acknowledged %d", k, got, want)
								return
							}
							continue
						}
						v := uint64(i + 1)
						if err := s.Put(ctx, k, fill(k, v)); err != nil {
							assert.ErrorIs(t, err, ErrInjected)
							continue
						}
						mu.Lock()
						acked[k] = v
						mu.Unlock()
					}
				}()
			}
			wg.Wait()
			close(stop)
			<-flipped
			rem.Fail.Store(false)
			require.NoError(t, s.Flush(ctx))
			st := s.Stats()
			assert.Greater(t, st.Evictions, uint64(100), "test must evict under pressure")
			for k, v := range acked {
				assert.Equal(t, fill(k, v), mem.Page(k), "page %v lost its acknowledged write", k)
			}
		})
	}
}

// countingRemote delays reads so concurrent misses overlap.
type countingRemote struct {
	*MemRemote
	gate chan struct{}
}

func (c countingRemote) ReadPage(ctx context.Context, k pageid.Key, dst []byte) error {
	<-c.gate
	return c.MemRemote.ReadPage(ctx, k, dst)
}

func TestConcurrentMissesShareOneRead(t *testing.T) {
	rem := countingRemote{NewMemRemote(), make(chan struct{})}
	s := newTestStore(t, rem, 8, "", 16)
	k := pageid.MakeKey(1, 3)
	var wg sync.WaitGroup
	for i := 0; i < 16; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, pageid.Size)
			assert.NoError(t, s.Get(context.Background(), k, buf))
		}()
	}
	// One reader holds the miss at the remote; the other 15 wait for it.
	require.Eventually(t, func() bool { return s.Stats().SharedMissesWaiting == 15 }, 10*time.Second, time.Millisecond)
	close(rem.gate)
	wg.Wait()
	assert.Equal(t, uint64(1), rem.Reads.Load())
}

func TestFailedLoadIsRetried(t *testing.T) {
	mem := NewMemRemote()
	rem := NewFaults(mem)
	s := newTestStore(t, rem, 8, "", 16)
	ctx := context.Background()
	buf := make([]byte, pageid.Size)
	rem.Fail.Store(true)
	assert.ErrorIs(t, s.Get(ctx, pageid.MakeKey(1, 1), buf), ErrInjected)
	rem.Fail.Store(false)
	require.NoError(t, rem.WritePages(ctx, []pageid.Key{pageid.MakeKey(1, 1)}, [][]byte{fill(1, 7)}))
	require.NoError(t, s.Get(ctx, pageid.MakeKey(1, 1), buf))
	assert.Equal(t, fill(1, 7), buf)
}

// TestReadsOutliveRefusedWriteBacks: while the remote refuses writes (a
// full disk at a persistent node) a miss evicts a clean page, or reads
// past the cache once every page is dirty: a read never fails because a
// write-back did. Nothing dirty is dropped.
func TestReadsOutliveRefusedWriteBacks(t *testing.T) {
	for _, pol := range PolicyNames {
		t.Run(pol, func(t *testing.T) {
			mem := NewMemRemote()
			rem := NewFaults(mem)
			s := newTestStore(t, rem, 8, pol, 128)
			ctx := context.Background()
			k := func(i int) pageid.Key { return pageid.MakeKey(1, uint64(i)) }
			for i := range 128 {
				require.NoError(t, mem.WritePages(ctx, []pageid.Key{k(i)}, [][]byte{fill(k(i), 1)}))
			}
			buf := make([]byte, pageid.Size)
			for i := range 8 {
				require.NoError(t, s.Get(ctx, k(i), buf))
			}
			rem.FailWrites.Store(true)
			written := map[pageid.Key][]byte{}
			for i := 100; i < 104; i++ {
				written[k(i)] = fill(k(i), 2)
				require.NoError(t, s.Put(ctx, k(i), written[k(i)]))
			}
			for i := 10; i < 60; i++ {
				require.NoError(t, s.Get(ctx, k(i), buf), "page %d with half the cache dirty", i)
				require.Equal(t, fill(k(i), 1), buf)
			}
			for i := 104; i < 120 && s.Stats().DirtyPages < 8; i++ {
				if err := s.Put(ctx, k(i), fill(k(i), 2)); err == nil {
					written[k(i)] = fill(k(i), 2)
				} else {
					require.ErrorIs(t, err, ErrInjected)
				}
			}
			require.Equal(t, 8, s.Stats().DirtyPages)
			for i := 60; i < 70; i++ {
				require.NoError(t, s.Get(ctx, k(i), buf), "page %d with every page dirty", i)
				require.Equal(t, fill(k(i), 1), buf)
			}
			assert.NotZero(t, s.Stats().UncachedReads)
			err := s.Put(ctx, k(121), fill(k(121), 2))
			require.ErrorIs(t, err, ErrInjected, "a write finds no frame")
			require.ErrorIs(t, err, ErrCacheFull)
			for key, want := range written {
				require.NoError(t, s.Get(ctx, key, buf))
				require.Equal(t, want, buf, "the cached write of %v", key)
			}

			rem.FailWrites.Store(false)
			require.NoError(t, s.Flush(ctx))
			for key, want := range written {
				assert.Equal(t, want, mem.Page(key), "%v at the remote", key)
			}
		})
	}
}

// TestModel runs a random single-threaded workload against a map model,
// with the cache far smaller than the data.
func TestModel(t *testing.T) {
	for _, pol := range PolicyNames {
		t.Run(pol, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(testutil.Seed(t), 3))
			rem := NewMemRemote()
			s := newTestStore(t, rem, 8, pol, 64)
			ctx := context.Background()
			model := make(map[pageid.Key][]byte)
			buf := make([]byte, pageid.Size)
			for i := 0; i < 5000; i++ {
				k := pageid.MakeKey(1, uint64(rng.IntN(64)))
				switch rng.IntN(10) {
				case 0:
					require.NoError(t, s.Flush(ctx))
					for mk, mv := range model {
						require.Equal(t, mv, rem.Page(mk), "after flush, step %d", i)
					}
				case 1, 2, 3, 4:
					p := fill(k, uint64(i))
					require.NoError(t, s.Put(ctx, k, p))
					model[k] = p
				default:
					require.NoError(t, s.Get(ctx, k, buf))
					want, ok := model[k]
					if !ok {
						want = make([]byte, pageid.Size)
					}
					require.Equal(t, want, buf, fmt.Sprintf("step %d page %v", i, k))
				}
			}
		})
	}
}

// TestBackgroundWritebackRetries: with the remote failing, dirty pages stay
// dirty; once it recovers they reach it without any Flush.
// The outage is logged when it starts and when it ends, not once per round.
func TestBackgroundWritebackRetries(t *testing.T) {
	mem := NewMemRemote()
	rem := NewFaults(mem)
	var logged testutil.SyncBuffer
	s, err := New(rem, Options{CacheBytes: 16 * pageid.Size, Log: slog.New(slog.NewTextHandler(&logged, nil))})
	require.NoError(t, err)
	s.AddVolume(pageid.VolumeInfo{ID: 1, Name: "v", Size: 64 * pageid.Size})
	t.Cleanup(func() { assert.NoError(t, s.Check()) })
	ctx, cancel := context.WithCancel(context.Background())
	rem.Fail.Store(true)
	wait := s.StartWriteback(ctx, 10*time.Millisecond)
	defer func() { cancel(); wait() }() // before the cleanup's Check: no round in flight
	for p := uint64(0); p < 8; p++ {
		require.NoError(t, s.Put(ctx, pageid.MakeKey(1, p), fill(pageid.MakeKey(1, p), 3)))
	}
	require.Eventually(t, func() bool { return s.Stats().WritebackFailures >= 3 }, 5*time.Second, 5*time.Millisecond)
	assert.Equal(t, 8, s.Stats().DirtyPages, "failed write-backs keep the pages dirty")
	rem.Fail.Store(false)
	require.Eventually(t, func() bool { return s.Stats().DirtyPages == 0 }, 5*time.Second, 5*time.Millisecond)
	require.Eventually(t, func() bool { return strings.Contains(logged.String(), "recovered") }, 5*time.Second, 5*time.Millisecond)
	out := logged.String()
	assert.Equal(t, 1, strings.Count(out, "level=WARN"), out)
	assert.Contains(t, out, "background write-back failed (1 rounds in a row); 8 dirty pages")
	assert.Contains(t, out, ErrInjected.Error(), "the warning carries the remote's error")
	assert.Regexp(t, `recovered after \d+ failed rounds`, out)
	for p := uint64(0); p < 8; p++ {
		k := pageid.MakeKey(1, p)
		assert.Equal(t, fill(k, 3), mem.Page(k))
	}
	cancel()
}

// TestConcurrentFlushesCoverTheirWrites: callers that write and then
// Flush concurrently share flush rounds, and each finds its own write at
// the remote when its Flush returns.
func TestConcurrentFlushesCoverTheirWrites(t *testing.T) {
	rem := NewMemRemote()
	s := newTestStore(t, rem, 256, "s3fifo", 64)
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for w := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for v := uint64(1); v <= 100; v++ {
				k := pageid.MakeKey(1, uint64(w*4)+v%4)
				if err := s.Put(ctx, k, fill(k, v)); err != nil {
					errs <- err
					return
				}
				if err := s.Flush(ctx); err != nil {
					errs <- err
					return
				}
				// Another writer of this page does not exist, so the
				// remote holds exactly this version now.
				if got := binary.LittleEndian.Uint64(rem.Page(k)[8:]); got != v {
					errs <- fmt.Errorf("writer %d: page %v at the remote has version %d after flushing %d", w, k, got, v)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
}

// slowWrites is a remote whose write-backs each take a millisecond and
// are counted.
type slowWrites struct {
	*MemRemote
	calls atomic.Int64
}

func (r *slowWrites) WritePages(ctx context.Context, keys []pageid.Key, pages [][]byte) error {
	time.Sleep(time.Millisecond) // a slow remote is what this fake is
	defer r.calls.Add(1)
	return r.MemRemote.WritePages(ctx, keys, pages)
}

// TestVolumeFlushDoesNotWaitForAWholeRound: a volume's flush (a file's
// fsync) that starts while a round writes back 20 batches of another
// volume is done before that round is: the round frees the lock between
// batches. It used to hold it for the whole round.
func TestVolumeFlushDoesNotWaitForAWholeRound(t *testing.T) {
	const batches = 20
	rem := &slowWrites{MemRemote: NewMemRemote()}
	s, err := New(rem, Options{CacheBytes: (batches*flushBatch + 64) * pageid.Size})
	require.NoError(t, err)
	s.AddVolume(pageid.VolumeInfo{ID: 1, Name: "big", Size: batches * flushBatch * pageid.Size})
	s.AddVolume(pageid.VolumeInfo{ID: 2, Name: "small", Size: pageid.Size})
	ctx := context.Background()
	for p := range uint64(batches * flushBatch) {
		require.NoError(t, s.Put(ctx, pageid.MakeKey(1, p), fill(pageid.MakeKey(1, p), 1)))
	}
	round := make(chan error, 1)
	go func() { round <- s.Flush(ctx) }()
	require.Eventually(t, func() bool { return rem.calls.Load() > 0 }, 10*time.Second, 100*time.Microsecond, "the round is under way")
	small := pageid.MakeKey(2, 0)
	require.NoError(t, s.Put(ctx, small, fill(small, 1)))
	require.NoError(t, s.FlushVolume(ctx, 2))
	assert.Less(t, rem.calls.Load(), int64(batches), "the volume's flush waited for the whole round")
	assert.Equal(t, fill(small, 1), rem.Page(small))
	require.NoError(t, <-round)
	require.NoError(t, s.Check())
}

// TestWritebackStartsEarly: the background write-back does not wait for
// its interval (an hour here) when half the cache is dirty, or when a miss
// had to write back a dirty victim itself; either starts a round that
// cleans the pages dirty when it begins, so the misses after it find
// clean victims. Pages dirtied while a round runs wait for the next kick
// (half the cache dirty again) or the interval: a round started by the
// 33rd of 40 puts leaves up to 7 dirty, below the mark.
func TestWritebackStartsEarly(t *testing.T) {
	for _, tc := range []struct {
		name  string
		dirty uint64
		evict bool // read other pages until one miss writes back a victim
	}{
		{"half the cache dirty", 40, false},
		{"a dirty victim", 10, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mem := NewMemRemote()
			s := newTestStore(t, mem, 64, "s3fifo", 4096)
			ctx, cancel := context.WithCancel(context.Background())
			wait := s.StartWriteback(ctx, time.Hour)
			// Before the cleanup's Check: a round the last puts kicked
			// may still be writing.
			defer func() { cancel(); wait() }()
			for p := uint64(0); p < tc.dirty; p++ {
				k := pageid.MakeKey(1, p)
				require.NoError(t, s.Put(ctx, k, fill(k, 1)))
			}
			buf := make([]byte, pageid.Size)
			for p := uint64(1000); tc.evict && s.Stats().EvictionWriteBacks == 0; p++ {
				require.NoError(t, s.Get(ctx, pageid.MakeKey(1, p), buf))
			}
			// A round cleans all but what was dirtied while it ran:
			// at most the puts after the mark (40 - 32).
			left := tc.dirty - min(tc.dirty, 64/2)
			require.Eventually(t, func() bool { return uint64(s.Stats().DirtyPages) <= left }, 5*time.Second, 5*time.Millisecond,
				"no write-back round before the interval")
			written := uint64(0)
			for p := uint64(0); p < tc.dirty; p++ {
				if k := pageid.MakeKey(1, p); bytes.Equal(fill(k, 1), mem.Page(k)) {
					written++
				}
			}
			assert.GreaterOrEqual(t, written, tc.dirty-left, "pages written back")
		})
	}
}

// Suspend holds new requests until Resume; fenced in between, they fail
// rather than serve what another host may have changed.
func TestSuspendHoldsRequestsUntilResume(t *testing.T) {
	for _, fence := range []bool{false, true} {
		s := newTestStore(t, NewMemRemote(), 16, "s3fifo", 64)
		ctx := context.Background()
		k := pageid.MakeKey(1, 3)
		require.NoError(t, s.Put(ctx, k, fill(k, 1)))
		s.Suspend()
		done := make(chan error, 2)
		go func() { done <- s.Get(ctx, k, make([]byte, pageid.Size)) }()
		go func() { done <- s.ReadRange(ctx, 1, 0, make([]byte, 100)) }()
		select {
		case err := <-done:
			t.Fatalf("a request went through a suspended store: %v", err)
		case <-time.After(100 * time.Millisecond):
		}
		if fence {
			s.FenceVolume(1)
		}
		s.Resume()
		for range 2 {
			err := <-done
			if fence {
				assert.ErrorIs(t, err, pageid.ErrFenced)
			} else {
				assert.NoError(t, err)
			}
		}
	}
}

// A flush finds a dirty page in any frame: the first and last of each
// 64-frame word of the dirty bitmap and the frames of a last, partial
// word. Every page of a full cache is rewritten and flushed alone, so
// each frame in turn holds the only dirty page.
func TestFlushFindsADirtyPageInEveryFrame(t *testing.T) {
	const pages = 64*2 + 3
	rem := NewMemRemote()
	s := newTestStore(t, rem, pages, "", pages)
	ctx := context.Background()
	for p := range uint64(pages) {
		k := pageid.MakeKey(1, p)
		require.NoError(t, s.Put(ctx, k, fill(k, 1)))
	}
	require.NoError(t, s.Flush(ctx))
	require.Equal(t, pages, s.Stats().ResidentPages, "every page in its own frame")
	for p := range uint64(pages) {
		k := pageid.MakeKey(1, p)
		require.NoError(t, s.Put(ctx, k, fill(k, 2)))
		require.NoError(t, s.FlushVolume(ctx, 1))
		require.Equal(t, fill(k, 2), rem.Page(k), "page %d was not written back", p)
		require.Zero(t, s.Stats().DirtyPages, "page %d still dirty", p)
	}
}

// BenchmarkFlushVolumeOneDirtyPage is an fsync after one page was
// written, in a 64 MiB cache: the cost of finding the page.
func BenchmarkFlushVolumeOneDirtyPage(b *testing.B) {
	const pages = 64 << 20 / pageid.Size
	s := newTestStore(b, NewMemRemote(), pages, "", pages)
	ctx := context.Background()
	for p := range uint64(pages) {
		k := pageid.MakeKey(1, p)
		require.NoError(b, s.Put(ctx, k, fill(k, 1)))
	}
	require.NoError(b, s.Flush(ctx))
	k := pageid.MakeKey(1, pages-1)
	page := fill(k, 2)
	b.ResetTimer()
	for b.Loop() {
		if err := s.Put(ctx, k, page); err != nil {
			b.Fatal(err)
		}
		if err := s.FlushVolume(ctx, 1); err != nil {
			b.Fatal(err)
		}
	}
}

// regionRemote serves pages from a region of memory it filled: each miss
// copies a page the caches have not seen lately, as a remote read's
// answer does.
type regionRemote struct{ mem []byte }

func (r regionRemote) ReadPage(_ context.Context, k pageid.Key, dst []byte) error {
	o := k.Page() * pageid.Size % uint64(len(r.mem))
	copy(dst, r.mem[o:o+pageid.Size])
	return nil
}

func (r regionRemote) WritePages(context.Context, []pageid.Key, [][]byte) error { return nil }

// BenchmarkGetRandom reads random pages of a volume eight times the cache
// through Get from two goroutines: mostly misses, each an index lookup,
// an eviction (the policy's ghost), an unindex and a publish.
func BenchmarkGetRandom(b *testing.B) {
	const frames, pages = 16384, 8 * 16384
	mem := make([]byte, pages*pageid.Size)
	for i := 0; i < len(mem); i += 512 {
		binary.LittleEndian.PutUint64(mem[i:], uint64(i))
	}
	s := newTestStore(b, regionRemote{mem}, frames, "", pages)
	ctx := context.Background()
	var seed atomic.Uint64
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		r := rand.New(rand.NewPCG(seed.Add(1), 3))
		dst := make([]byte, pageid.Size)
		for pb.Next() {
			if err := s.Get(ctx, pageid.MakeKey(1, r.Uint64N(pages)), dst); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
