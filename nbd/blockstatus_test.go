package nbd

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type extent struct {
	Offset uint64 `json:"offset"`
	Length uint64 `json:"length"`
	Type   uint32 `json:"type"`
}

func nbdMap(t *testing.T, uri string) []extent {
	t.Helper()
	var m []extent
	require.NoError(t, json.Unmarshal([]byte(run(t, "nbdinfo", "--map", "--json", uri)), &m))
	return m
}

// BLOCK_STATUS base:allocation shows a volume's real shape to copy and
// backup tools: what was never written, or was trimmed, is a hole that
// reads as zeroes; a write the cache still holds is data already.
func TestBlockStatusMapsHoles(t *testing.T) {
	need(t, "nbdinfo", "nbdcopy")
	const size, at, n = 256 << 20, 64 << 20, 16 << 20
	r := newRig(t, size, 64<<20)
	uri := r.uri("disk0")
	assert.Equal(t, []extent{{0, size, 3}}, nbdMap(t, uri), "a fresh volume is one hole")

	// Written into the cache, not flushed: BLOCK_STATUS writes it back
	// first, so the range is data.
	data := bytes.Repeat([]byte{0xab, 0xcd, 0xef}, n/3+1)[:n]
	vol := r.srv.Exports[0].Volume
	require.NoError(t, r.store.WriteRange(context.Background(), vol, at, data))
	assert.Equal(t, []extent{{0, at, 3}, {at, n, 0}, {at + n, size - at - n, 3}}, nbdMap(t, uri))

	// The copy skips the holes and is the volume, byte for byte.
	out := filepath.Join(t.TempDir(), "out.img")
	run(t, "nbdcopy", uri, out)
	got, err := os.ReadFile(out)
	require.NoError(t, err)
	require.Len(t, got, size)
	assert.True(t, bytes.Equal(data, got[at:at+n]), "the data")
	zero := make([]byte, size-at-n)
	assert.True(t, bytes.Equal(zero[:at], got[:at]), "zeroes before")
	assert.True(t, bytes.Equal(zero, got[at+n:]), "zeroes after")

	// A trimmed megabyte is a hole again.
	require.NoError(t, r.store.ZeroRange(context.Background(), vol, at+4<<20, 1<<20, false))
	assert.Equal(t, []extent{{0, at, 3}, {at, 4 << 20, 0}, {at + 4<<20, 1 << 20, 3}, {at + 5<<20, n - 5<<20, 0}, {at + n, size - at - n, 3}}, nbdMap(t, uri))
}
