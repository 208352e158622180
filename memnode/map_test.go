package memnode

import (
	"context"
	"testing"

	"github.com/pd3-go/pd3/pageid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type run struct {
	Off, Len uint64
	Held     bool
}

func mapAll(t *testing.T, c *Client, vol uint16, off, n uint64) []run {
	t.Helper()
	var runs []run
	require.NoError(t, c.Allocated(context.Background(), vol, off, n, func(o, l uint64, held bool) {
		runs = append(runs, run{o, l, held})
	}))
	return runs
}

// MAP answers which chunks hold memory: written ones, until a trim frees
// them whole; a sparse volume's missing segments and requests longer than
// MaxMap included.
func TestMapSaysWhichChunksHoldMemory(t *testing.T) {
	_, addr := startNode(t, "", 0)
	c := dialT(t, addr, "")
	ctx := context.Background()
	v, err := c.Create(ctx, "disk0", 64*ChunkSize)
	require.NoError(t, err)

	assert.Equal(t, []run{{0, 64 * ChunkSize, false}}, mapAll(t, c, v.ID, 0, v.Size), "never written: one hole")

	page := make([]byte, pageid.Size)
	page[0] = 1
	require.NoError(t, c.WriteAt(ctx, v.ID, 3*ChunkSize+5*pageid.Size, page))
	require.NoError(t, c.WriteAt(ctx, v.ID, 4*ChunkSize, page))
	require.NoError(t, c.WriteAt(ctx, v.ID, 9*ChunkSize, page))
	assert.Equal(t, []run{{0, 3 * ChunkSize, false}, {3 * ChunkSize, 2 * ChunkSize, true}, {5 * ChunkSize, 4 * ChunkSize, false},
		{9 * ChunkSize, ChunkSize, true}, {10 * ChunkSize, 54 * ChunkSize, false}}, mapAll(t, c, v.ID, 0, v.Size))

	// A range inside a chunk is the chunk's kind; runs start and end at the range.
	assert.Equal(t, []run{{3*ChunkSize + 7, 100, true}}, mapAll(t, c, v.ID, 3*ChunkSize+7, 100))
	assert.Equal(t, []run{{ChunkSize / 2, 5 * ChunkSize / 2, false}, {3 * ChunkSize, 2, true}}, mapAll(t, c, v.ID, ChunkSize/2, 5*ChunkSize/2+2))

	// A partial trim keeps the chunk; a whole one frees it.
	require.NoError(t, c.Trim(ctx, v.ID, 3*ChunkSize, ChunkSize/2))
	require.NoError(t, c.Trim(ctx, v.ID, 4*ChunkSize, ChunkSize))
	assert.Equal(t, []run{{0, 3 * ChunkSize, false}, {3 * ChunkSize, ChunkSize, true}, {4 * ChunkSize, 5 * ChunkSize, false},
		{9 * ChunkSize, ChunkSize, true}, {10 * ChunkSize, 54 * ChunkSize, false}}, mapAll(t, c, v.ID, 0, v.Size))

	_, err = c.Create(ctx, "huge", 1<<40) // sparse: segments appear on first write
	require.NoError(t, err)
	h, err := c.Open(ctx, "huge")
	require.NoError(t, err)
	at := uint64(700 << 30)
	require.NoError(t, c.WriteAt(ctx, h.ID, at, page))
	assert.Equal(t, []run{{0, at, false}, {at, ChunkSize, true}, {at + ChunkSize, h.Size - at - ChunkSize, false}}, mapAll(t, c, h.ID, 0, h.Size),
		"a terabyte over %d MAP requests", h.Size/MaxMap)

	err = c.Allocated(ctx, v.ID, 0, v.Size+1, func(uint64, uint64, bool) {})
	assert.ErrorIs(t, err, pageid.ErrOutOfRange)
	err = c.Allocated(ctx, 999, 0, 1, func(uint64, uint64, bool) {})
	assert.Error(t, err)
}
