package dpu

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/pd3-go/pd3/memnode"
)

func TestSequential(t *testing.T) {
	var s Sequential
	k := func(p uint64) memnode.Key { return memnode.MakeKey(3, p) }
	assert.Empty(t, s.Access(0, k(0), 4, nil), "first read: no stream yet")
	got := s.Access(0, k(4), 4, nil)
	assert.Equal(t, []memnode.Key{k(8), k(9), k(10), k(11), k(12), k(13), k(14), k(15)}, got, "sequential: window 8 after page 7")
	assert.Len(t, s.Access(0, k(8), 4, nil), 16, "the window doubles")
	assert.Len(t, s.Access(1, k(12), 4, nil), 0, "another source is another stream")
	assert.Empty(t, s.Access(0, k(100), 4, nil), "a jump resets the stream")
	for p := uint64(104); p < 104+64*64; p += 64 {
		got = s.Access(0, k(p), 64, nil)
	}
	assert.Len(t, got, 256, "capped at MaxWindow")
	assert.Equal(t, uint16(3), got[0].Volume())
	assert.Empty(t, s.Access(0, memnode.MakeKey(4, 0), 1, nil), "another volume is another stream")
}
