package loadingzone

import (
	"encoding/binary"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/pd3-go/pd3/internal/shm"
	"github.com/pd3-go/pd3/pageid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func newZone(t testing.TB, n int) *Zone {
	t.Helper()
	r, err := shm.Create("", Size(n))
	require.NoError(t, err)
	t.Cleanup(func() { r.Close() })
	z, err := Format(r.Bytes(), n, 1)
	require.NoError(t, err)
	t.Cleanup(func() { assert.NoError(t, z.Check()) })
	return z
}

// page fills a page with (key, seq) repeated, so a torn copy is visible.
func page(k, seq uint64) []byte {
	p := make([]byte, pageid.Size)
	for i := 0; i < pageid.Size; i += 16 {
		binary.LittleEndian.PutUint64(p[i:], k)
		binary.LittleEndian.PutUint64(p[i+8:], seq)
	}
	return p
}

func intact(p []byte) (k, seq uint64, ok bool) {
	k, seq = binary.LittleEndian.Uint64(p), binary.LittleEndian.Uint64(p[8:])
	for i := 0; i < pageid.Size; i += 16 {
		if binary.LittleEndian.Uint64(p[i:]) != k || binary.LittleEndian.Uint64(p[i+8:]) != seq {
			return k, seq, false
		}
	}
	return k, seq, true
}

func TestPlaceConsumeOnce(t *testing.T) {
	z := newZone(t, 8)
	dst := make([]byte, pageid.Size)
	assert.Zero(t, z.CheckAndReturn(5, dst))
	z.Place(5, page(5, 1))
	assert.Equal(t, pageid.Size, z.CheckAndReturn(5, dst))
	assert.Equal(t, page(5, 1), dst)
	assert.Zero(t, z.CheckAndReturn(5, dst), "a record is consumed once")
	z.Place(6, page(6, 1))
	assert.True(t, z.Invalidate(6))
	assert.Zero(t, z.CheckAndReturn(6, dst), "invalidated records are never returned")
	// Placing a key twice supersedes the first copy.
	z.Place(7, page(7, 1))
	z.Place(7, page(7, 2))
	assert.Equal(t, pageid.Size, z.CheckAndReturn(7, dst))
	assert.Equal(t, page(7, 2), dst)
	assert.Zero(t, z.CheckAndReturn(7, dst))
}

func TestWrapDropsOldestAndReports(t *testing.T) {
	z := newZone(t, 16)
	var dropped []uint64
	z.OnDrop = func(k uint64) { dropped = append(dropped, k) }
	for k := uint64(1); k <= 48; k++ {
		z.Place(k, page(k, 0))
	}
	dst := make([]byte, pageid.Size)
	for k := uint64(1); k <= 32; k++ {
		assert.Zero(t, z.CheckAndReturn(k, dst), "key %d should have been reclaimed", k)
	}
	found := 0
	for k := uint64(33); k <= 48; k++ {
		if z.CheckAndReturn(k, dst) == pageid.Size {
			found++
			_, seq, ok := intact(dst)
			assert.True(t, ok)
			assert.Zero(t, seq)
		}
	}
	// Two 4-entry buckets per key in an index of 4× the records: none lost.
	assert.Equal(t, 16, found)
	assert.Equal(t, uint64(32), z.DroppedUnconsumed.Load())
	assert.Len(t, dropped, 32)
	assert.Equal(t, uint64(48), z.Tail())
}

func TestAttachChecksLayout(t *testing.T) {
	z := newZone(t, 4)
	_, err := Attach(make([]byte, 100))
	assert.ErrorIs(t, err, ErrLayout)
	z2, err := Attach(z.b)
	require.NoError(t, err)
	assert.Equal(t, 4, z2.Records())
	assert.Equal(t, uint64(1), z2.Epoch())
}

// TestStress: one producer wraps a small ring many times while consumers
// take random recent keys. Every page returned must be intact, carry the
// key asked for, and each produced (key, seq) is returned at most once.
func TestStress(t *testing.T) {
	const n, keys, rounds, consumers = 64, 256, 60000, 4
	z := newZone(t, n)
	var seq atomic.Uint64
	taken := sync.Map{}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var hits atomic.Uint64
	for c := 0; c < consumers; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(c), 1))
			dst := make([]byte, pageid.Size)
			for {
				select {
				case <-stop:
					return
				default:
				}
				k := uint64(rng.IntN(keys)) + 1
				if z.CheckAndReturn(k, dst) != pageid.Size {
					// A spinning consumer would hold a lone P for a whole
					// preemption slice.
					runtime.Gosched()
					continue
				}
				hits.Add(1)
				gk, gs, ok := intact(dst)
				if !ok || gk != k {
					t.Errorf("torn or wrong page: asked %d, got key %d seq %d intact=%v", k, gk, gs, ok)
					return
				}
				if _, dup := taken.LoadOrStore([2]uint64{gk, gs}, true); dup {
					t.Errorf("record (%d,%d) consumed twice", gk, gs)
					return
				}
			}
		}()
	}
	// The producer runs until the consumers have taken enough pages to have
	// raced it, not for a fixed time: with one P (go test -cpu 1) or a loaded
	// machine, consumers only run when the producer yields or is preempted,
	// so it yields every few placements and keeps going, up to a bound that
	// no scheduler needs, until minHits pages were consumed.
	const minHits, maxRounds = 1000, 100 * rounds
	rng := rand.New(rand.NewPCG(99, 1))
	i := 0
	for ; i < maxRounds && (i < rounds || hits.Load() < minHits); i++ {
		k := uint64(rng.IntN(keys)) + 1
		z.Place(k, page(k, seq.Add(1)))
		if i%7 == 0 {
			z.Invalidate(uint64(rng.IntN(keys)) + 1)
		}
		if i%16 == 0 {
			runtime.Gosched()
		}
	}
	close(stop)
	wg.Wait()
	assert.GreaterOrEqual(t, hits.Load(), uint64(minHits), "consumers must actually race the producer (%d placements)", i)
	t.Logf("placed %d, hits %d, dropped %d, invalidated %d, index lost %d",
		z.Placed.Load(), z.Hits.Load(), z.DroppedUnconsumed.Load(), z.Invalidated.Load(), z.IndexLost.Load())
}

// The index keeps one entry per record at most, of its current
// generation, however records end (consumed, reclaimed unconsumed,
// superseded by the same key, invalidated): Check fails on any other.
// Without that, stale entries fill the index and every Place reads the
// states of the records they name.
func TestIndexHoldsOnlyCurrentRecords(t *testing.T) {
	const n = 64
	z := newZone(t, n)
	rng := rand.New(rand.NewPCG(3, 4))
	dst := make([]byte, pageid.Size)
	for i := range 20 * n {
		k := rng.Uint64N(3 * n)
		z.Place(k, page(k, uint64(i)))
		switch rng.IntN(4) {
		case 0:
			z.CheckAndReturn(rng.Uint64N(3*n), dst)
		case 1:
			z.Invalidate(rng.Uint64N(3 * n))
		}
		require.NoError(t, z.Check(), "after %d places", i+1)
	}
	used := 0
	for i := uint64(0); i <= z.imask; i++ {
		if z.idx(i).Load() != 0 {
			used++
		}
	}
	assert.LessOrEqual(t, used, n)
	assert.Zero(t, z.IndexLost.Load())
}

// TestInvalidateRange drops the produced records of keys in [lo, hi) and
// only those, naming each, and skips consumed ones.
func TestInvalidateRange(t *testing.T) {
	z := newZone(t, 16)
	for _, k := range []uint64{9, 10, 11, 15, 19, 20} {
		z.Place(k, page(k, 1))
	}
	dst := make([]byte, pageid.Size)
	require.Equal(t, pageid.Size, z.CheckAndReturn(11, dst)) // consumed: not dropped again
	var dropped []uint64
	z.InvalidateRange(10, 20, func(k uint64) { dropped = append(dropped, k) })
	assert.ElementsMatch(t, []uint64{10, 15, 19}, dropped)
	for _, k := range []uint64{10, 11, 15, 19} {
		assert.Zero(t, z.CheckAndReturn(k, dst), "key %d", k)
	}
	for _, k := range []uint64{9, 20} {
		assert.Equal(t, pageid.Size, z.CheckAndReturn(k, dst), "key %d outside the range", k)
	}
}
