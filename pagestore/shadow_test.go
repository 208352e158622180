package pagestore

import (
	"context"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd3-go/pd3/pageid"
)

// runRecorder is a memory remote that reads runs asynchronously and
// records each run it was asked for.
type runRecorder struct {
	*MemRemote
	wg   sync.WaitGroup
	mu   sync.Mutex
	runs [][2]uint64 // first page, pages
}

func (r *runRecorder) ReadPagesAsync(first pageid.Key, p []byte, done func(error)) {
	r.mu.Lock()
	r.runs = append(r.runs, [2]uint64{first.Page(), uint64(len(p) / pageid.Size)})
	r.mu.Unlock()
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		done(r.ReadPages(context.Background(), first, p))
	}()
}

// TestShadowReadsFetchWhatWasServed: with Options.Shadow every read the
// store serves from its cache — through GetAsync, ReadRange and
// ReadStream — has its pages read from the remote once more, nearby
// reads together; without it the remote is not asked.
func TestShadowReadsFetchWhatWasServed(t *testing.T) {
	for _, shadow := range []bool{false, true} {
		ctx := context.Background()
		rem := &runRecorder{MemRemote: NewMemRemote()}
		s, err := New(rem, Options{CacheBytes: 64 * pageid.Size, Shadow: shadow})
		require.NoError(t, err)
		s.AddVolume(pageid.VolumeInfo{ID: 1, Name: "v", Size: 32 * pageid.Size})
		for p := range uint64(32) {
			require.NoError(t, s.WriteRange(ctx, 1, p*pageid.Size, fill(pageid.MakeKey(1, p), 1)))
		}

		misses := s.Stats().Misses
		buf := make([]byte, 8*pageid.Size)
		require.NoError(t, s.ReadRange(ctx, 1, 2*pageid.Size+100, buf[:3*pageid.Size]))
		assert.Equal(t, fill(pageid.MakeKey(1, 3), 1), buf[pageid.Size-100:2*pageid.Size-100])
		for _, run := range [][2]uint64{{7, 1}, {8, 4}} {
			finished, err := s.GetAsync(pageid.MakeKey(1, run[0]), buf[:run[1]*pageid.Size], func(error) { t.Error("a hit has no round trip to wait for") })
			require.NoError(t, err)
			assert.True(t, finished)
			assert.Equal(t, fill(pageid.MakeKey(1, run[0]+run[1]-1), 1), buf[(run[1]-1)*pageid.Size:run[1]*pageid.Size])
		}
		require.NoError(t, s.ReadStream(ctx, 1, 16*pageid.Size, buf))
		assert.Equal(t, fill(pageid.MakeKey(1, 23), 1), buf[7*pageid.Size:])
		rem.wg.Wait()

		if !shadow {
			s.shadowFlush()
			rem.wg.Wait()
			assert.Empty(t, rem.runs, "without Shadow a hit asks the remote nothing")
			assert.Zero(t, s.Stats().ShadowPages)
			continue
		}
		assert.Empty(t, rem.runs, "the reads make one run, not read yet")
		s.shadowFlush()
		rem.wg.Wait()
		assert.Equal(t, [][2]uint64{{2, 22}}, rem.runs, "the reads' pages, the partial ones whole, and the few between them, in one request")
		st := s.Stats()
		assert.EqualValues(t, 22, st.ShadowPages)
		assert.Equal(t, misses, st.Misses, "every read was served from the cache")
		assert.NoError(t, s.Check())
	}
}

// TestShadowRunsFollowStreams: reads that continue a pending run extend
// it and leave in runs of shadowRunPages; a read elsewhere starts a run
// of its own, and the run extended least recently is read when a new one
// needs its slot.
func TestShadowRunsFollowStreams(t *testing.T) {
	var sh shadow
	var ready []shadowRun
	for p := uint64(0); p < 320; p += 32 {
		ready = sh.note(1, p, p+32, ready)
	}
	assert.Equal(t, []shadowRun{{vol: 1, first: 0, end: shadowRunPages}}, ready, "a sequential stream: one run a MiB")
	ready = sh.note(2, 320, 330, ready[:0])
	assert.Empty(t, ready, "another volume's pages start a run of their own")
	for i := range uint64(shadowRuns - 2) {
		ready = sh.note(1, 10_000*(i+1), 10_000*(i+1)+1, ready)
	}
	assert.Empty(t, ready, "eight streams pending at once")
	ready = sh.note(1, 320+shadowGap, 320+shadowGap+1, ready)
	assert.Empty(t, ready, "a read a little past a run's end extends it")
	ready = sh.note(1, 99_999, 100_000, ready)
	require.Len(t, ready, 1, "a ninth stream takes the slot extended least recently")
	assert.Equal(t, shadowRun{vol: 2, first: 320, end: 330}, ready[0].withoutTick())
}

func (r shadowRun) withoutTick() shadowRun { r.touched = 0; return r }
