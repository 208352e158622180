package dpu

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/pd3-go/pd3/memnode"
)

func TestSequential(t *testing.T) {
	var s Sequential
	k := func(p uint64) memnode.Key { return memnode.MakeKey(3, p) }
	assert.Empty(t, s.Access(0, k(0), 4, 0, nil), "first read: no stream yet")
	got := s.Access(0, k(4), 4, 0, nil)
	assert.Equal(t, []memnode.Key{k(8), k(9), k(10), k(11), k(12), k(13), k(14), k(15)}, got, "sequential: window 8 after page 7")
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
	assert.Empty(t, s.Access(0, memnode.MakeKey(4, 0), 1, 0, nil), "another volume is another stream")

	f := func(p uint64) memnode.Key { return memnode.MakeKey(5, p) }
	s.Access(0, f(0), 1, 5, nil)
	assert.Equal(t, []memnode.Key{f(2), f(3), f(4)}, s.Access(0, f(1), 1, 5, nil), "nothing at or past the file's end (page 5)")
}
