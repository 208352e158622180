package memnode

import (
	"bytes"
	"context"
	"testing"

	"github.com/pd3-go/pd3/pageid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A byte flipped in a node's memory is answered as pageid.ErrCorrupt, for
// the page that holds it only, and a write of the page heals it; trims and
// atomics keep the sums true.
func TestCorruptPageIsRefused(t *testing.T) {
	srv, addr := startNode(t, "", 0)
	c := dialT(t, addr, "")
	ctx := context.Background()
	v, err := c.Create(ctx, "disk0", 2*ChunkSize)
	require.NoError(t, err)

	data := bytes.Repeat([]byte{0xab}, 4*pageid.Size)
	require.NoError(t, c.WriteAt(ctx, v.ID, ChunkSize-2*pageid.Size, data)) // across two chunks
	require.NoError(t, srv.Store.CorruptForTest(v.ID, ChunkSize+100))       // third page

	got := make([]byte, len(data))
	err = c.ReadAt(ctx, v.ID, ChunkSize-2*pageid.Size, got)
	assert.ErrorIs(t, err, pageid.ErrCorrupt, "a read that covers the page")
	err = c.ReadAt(ctx, v.ID, ChunkSize+pageid.Size-8, got[:8])
	assert.ErrorIs(t, err, pageid.ErrCorrupt, "a read of part of the page")
	require.NoError(t, c.ReadAt(ctx, v.ID, ChunkSize-2*pageid.Size, got[:2*pageid.Size]), "the pages before it")
	assert.Equal(t, data[:2*pageid.Size], got[:2*pageid.Size])
	require.NoError(t, c.ReadAt(ctx, v.ID, ChunkSize+pageid.Size, got[:pageid.Size]), "the page after it")

	// A partial write would seal the flipped byte in: it is refused, as are
	// an atomic and a trim of part of the page; the page stays refused
	// until all of it is written again.
	assert.ErrorIs(t, c.WriteAt(ctx, v.ID, ChunkSize+200, []byte{1, 2, 3}), pageid.ErrCorrupt)
	_, err = c.FetchAndAdd(ctx, v.ID, ChunkSize+8, 1)
	assert.ErrorIs(t, err, pageid.ErrCorrupt)
	assert.ErrorIs(t, c.Trim(ctx, v.ID, ChunkSize+512, 512), pageid.ErrCorrupt)
	assert.ErrorIs(t, c.ReadAt(ctx, v.ID, ChunkSize, got[:pageid.Size]), pageid.ErrCorrupt)
	require.NoError(t, c.WriteAt(ctx, v.ID, ChunkSize, data[:pageid.Size]))
	require.NoError(t, c.ReadAt(ctx, v.ID, ChunkSize, got[:pageid.Size]))
	assert.Equal(t, data[:pageid.Size], got[:pageid.Size])

	// Trims of part of a chunk and atomics update the sums.
	require.NoError(t, c.Trim(ctx, v.ID, ChunkSize-pageid.Size, 2*pageid.Size))
	_, err = c.FetchAndAdd(ctx, v.ID, ChunkSize+pageid.Size+8, 5)
	require.NoError(t, err)
	require.NoError(t, c.ReadAt(ctx, v.ID, ChunkSize-2*pageid.Size, got))
	assert.Equal(t, data[:pageid.Size], got[:pageid.Size])
	assert.Equal(t, make([]byte, 2*pageid.Size), got[pageid.Size:3*pageid.Size])
}

// XOR adds its payload to the bytes there: over a client, across pages
// and over memory never written (zeroes); it reseals the pages it
// changes, refuses a corrupt page without changing it, and a persistent
// node replays it from its log as the bytes that resulted.
func TestXorAddsToTheBytesAndIsLogged(t *testing.T) {
	_, addr := startNode(t, "", 0)
	c := dialT(t, addr, "")
	ctx := context.Background()
	v, err := c.Create(ctx, "vol", 2*ChunkSize)
	require.NoError(t, err)
	a, b := pattern(1, 3*pageid.Size), pattern(2, 3*pageid.Size)
	require.NoError(t, c.WriteAt(ctx, v.ID, 100, a))
	require.NoError(t, c.XorAsync(ctx, v.ID, 100, b).Wait(ctx))
	require.NoError(t, c.XorAsync(ctx, v.ID, ChunkSize, b).Wait(ctx), "memory never written: zeroes")
	got := make([]byte, len(a))
	require.NoError(t, c.ReadAt(ctx, v.ID, 100, got))
	want := make([]byte, len(a))
	for i := range want {
		want[i] = a[i] ^ b[i]
	}
	assert.Equal(t, want, got)
	require.NoError(t, c.ReadAt(ctx, v.ID, ChunkSize, got))
	assert.Equal(t, b, got)

	s := NewStore(0)
	w, err := s.Create("c", ChunkSize)
	require.NoError(t, err)
	require.NoError(t, s.WriteAt(w.ID, 0, a[:pageid.Size]))
	s.CorruptForTest(w.ID, 10)
	assert.ErrorIs(t, s.XorAt(w.ID, 0, b[:pageid.Size]), pageid.ErrCorrupt)

	dir := t.TempDir()
	ps, err := OpenPersistent(dir, 0)
	require.NoError(t, err)
	pv, err := ps.Create("p", ChunkSize)
	require.NoError(t, err)
	require.NoError(t, ps.WriteAt(pv.ID, 100, a))
	require.NoError(t, ps.XorAt(pv.ID, 100, b))
	crash(ps)
	ps, err = OpenPersistent(dir, 0)
	require.NoError(t, err)
	defer ps.Close()
	require.NoError(t, ps.ReadAt(pv.ID, 100, got))
	assert.Equal(t, want, got, "replayed as the bytes that resulted")
	require.NoError(t, ps.Check())
}
