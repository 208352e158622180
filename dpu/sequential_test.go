package dpu

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd3-go/pd3/pageid"
)

func TestSequential(t *testing.T) {
	var s Sequential
	k := func(p uint64) pageid.Key { return pageid.MakeKey(3, p) }
	assert.Empty(t, s.Access(0, k(0), 4, 0, nil), "first read: no stream yet")
	got := s.Access(0, k(4), 4, 0, nil)
	assert.Equal(t, []pageid.Key{k(8), k(9), k(10), k(11), k(12), k(13), k(14), k(15)}, got, "sequential: window 8 after page 7")
	got = s.Access(0, k(8), 4, 0, nil)
	assert.Equal(t, k(16), got[0], "the window doubles; pages predicted before are not proposed again")
	assert.Equal(t, k(27), got[len(got)-1])
	assert.Len(t, s.Access(1, k(12), 4, 0, nil), 0, "another source is another stream")
	assert.Empty(t, s.Access(0, k(100), 4, 0, nil), "a jump resets the stream")
	for p := uint64(104); p < 104+64*64; p += 64 {
		got = s.Access(0, k(p), 64, 0, nil)
	}
	last := uint64(104 + 64*63 + 64)
	assert.Equal(t, k(last+255), got[len(got)-1], "256 pages ahead at most")
	assert.Len(t, got, 64, "each read proposes only what the window newly covers")
	assert.Empty(t, s.Access(0, pageid.MakeKey(4, 0), 1, 0, nil), "another volume is another stream")

	f := func(p uint64) pageid.Key { return pageid.MakeKey(5, p) }
	s.Access(0, f(0), 1, 5, nil)
	assert.Equal(t, []pageid.Key{f(2), f(3), f(4)}, s.Access(0, f(1), 1, 5, nil), "nothing at or past the file's end (page 5)")
}

// TestSequentialKeepsNoStreamOfAWholeFile: reads that take a whole file
// at once (a tree of small files) leave the predictor no stream to keep,
// and a stream elsewhere keeps its place and window among them.
func TestSequentialKeepsNoStreamOfAWholeFile(t *testing.T) {
	var s Sequential
	k := func(p uint64) pageid.Key { return pageid.MakeKey(1, p) }
	s.Access(0, k(0), 4, 0, nil)
	s.Access(0, k(4), 4, 0, nil)
	for v := uint16(2); v < 2+2*maxStreams; v++ {
		assert.Empty(t, s.Access(0, pageid.MakeKey(v, 0), 4, 4, nil))
	}
	assert.Len(t, s.streams, 1, "streams of whole files kept")
	assert.NotEmpty(t, s.Access(0, k(8), 4, 0, nil), "the stream was dropped")
}

// One stream whose requests come over several connections (NBD
// multi-conn) arrives out of order, and two streams interleave: both are
// followed, nearly every prediction is used, and none is called wasted.
func TestSequentialFollowsInterleavedOutOfOrderStreams(t *testing.T) {
	var s Sequential
	k := func(p uint64) pageid.Key { return pageid.MakeKey(1, p) }
	var predicted []pageid.Key
	for i := uint64(0); i < 400; i += 2 {
		// Stream A reads 32 pages at a time, each pair of requests
		// swapped; stream B, far away, 8 at a time.
		predicted = s.Access(SourceMirrored, k(32*(i+1)), 32, 0, predicted)
		predicted = s.Access(SourceMirrored, k(32*i), 32, 0, predicted)
		predicted = s.Access(SourceMirrored, k(1<<20+8*i), 8, 0, predicted)
		predicted = s.Access(SourceMirrored, k(1<<20+8*(i+1)), 8, 0, predicted)
	}
	st := s.Stats()
	assert.Equal(t, uint64(len(predicted)), st.Predicted.Load())
	assert.Greater(t, st.Useful.Load(), uint64(15000), "both streams' predictions were read (16 000 pages read)")
	assert.Less(t, st.Wasted.Load(), st.Useful.Load()/100, "nearly nothing predicted was left unread behind its stream")
	assert.Zero(t, st.Off.Load())
	seen := map[pageid.Key]bool{}
	for _, p := range predicted {
		assert.False(t, seen[p], "page %v predicted twice", p)
		seen[p] = true
	}
}

// A workload of short runs at random places (two reads in a row, then a
// jump) makes the predictor guess and miss: the governor switches it off,
// it stops proposing pages while it keeps judging, and a long scan brings
// it back.
func TestGovernorSwitchesOffOnRandomRunsAndBack(t *testing.T) {
	var s Sequential
	k := func(p uint64) pageid.Key { return pageid.MakeKey(1, p) }
	rng := rand.New(rand.NewPCG(1, 2))
	st := s.Stats()
	for i := 0; i < 2000 && st.Off.Load() == 0; i++ {
		p := rng.Uint64N(1 << 30)
		s.Access(SourceMirrored, k(p), 2, 0, nil)
		s.Access(SourceMirrored, k(p+2), 2, 0, nil)
	}
	require.Equal(t, uint32(1), st.Off.Load(), "random runs switch the predictor off")
	assert.Less(t, float64(st.Useful.Load()), 0.3*float64(st.Useful.Load()+st.Wasted.Load()))
	before := st.Predicted.Load()
	for range 200 {
		p := rng.Uint64N(1 << 30)
		assert.Empty(t, s.Access(SourceMirrored, k(p), 2, 0, nil))
		assert.Empty(t, s.Access(SourceMirrored, k(p+2), 2, 0, nil), "off: nothing proposed")
	}
	assert.Equal(t, before, st.Predicted.Load())
	// A scan: judged while off, accurate, so the predictor comes back.
	p := uint64(1 << 40)
	for ; p < 1<<40+1<<14 && st.Off.Load() == 1; p += 32 {
		s.Access(SourceMirrored, k(p), 32, 0, nil)
	}
	assert.Equal(t, uint32(0), st.Off.Load(), "an accurate stream brings it back")
	assert.NotEmpty(t, s.Access(SourceMirrored, k(p), 32, 0, nil))
	assert.GreaterOrEqual(t, st.Switches.Load(), uint64(2))
}
