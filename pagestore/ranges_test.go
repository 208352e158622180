package pagestore

import (
	"bytes"
	"context"
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

// TestRangesModel: random unaligned reads (up to 12 pages), writes and
// zeroings of a volume against a flat byte-slice model, through an 8-page
// cache (page-by-page loads) and a 64-page one (batched runs of 4).
func TestRangesModel(t *testing.T) {
	for _, tc := range []struct {
		pol    string
		frames int
	}{{"s3fifo", 8}, {"clock", 8}, {"s3fifo", 64}, {"clock", 64}} {
		pol := tc.pol
		t.Run(fmt.Sprintf("%s/%d", pol, tc.frames), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(testutil.Seed(t), 5))
			rem := NewMemRemote()
			const pages = 256
			s := newTestStore(t, rem, tc.frames, pol, pages)
			ctx := context.Background()
			model := make([]byte, pages*pageid.Size)
			for i := 0; i < 3000; i++ {
				off := rng.Uint64N(uint64(len(model)))
				n := 1 + rng.Uint64N(min(uint64(len(model))-off, 12*pageid.Size))
				switch rng.IntN(6) {
				case 0, 1:
					p := make([]byte, n)
					for j := range p {
						p[j] = byte(rng.Uint32())
					}
					require.NoError(t, s.WriteRange(ctx, 1, off, p))
					copy(model[off:], p)
				case 2:
					require.NoError(t, s.ZeroRange(ctx, 1, off, n, rng.IntN(2) == 0))
					clear(model[off : off+n])
				case 3:
					require.NoError(t, s.Flush(ctx))
				default:
					p := make([]byte, n)
					require.NoError(t, s.ReadRange(ctx, 1, off, p))
					if !bytes.Equal(model[off:off+n], p) {
						t.Fatalf("step %d: read %d bytes at %d differs from the model", i, n, off)
					}
				}
			}
			require.NoError(t, s.Flush(ctx))
			all := make([]byte, len(model))
			require.NoError(t, s.ReadRange(ctx, 1, 0, all))
			assert.True(t, bytes.Equal(model, all))
			assert.Positive(t, s.discards.Load(), "whole pages were trimmed")
			assert.ErrorIs(t, s.ReadRange(ctx, 1, uint64(len(model))-1, make([]byte, 2)), pageid.ErrOutOfRange)
			assert.ErrorIs(t, s.WriteRange(ctx, 2, 0, make([]byte, 2)), pageid.ErrNoVolume)
		})
	}
}

// TestWriteFreshReadsOnlyBelowZeroFrom: a partial write of a page at or
// past zeroFrom that is not cached starts from zeroes, with no read of the
// remote (which here holds bytes the writer said were never written, so a
// read would show); below zeroFrom, and for a cached page anywhere, the
// page's other bytes are kept.
func TestWriteFreshReadsOnlyBelowZeroFrom(t *testing.T) {
	ctx := context.Background()
	rem := NewMemRemote()
	old := bytes.Repeat([]byte{0xEE}, pageid.Size)
	for p := range uint64(8) {
		require.NoError(t, rem.WritePages(ctx, []pageid.Key{pageid.MakeKey(1, p)}, [][]byte{old}))
	}
	s := newTestStore(t, rem, 16, "s3fifo", 8)
	cached := pageid.MakeKey(1, 6)
	require.NoError(t, s.Get(ctx, cached, make([]byte, pageid.Size)))
	reads := s.Stats().RemoteReads

	// Bytes 100.. of page 2 (below zeroFrom: read), pages 3, 4 whole,
	// page 5 up to 100 (past zeroFrom, not cached: zeroes around).
	const zeroFrom = 4 * pageid.Size
	data := bytes.Repeat([]byte{0x11}, 3*pageid.Size)
	require.NoError(t, s.WriteFresh(ctx, 1, 2*pageid.Size+100, data, zeroFrom))
	// A cached page past zeroFrom keeps its bytes.
	require.NoError(t, s.WriteFresh(ctx, 1, 6*pageid.Size+10, []byte{0x22}, zeroFrom))
	// From a page's start to past zeroFrom (the kernel writing back a
	// file's last page): the rest is zeroes, nothing to read. To short of
	// zeroFrom: the rest up to it is data, read.
	require.NoError(t, s.WriteFresh(ctx, 1, 7*pageid.Size, data[:100], 7*pageid.Size+50))
	require.NoError(t, s.WriteFresh(ctx, 1, 0, data[:10], 50))
	assert.Equal(t, reads+2, s.Stats().RemoteReads, "pages 2 and 0 are read, no other")
	assert.EqualValues(t, 2, s.Stats().FreshWrites)

	got := make([]byte, pageid.Size)
	require.NoError(t, s.Get(ctx, pageid.MakeKey(1, 2), got))
	assert.Equal(t, old[:100], got[:100], "page 2 lost the bytes before the write")
	want := make([]byte, pageid.Size)
	copy(want, data[len(data)-100:])
	require.NoError(t, s.Get(ctx, pageid.MakeKey(1, 5), got))
	assert.Equal(t, want, got, "page 5 is not zeroes past the write")
	clear(want)
	copy(want, data[:100])
	require.NoError(t, s.Get(ctx, pageid.MakeKey(1, 7), got))
	assert.Equal(t, want, got, "page 7 is not zeroes past the write")
	require.NoError(t, s.Get(ctx, pageid.MakeKey(1, 0), got))
	assert.Equal(t, old[10:], got[10:], "page 0 lost the bytes after the write")
	require.NoError(t, s.Get(ctx, cached, got))
	want = bytes.Clone(old)
	want[10] = 0x22
	assert.Equal(t, want, got, "the cached page was not changed in place")
}

// TestRemoveVolume: a removed volume's cached pages, dirty ones included,
// are gone, so a new volume with the recycled id reads its own bytes —
// whether every frame is scanned or the pages below a bound are looked up.
func TestRemoveVolume(t *testing.T) {
	for _, tc := range []struct {
		name   string
		remove func(s *Store)
	}{
		{"scan", func(s *Store) { s.RemoveVolume(3) }},
		{"lookup below the end", func(s *Store) { s.RemoveVolumePages(3, 8) }},
		{"end past the cache: scan", func(s *Store) { s.RemoveVolumePages(3, 1000) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			remote := NewMemRemote()
			s, err := New(remote, Options{CacheBytes: 64 * pageid.Size})
			require.NoError(t, err)
			v := pageid.VolumeInfo{ID: 3, Name: "f", Size: 16 * pageid.Size}
			s.AddVolume(v)
			page := bytes.Repeat([]byte{0xAB}, pageid.Size)
			for i := range 8 {
				require.NoError(t, s.Put(ctx, pageid.MakeKey(3, uint64(i)), page))
			}
			tc.remove(s)
			assert.ErrorIs(t, s.ReadRange(ctx, 3, 0, make([]byte, 1)), pageid.ErrNoVolume)
			for i := range 8 {
				assert.False(t, s.Resident(pageid.MakeKey(3, uint64(i))), "page %d still cached", i)
			}
			s.AddVolume(v)
			got := make([]byte, pageid.Size)
			require.NoError(t, s.Get(ctx, pageid.MakeKey(3, 1), got))
			assert.Equal(t, make([]byte, pageid.Size), got, "old page showed through")
			require.NoError(t, s.Check())
		})
	}
}

// TestConcurrentRunsDoNotStarve: many concurrent multi-page reads through
// a small cache never leave every frame held by half-claimed runs.
func TestConcurrentRunsDoNotStarve(t *testing.T) {
	rem := NewMemRemote()
	s := newTestStore(t, rem, 256, "s3fifo", 4096)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	for w := range 32 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			p := make([]byte, 64*pageid.Size)
			for i := range 20 {
				off := uint64((w*20+i)%60) * 64 * pageid.Size
				if err := s.ReadRange(ctx, 1, off, p); err != nil {
					errs <- err
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

// oneZone is a Loading Zone holding one page.
type oneZone struct {
	k    pageid.Key
	page []byte
}

func (z oneZone) CheckAndReturn(k pageid.Key, dst []byte) int {
	if k != z.k {
		return 0
	}
	return copy(dst, z.page)
}

// ReadStream serves each page from the newest place — the cache (dirty
// pages included), the Loading Zone, the remote — without taking frames;
// unaligned reads fall back to ReadRange; a range past the volume fails.
func TestReadStream(t *testing.T) {
	mem := NewMemRemote()
	const vol, pages = 1, 256
	var keys []pageid.Key
	var bufs [][]byte
	for p := uint64(0); p < pages; p++ {
		k := pageid.MakeKey(vol, p)
		keys, bufs = append(keys, k), append(bufs, fill(k, 1))
	}
	require.NoError(t, mem.WritePages(context.Background(), keys, bufs))
	lzKey := pageid.MakeKey(vol, 9)
	s, err := New(mem, Options{CacheBytes: 16 * pageid.Size, Prefetched: oneZone{lzKey, fill(lzKey, 3)}})
	require.NoError(t, err)
	s.AddVolume(pageid.VolumeInfo{ID: vol, Name: "v", Size: pages * pageid.Size})
	ctx := context.Background()
	for _, p := range []uint64{5, 70} {
		k := pageid.MakeKey(vol, p)
		require.NoError(t, s.Put(ctx, k, fill(k, 2))) // dirty, newer than the remote
	}
	resident := s.Stats().ResidentPages

	buf := make([]byte, 128*pageid.Size)
	require.NoError(t, s.ReadStream(ctx, vol, 0, buf))
	for p := uint64(0); p < 128; p++ {
		k := pageid.MakeKey(vol, p)
		want := fill(k, 1)
		switch p {
		case 5, 70:
			want = fill(k, 2)
		case 9:
			want = fill(k, 3)
		}
		require.Equal(t, want, buf[p*pageid.Size:(p+1)*pageid.Size], "page %d", p)
	}
	assert.Equal(t, resident, s.Stats().ResidentPages, "a stream takes no frames")

	odd := make([]byte, 3*pageid.Size)
	require.NoError(t, s.ReadStream(ctx, vol, 4*pageid.Size+100, odd))
	assert.Equal(t, fill(pageid.MakeKey(vol, 4), 1)[100:], odd[:pageid.Size-100], "unaligned: through the cache")
	assert.Equal(t, fill(pageid.MakeKey(vol, 5), 2), odd[pageid.Size-100:2*pageid.Size-100])
	err = s.ReadStream(ctx, vol, (pages-1)*pageid.Size, make([]byte, 2*pageid.Size))
	assert.ErrorIs(t, err, pageid.ErrOutOfRange)
	require.NoError(t, s.Flush(ctx))
	require.NoError(t, s.Check())
}

// A stream read of pages cached in order takes each from the frame after
// the last one's without the index, and only when that frame holds it
// now: a page trimmed since (its frame emptied), one moved to another
// frame, and one written since are read as they are, not as they were.
func TestReadStreamOfPagesCachedInOrder(t *testing.T) {
	const vol, pages = 1, 64
	s := newTestStore(t, NewMemRemote(), 2*pages, "", pages)
	ctx := context.Background()
	for p := uint64(0); p < pages; p++ {
		k := pageid.MakeKey(vol, p)
		require.NoError(t, s.Put(ctx, k, fill(k, 1)))
	}
	require.NoError(t, s.Flush(ctx))
	f10, ok := s.lookup(pageid.MakeKey(vol, 10))
	require.True(t, ok)
	f11, ok := s.lookup(pageid.MakeKey(vol, 11))
	require.True(t, ok)
	require.Equal(t, f10+1, f11, "pages put in order sit in frames in order")

	// Page 11 trimmed (its frame emptied), then read back into another
	// frame; page 20 trimmed and not read; page 30 rewritten in place.
	require.NoError(t, s.ZeroRange(ctx, vol, 11*pageid.Size, pageid.Size, false))
	require.NoError(t, s.ZeroRange(ctx, vol, 20*pageid.Size, pageid.Size, false))
	page := make([]byte, pageid.Size)
	require.NoError(t, s.Get(ctx, pageid.MakeKey(vol, 11), page))
	require.NoError(t, s.Put(ctx, pageid.MakeKey(vol, 11), fill(pageid.MakeKey(vol, 11), 3)))
	f, ok := s.lookup(pageid.MakeKey(vol, 11))
	require.True(t, ok)
	require.NotEqual(t, f11, f, "the page came back in another frame")
	require.NoError(t, s.Put(ctx, pageid.MakeKey(vol, 30), fill(pageid.MakeKey(vol, 30), 2)))

	buf := make([]byte, pages*pageid.Size)
	require.NoError(t, s.ReadStream(ctx, vol, 0, buf))
	for p := uint64(0); p < pages; p++ {
		k := pageid.MakeKey(vol, p)
		want := fill(k, 1)
		switch p {
		case 11:
			want = fill(k, 3)
		case 20:
			want = make([]byte, pageid.Size)
		case 30:
			want = fill(k, 2)
		}
		require.Equal(t, want, buf[p*pageid.Size:(p+1)*pageid.Size], "page %d", p)
	}
}

// streamRemote counts the pages read each way.
type streamRemote struct {
	*MemRemote
	cached, streamed atomic.Int64
	took             []pageid.Key // StreamTook runs on the reading goroutine
}

func (r *streamRemote) ReadPages(ctx context.Context, first pageid.Key, p []byte) error {
	r.cached.Add(int64(len(p) / pageid.Size))
	return r.MemRemote.ReadPages(ctx, first, p)
}

func (r *streamRemote) ReadStreamPages(ctx context.Context, first pageid.Key, p []byte) error {
	r.streamed.Add(int64(len(p) / pageid.Size))
	return r.MemRemote.ReadPages(ctx, first, p)
}

func (r *streamRemote) StreamTook(k pageid.Key) { r.took = append(r.took, k) }

// TestReadStreamTellsTheRemote: a remote that can tell the pages a stream
// reads (which the store does not cache) from those it caches is asked
// with ReadStreamPages, and the cache's own misses never are; it hears of
// a page the stream took from the Loading Zone.
func TestReadStreamTellsTheRemote(t *testing.T) {
	r := &streamRemote{MemRemote: NewMemRemote()}
	lzKey := pageid.MakeKey(1, 9)
	s, err := New(r, Options{CacheBytes: 16 * pageid.Size, Prefetched: oneZone{lzKey, fill(lzKey, 3)}})
	require.NoError(t, err)
	s.AddVolume(pageid.VolumeInfo{ID: 1, Name: "v", Size: 256 * pageid.Size})
	ctx := context.Background()
	require.NoError(t, s.ReadStream(ctx, 1, 0, make([]byte, 64*pageid.Size)))
	assert.Equal(t, int64(63), r.streamed.Load(), "all but the Loading Zone's page")
	assert.Equal(t, []pageid.Key{lzKey}, r.took, "told of the page taken from the Loading Zone")
	assert.Zero(t, r.cached.Load())
	require.NoError(t, s.ReadRange(ctx, 1, 64*pageid.Size, make([]byte, 8*pageid.Size)))
	assert.Equal(t, int64(63), r.streamed.Load(), "a cached read is no stream's")
}

// TestZeroRangeOfTerabytes: zeroing a 4 TiB volume from an unaligned
// offset to its end (a file's volume past its size) zeroes the partial
// page, drops the cached pages and trims the remote's past it, keeps
// what lies before, and looks at the cache's frames, not at each of the
// range's billion pages.
func TestZeroRangeOfTerabytes(t *testing.T) {
	ctx := context.Background()
	rem := NewMemRemote()
	const volPages = 1 << 30 // 4 TiB
	s := newTestStore(t, rem, 16, "s3fifo", volPages)
	keys := []pageid.Key{pageid.MakeKey(1, 0), pageid.MakeKey(1, 1), pageid.MakeKey(1, 2), pageid.MakeKey(1, 1<<29), pageid.MakeKey(1, volPages-1)}
	for i, k := range keys {
		require.NoError(t, s.Put(ctx, k, fill(k, 1)))
		if i%2 == 0 {
			require.NoError(t, s.Flush(ctx)) // some at the remote only, some cached too
		}
	}
	require.NoError(t, s.Flush(ctx))
	require.NoError(t, s.Get(ctx, keys[3], make([]byte, pageid.Size)))

	const from = pageid.Size + 100
	require.NoError(t, s.ZeroRange(ctx, 1, from, volPages*pageid.Size-from, false))
	got := make([]byte, pageid.Size)
	require.NoError(t, s.Get(ctx, keys[0], got))
	assert.True(t, bytes.Equal(fill(keys[0], 1), got), "the page before the range")
	require.NoError(t, s.Get(ctx, keys[1], got))
	want := fill(keys[1], 1)
	clear(want[100:])
	assert.True(t, bytes.Equal(want, got), "the partial page keeps its first 100 bytes only")
	for _, k := range keys[2:] {
		assert.True(t, bytes.Equal(make([]byte, pageid.Size), rem.Page(k)), "page %d is still at the remote", k.Page())
		require.NoError(t, s.Get(ctx, k, got))
		assert.True(t, bytes.Equal(make([]byte, pageid.Size), got), "page %d still reads", k.Page())
	}
}

// gatedTrim is a remote whose Trim waits at a gate: what a reader does
// between a zeroing's discard of the cached pages and the remote's trim.
type gatedTrim struct {
	*MemRemote
	entered, gate chan struct{}
}

func (g gatedTrim) Trim(ctx context.Context, vol uint16, off, n uint64) error {
	close(g.entered)
	<-g.gate
	return g.MemRemote.Trim(ctx, vol, off, n)
}

// A page read while a zeroing of it is on its way to the remote (the
// cached copy already dropped, the remote's not yet trimmed) loads the
// old bytes; the zeroing must not leave them cached once it returns, or
// every later read is stale.
func TestZeroRangeLeavesNoStalePageCached(t *testing.T) {
	ctx := context.Background()
	g := gatedTrim{MemRemote: NewMemRemote(), entered: make(chan struct{}), gate: make(chan struct{})}
	s := newTestStore(t, g, 64, "s3fifo", 64)
	old := bytes.Repeat([]byte{0xAA}, pageid.Size)
	k := pageid.MakeKey(1, 5)
	require.NoError(t, s.Put(ctx, k, old))
	require.NoError(t, s.Flush(ctx))
	done := make(chan error, 1)
	go func() { done <- s.ZeroRange(ctx, 1, 4*pageid.Size, 4*pageid.Size, false) }()
	<-g.entered
	got := make([]byte, pageid.Size)
	require.NoError(t, s.Get(ctx, k, got))
	assert.Equal(t, old, got, "read while the trim is in flight: the old bytes, as a concurrent read may")
	close(g.gate)
	require.NoError(t, <-done)
	require.NoError(t, s.Get(ctx, k, got))
	assert.Equal(t, make([]byte, pageid.Size), got, "after the zeroing returned: zeroes")
}

// BenchmarkReadStreamCached reads a cached volume in 1 MiB stream reads,
// front to back, as a scan of a file the host holds does: every page a
// lookup of the index and a copy out of its frame.
func BenchmarkReadStreamCached(b *testing.B) {
	const pages, run = 65536, 256 // 256 MiB: an index larger than the caches
	s := newTestStore(b, NewMemRemote(), pages+pages/8, "", pages)
	ctx := context.Background()
	p := make([]byte, run*pageid.Size)
	for off := uint64(0); off < pages*pageid.Size; off += uint64(len(p)) {
		require.NoError(b, s.ReadRange(ctx, 1, off, p)) // through the cache: every page kept
	}
	require.Equal(b, pages, s.Stats().ResidentPages)
	b.SetBytes(int64(len(p)))
	b.ResetTimer()
	off := uint64(0)
	for b.Loop() {
		if err := s.ReadStream(ctx, 1, off, p); err != nil {
			b.Fatal(err)
		}
		off = (off + uint64(len(p))) % (pages * pageid.Size)
	}
}
