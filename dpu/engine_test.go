package dpu

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/pd3-go/pd3/cluster"
	"github.com/pd3-go/pd3/hostview"
	"github.com/pd3-go/pd3/internal/shm"
	"github.com/pd3-go/pd3/internal/testnet"
	"github.com/pd3-go/pd3/loadingzone"
	"github.com/pd3-go/pd3/memnode"
	"github.com/pd3-go/pd3/memnode/memnodetest"
	"github.com/pd3-go/pd3/pageid"
	"github.com/pd3-go/pd3/replica"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type rig struct {
	e   *Engine
	hv  *hostview.Set
	lz  *loadingzone.Zone
	vol pageid.VolumeInfo
}

// testNode serves an in-process memory node until ctx ends and returns a
// client and a 1 MiB volume "v"; cleanup closes both.
func testNode(t *testing.T, ctx context.Context) (*memnode.Client, pageid.VolumeInfo) {
	t.Helper()
	return sizedNode(t, ctx, 1<<20)
}

// sizedNode is testNode with a volume of size bytes.
func sizedNode(t *testing.T, ctx context.Context, size uint64) (*memnode.Client, pageid.VolumeInfo) {
	t.Helper()
	return memnodetest.Node(t, ctx, size)
}

func newRig(t *testing.T, lzRecords int) *rig {
	t.Helper()
	c, vol := testNode(t, context.Background())
	return engineRig(t, c, vol, lzRecords)
}

// replicatedRig is newRig over a replicated volume: two memory nodes,
// extents of 16 pages on both, so that runs of pages span extents.
func replicatedRig(t *testing.T, lzRecords int) *rig {
	t.Helper()
	const size = 1 << 20
	s := cluster.Stripes{Epoch: 1, ExtentBytes: 16 * pageid.Size, Replicas: 2}
	for range size / s.ExtentBytes {
		s.Extents = append(s.Extents, []string{"a", "b"})
	}
	v := replica.Volume{ID: 9, Name: "v", Size: size, Stripes: s, Local: map[string]uint16{}}
	clients := map[string]*memnode.Client{}
	for _, id := range []string{"a", "b"} {
		c, local := testNode(t, context.Background())
		clients[id], v.Local[id] = c, local.ID
	}
	rem, err := replica.New(clients, []replica.Volume{v}, nil)
	require.NoError(t, err)
	return engineRigOn(t, rem, pageid.VolumeInfo{ID: v.ID, Name: v.Name, Size: v.Size}, lzRecords)
}

// rigs are the engine's rigs every ordering test runs on.
var rigs = []struct {
	name string
	new  func(t *testing.T, lzRecords int) *rig
}{{"node", newRig}, {"replicated", replicatedRig}}

// engineRig starts an engine on c with a Loading Zone of lzRecords and a
// Host View; cleanup closes it and checks both.
func engineRig(t *testing.T, c *memnode.Client, vol pageid.VolumeInfo, lzRecords int) *rig {
	t.Helper()
	return engineRigOn(t, NodeConn{Client: c}, vol, lzRecords)
}

func engineRigOn(t *testing.T, c Conn, vol pageid.VolumeInfo, lzRecords int) *rig {
	t.Helper()
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
	})
	return &rig{e: e, hv: hv, lz: lz, vol: vol}
}

// inFlight reports whether a prefetch of k is outstanding.
func (e *Engine) inFlight(k pageid.Key) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	_, ok := e.inflight[k]
	return ok
}

func versioned(v uint64) []byte {
	p := make([]byte, pageid.Size)
	binary.LittleEndian.PutUint64(p, v)
	return p
}

// TestWriteBackNeverLeavesOldCopy: after a write-back of page k returns,
// the Loading Zone must not serve an older version of k — whether the old
// copy was placed before the write-back or was still in flight, and
// whether it was prefetched alone or in a run of pages.
func TestWriteBackNeverLeavesOldCopy(t *testing.T) {
	for _, tc := range []struct {
		name     string
		prefetch func(e *Engine, k pageid.Key)
	}{
		{"page", func(e *Engine, k pageid.Key) { e.Prefetch(k) }},
		{"run", func(e *Engine, k pageid.Key) { e.PrefetchRun(k-1, 4) }},
	} {
		for _, rg := range rigs {
			t.Run(tc.name+"/"+rg.name, func(t *testing.T) {
				writeBackNeverLeavesOldCopy(t, rg.new(t, 256), tc.prefetch)
			})
		}
	}
}

func writeBackNeverLeavesOldCopy(t *testing.T, r *rig, prefetch func(e *Engine, k pageid.Key)) {
	{
		{
			ctx := context.Background()
			dst := make([]byte, pageid.Size)
			for i := uint64(0); i < 200; i++ {
				k := pageid.MakeKey(r.vol.ID, 1+i%200)
				require.NoError(t, r.e.WritePages(ctx, []pageid.Key{k}, [][]byte{versioned(2 * i)}))
				if i%2 == 0 {
					// Old copy already placed.
					placed := r.e.Placed.Load()
					prefetch(r.e, k)
					require.Eventually(t, func() bool { return r.e.Placed.Load() > placed && !r.e.inFlight(k) }, 5*time.Second, time.Millisecond)
					assert.True(t, r.hv.Contains(uint64(k)), "a placed page is in Host View")
				} else {
					// Old copy in flight: the prefetch is queued before the write.
					prefetch(r.e, k)
				}
				require.NoError(t, r.e.WritePages(ctx, []pageid.Key{k}, [][]byte{versioned(2*i + 1)}))
				// Any prefetch in flight has landed, or been dropped, before the look.
				require.Eventually(t, func() bool { return !r.e.inFlight(k) }, 5*time.Second, 50*time.Microsecond)
				if r.lz.CheckAndReturn(uint64(k), dst) == pageid.Size {
					require.Equal(t, 2*i+1, binary.LittleEndian.Uint64(dst), "Loading Zone served a page older than its write-back (round %d)", i)
				}
			}
			assert.Positive(t, r.lz.Invalidated.Load(), "placed copies were invalidated")
			t.Logf("invalidated %d, stale in-flight dropped %d", r.lz.Invalidated.Load(), r.e.Stale.Load())
		}
	}
}

// TestPrefetchRacingWriteBacks: prefetches issued while write-backs of the
// same pages go on never leave a copy older than the last acknowledged
// write-back in the Loading Zone. A prefetch issued before a write-back is
// queued is dropped when it completes; one issued after must read the
// write at whichever copy it reaches — so a Conn that releases the engine
// before its writes are sent everywhere fails here.
func TestPrefetchRacingWriteBacks(t *testing.T) {
	for _, rg := range rigs {
		t.Run(rg.name, func(t *testing.T) {
			r := rg.new(t, 256)
			ctx := context.Background()
			const pages = 8
			stop := make(chan struct{})
			var wg sync.WaitGroup
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := uint64(0); ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					if i%2 == 0 {
						r.e.PrefetchRun(pageid.MakeKey(r.vol.ID, 14), pages) // spans extents 0 and 1 of the replicated rig
					} else {
						r.e.Prefetch(pageid.MakeKey(r.vol.ID, 14+i%pages))
					}
					runtime.Gosched() // with one P, the writer gets its turn
				}
			}()
			defer func() { close(stop); wg.Wait() }() // before the rig's cleanup closes the engine
			dst := make([]byte, pageid.Size)
			for v := uint64(1); v <= 300; v++ {
				keys := make([]pageid.Key, pages)
				data := make([][]byte, pages)
				for i := range keys {
					keys[i], data[i] = pageid.MakeKey(r.vol.ID, 14+uint64(i)), versioned(v)
				}
				require.NoError(t, r.e.WritePages(ctx, keys, data))
				for _, k := range keys {
					if r.lz.CheckAndReturn(uint64(k), dst) == pageid.Size {
						require.GreaterOrEqual(t, binary.LittleEndian.Uint64(dst), v, "page %v: the Loading Zone served a copy older than an acknowledged write-back", k)
					}
				}
			}
			t.Logf("placed %d, stale %d, failed %d", r.e.Placed.Load(), r.e.Stale.Load(), r.e.Failed.Load())
			assert.Positive(t, r.e.Placed.Load())
		})
	}
}

// TestWriteBackKeepsHostViewEntry: a page the host writes back and keeps
// (a flush) stays in Host View, so the agent does not prefetch it; only the
// host's eviction notice removes it.
func TestWriteBackKeepsHostViewEntry(t *testing.T) {
	r := newRig(t, 256)
	ctx := context.Background()
	k := pageid.MakeKey(r.vol.ID, 7)
	r.hv.Add(uint64(k)) // the host caches k
	require.NoError(t, r.e.WritePages(ctx, []pageid.Key{k}, [][]byte{versioned(1)}))
	assert.True(t, r.hv.Contains(uint64(k)))
	r.e.Invalidate(k) // the split host's direct write-back, likewise
	assert.True(t, r.hv.Contains(uint64(k)))
}

// TestPrefetchRunPlacesEveryPage: a run lands each page, with its own
// bytes, in the Loading Zone and Host View.
func TestPrefetchRunPlacesEveryPage(t *testing.T) {
	r := newRig(t, 256)
	ctx := context.Background()
	for p := uint64(10); p < 30; p++ {
		require.NoError(t, r.e.WritePages(ctx, []pageid.Key{pageid.MakeKey(r.vol.ID, p)}, [][]byte{versioned(p)}))
	}
	r.e.Prefetch(pageid.MakeKey(r.vol.ID, 12)) // in flight or placed: the run skips or re-reads it
	r.e.PrefetchRun(pageid.MakeKey(r.vol.ID, 10), 20)
	require.Eventually(t, func() bool { return r.e.Placed.Load() >= 20 }, 5*time.Second, time.Millisecond)
	dst := make([]byte, pageid.Size)
	for p := uint64(10); p < 30; p++ {
		k := pageid.MakeKey(r.vol.ID, p)
		require.Equal(t, pageid.Size, r.lz.CheckAndReturn(uint64(k), dst), "page %d", p)
		assert.Equal(t, p, binary.LittleEndian.Uint64(dst))
	}
}

// TestPrefetchAfterWriteSeesIt: a prefetch issued after a write-back
// returns reads the written data (same connection, in order).
func TestPrefetchAfterWriteSeesIt(t *testing.T) {
	for _, rg := range rigs {
		t.Run(rg.name, func(t *testing.T) { prefetchAfterWriteSeesIt(t, rg.new(t, 64)) })
	}
}

func prefetchAfterWriteSeesIt(t *testing.T, r *rig) {
	ctx := context.Background()
	dst := make([]byte, pageid.Size)
	for i := uint64(1); i <= 50; i++ {
		k := pageid.MakeKey(r.vol.ID, 7)
		require.NoError(t, r.e.WritePages(ctx, []pageid.Key{k}, [][]byte{versioned(i)}))
		placed := r.e.Placed.Load()
		r.e.Prefetch(k)
		require.Eventually(t, func() bool { return r.e.Placed.Load() > placed }, 5*time.Second, time.Millisecond)
		require.Equal(t, pageid.Size, r.lz.CheckAndReturn(uint64(k), dst))
		require.Equal(t, i, binary.LittleEndian.Uint64(dst))
	}
}

func TestDuplicatePrefetchesAreDeduped(t *testing.T) {
	r := newRig(t, 64)
	k := pageid.MakeKey(r.vol.ID, 3)
	for i := 0; i < 20; i++ {
		r.e.Prefetch(k)
	}
	require.Eventually(t, func() bool { return r.e.Placed.Load()+r.e.Deduped.Load() == 20 || r.e.Issued.Load() > 1 }, 5*time.Second, time.Millisecond)
	assert.Positive(t, r.e.Deduped.Load())
}

// TestReadPagesJoinsPrefetches: a host run read over pages being
// prefetched gets every page's bytes, waiting for the prefetches it meets.
func TestReadPagesJoinsPrefetches(t *testing.T) {
	for _, rg := range rigs {
		t.Run(rg.name, func(t *testing.T) { readPagesJoinsPrefetches(t, rg.new(t, 256)) })
	}
}

func readPagesJoinsPrefetches(t *testing.T, r *rig) {
	ctx := context.Background()
	for p := uint64(40); p < 60; p++ {
		require.NoError(t, r.e.WritePages(ctx, []pageid.Key{pageid.MakeKey(r.vol.ID, p)}, [][]byte{versioned(p)}))
	}
	for round := 0; round < 50; round++ {
		r.e.PrefetchRun(pageid.MakeKey(r.vol.ID, 44), 8)
		r.e.Prefetch(pageid.MakeKey(r.vol.ID, 55))
		buf := make([]byte, 20*pageid.Size)
		require.NoError(t, r.e.ReadPages(ctx, pageid.MakeKey(r.vol.ID, 40), buf))
		for i := 0; i < 20; i++ {
			require.Equal(t, uint64(40+i), binary.LittleEndian.Uint64(buf[i*pageid.Size:]), "round %d page %d", round, 40+i)
		}
	}
	t.Logf("joined %d", r.e.Joined.Load())
	assert.Positive(t, r.e.Joined.Load(), "some pages were taken from prefetches in flight")
}

// TestStreamReadsAreNotHeld: pages read for a stream (which the host
// does not cache) stay out of Host View, so the agent may prefetch them
// later; pages read for the cache go in. Both join prefetches in flight.
func TestStreamReadsAreNotHeld(t *testing.T) {
	r := newRig(t, 256)
	ctx := context.Background()
	for p := uint64(0); p < 16; p++ {
		require.NoError(t, r.e.WritePages(ctx, []pageid.Key{pageid.MakeKey(r.vol.ID, p)}, [][]byte{versioned(p)}))
	}
	held := func(first, n uint64) (in int) {
		for p := first; p < first+n; p++ {
			if r.hv.Contains(uint64(pageid.MakeKey(r.vol.ID, p))) {
				in++
			}
		}
		return in
	}
	buf := make([]byte, 8*pageid.Size)
	r.e.PrefetchRun(pageid.MakeKey(r.vol.ID, 2), 4)
	require.NoError(t, r.e.ReadStreamPages(ctx, pageid.MakeKey(r.vol.ID, 0), buf))
	for i := 0; i < 8; i++ {
		require.Equal(t, uint64(i), binary.LittleEndian.Uint64(buf[i*pageid.Size:]), "page %d", i)
	}
	// The prefetched pages 2-5 are in view (placed for the host to take);
	// the stream read itself added none.
	assert.Zero(t, held(0, 2)+held(6, 2), "a stream read's pages are not the host's")
	require.NoError(t, r.e.ReadPages(ctx, pageid.MakeKey(r.vol.ID, 8), buf))
	assert.Equal(t, 8, held(8, 8), "a cached read's pages are")

	// A stream that takes a placed page out of the Loading Zone says so,
	// and the page leaves Host View.
	require.Eventually(t, func() bool { return held(2, 4) == 4 }, 5*time.Second, time.Millisecond, "the prefetched pages are placed")
	r.e.StreamTook(pageid.MakeKey(r.vol.ID, 3))
	assert.Equal(t, 3, held(2, 4), "the page a stream took is not the host's")
}

// gatedRig is a rig whose engine reaches the memory node through a
// testnet.Gate, so responses can be held while requests line up.
func gatedRig(t *testing.T) (*rig, *testnet.Gate) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := &memnode.Server{Store: memnode.NewStore(0)}
	go srv.Serve(ctx, ln)
	g := testnet.NewGate(t, ln.Addr().String())
	c, err := memnode.Dial(ctx, g.Addr, memnode.ClientOptions{})
	require.NoError(t, err)
	vol, err := c.Create(ctx, "v", 1<<20)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close(); srv.Close(); cancel() })
	r := engineRig(t, c, vol, 64)
	t.Cleanup(g.Release) // runs first: nothing held at Close
	return r, g
}

func (e *Engine) joiners(k pageid.Key) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	if f, ok := e.inflight[k]; ok {
		return len(f.joiners)
	}
	return -1
}

// TestAsyncMissJoinsPrefetch: a host miss that asks without blocking
// while the page's prefetch is in flight is served by that prefetch; if a
// write-back of the page overtakes the prefetch, the miss reads the page
// again, behind the write, and gets the new bytes.
func TestAsyncMissJoinsPrefetch(t *testing.T) {
	for _, overtaken := range []bool{false, true} {
		t.Run(fmt.Sprintf("overtaken=%v", overtaken), func(t *testing.T) {
			r, g := gatedRig(t)
			ctx := context.Background()
			k := pageid.MakeKey(r.vol.ID, 7)
			require.NoError(t, r.e.WritePages(ctx, []pageid.Key{k}, [][]byte{versioned(1)}))

			g.Hold()
			r.e.Prefetch(k)
			dst := make([]byte, pageid.Size)
			done := make(chan error, 1)
			r.e.ReadPageAsync(k, dst, func(err error) { done <- err })
			require.Equal(t, 1, r.e.joiners(k), "the miss joined the prefetch")
			wrote := make(chan error, 1)
			if overtaken {
				go func() {
					wrote <- r.e.WritePages(ctx, []pageid.Key{k}, [][]byte{versioned(2)})
				}()
				require.Eventually(t, func() bool { return !r.e.inFlight(k) }, 5*time.Second, time.Millisecond,
					"the write-back forgets the prefetch")
			}
			g.Release()
			require.NoError(t, <-done)
			if overtaken {
				require.NoError(t, <-wrote)
				assert.Equal(t, uint64(2), binary.LittleEndian.Uint64(dst), "the miss must see the write-back")
				assert.Equal(t, uint64(1), r.e.Stale.Load())
				assert.Zero(t, r.e.Joined.Load())
			} else {
				assert.Equal(t, uint64(1), binary.LittleEndian.Uint64(dst))
				assert.Equal(t, uint64(1), r.e.Joined.Load())
				assert.Zero(t, r.e.HostReads.Load(), "no second read")
			}
		})
	}
}

// A prefetch's answer is applied by the memory-node connection's reader.
// When the engine's lock is taken (a write-back may be queueing on that
// very connection, waiting for the reader) the reader passes the answer
// on instead of waiting, and the page still arrives.
func TestPrefetchAnswerNeverWaitsForTheEngineLock(t *testing.T) {
	r, g := gatedRig(t)
	k := pageid.MakeKey(r.vol.ID, 5)
	g.Hold()
	r.e.Prefetch(k)
	r.e.mu.Lock()
	g.Release()
	require.Eventually(t, func() bool { return r.e.Deferred.Load() == 1 }, 5*time.Second, time.Millisecond,
		"the reader passed the answer on")
	r.e.mu.Unlock()
	require.Eventually(t, func() bool { return r.e.Placed.Load() == 1 }, 5*time.Second, time.Millisecond)
	dst := make([]byte, pageid.Size)
	assert.Equal(t, pageid.Size, r.lz.CheckAndReturn(uint64(k), dst))
}

// After Close the answers still in flight touch neither the Loading Zone
// nor Host View (their memory may be released), and misses that joined
// them are told the engine closed.
func TestAnswersAfterCloseLeaveTheZoneAlone(t *testing.T) {
	r, g := gatedRig(t)
	k := pageid.MakeKey(r.vol.ID, 6)
	g.Hold()
	r.e.Prefetch(k)
	done := make(chan error, 1)
	r.e.ReadPageAsync(k, make([]byte, pageid.Size), func(err error) { done <- err })
	r.e.Close()
	g.Release()
	require.ErrorIs(t, <-done, errClosed)
	assert.Zero(t, r.lz.Placed.Load())
	assert.False(t, r.hv.Contains(uint64(k)))
	assert.Equal(t, uint64(1), r.e.Failed.Load())
}

// Close returns only once completions that saw the engine open have
// finished: one still serving a joined miss from the Loading Zone holds
// it, since the zone may be released once Close returns.
func TestCloseWaitsForCompletionsInProgress(t *testing.T) {
	r, g := gatedRig(t)
	k := pageid.MakeKey(r.vol.ID, 8)
	g.Hold()
	r.e.Prefetch(k)
	entered, leave := make(chan struct{}), make(chan struct{})
	var once sync.Once
	release := func() { once.Do(func() { close(leave) }) }
	t.Cleanup(release) // before the rig's: the node's reader must not stay held
	r.e.ReadPageAsync(k, make([]byte, pageid.Size), func(err error) {
		close(entered)
		<-leave
	})
	g.Release()
	<-entered
	closed := make(chan struct{})
	go func() { r.e.Close(); close(closed) }()
	select {
	case <-closed:
		t.Fatal("Close returned while a completion was serving a miss")
	case <-time.After(50 * time.Millisecond):
	}
	release()
	<-closed
}

// TestInvalidateDropsOldCopies: after a write by another connection and
// Invalidate, neither a placed copy nor a prefetch in flight serves the
// old bytes.
func TestInvalidateDropsOldCopies(t *testing.T) {
	r := newRig(t, 256)
	ctx := context.Background()
	dst := make([]byte, pageid.Size)
	for i := uint64(0); i < 100; i++ {
		k := pageid.MakeKey(r.vol.ID, 1+i%100)
		require.NoError(t, r.e.c.(NodeConn).WriteAt(ctx, k.Volume(), k.Page()*pageid.Size, versioned(2*i)))
		r.e.Prefetch(k)
		if i%2 == 0 {
			require.Eventually(t, func() bool { return !r.e.inFlight(k) }, 5*time.Second, time.Millisecond)
		}
		// The host writes around the engine, then tells it.
		require.NoError(t, r.e.c.(NodeConn).WriteAt(ctx, k.Volume(), k.Page()*pageid.Size, versioned(2*i+1)))
		r.e.Invalidate(k)
		// A prefetch in flight has landed, or been dropped, before the look.
		require.Eventually(t, func() bool { return !r.e.inFlight(k) }, 5*time.Second, 50*time.Microsecond)
		if r.lz.CheckAndReturn(uint64(k), dst) == pageid.Size {
			require.Equal(t, 2*i+1, binary.LittleEndian.Uint64(dst), "round %d: old copy served", i)
		}
	}
}
