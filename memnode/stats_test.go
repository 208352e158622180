package memnode

import (
	"context"
	"testing"

	"github.com/pd3-go/pd3/pageid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestStatsCountRequestsBytesFailuresAndRefusals(t *testing.T) {
	srv, addr := startNode(t, "secret", 0)
	ctx := context.Background()
	c := dialT(t, addr, "secret")
	v, err := c.Create(ctx, "disk0", 1<<20)
	require.NoError(t, err)
	page := make([]byte, pageid.Size)
	require.NoError(t, c.WriteAt(ctx, v.ID, 0, page))
	require.NoError(t, c.WriteAt(ctx, v.ID, pageid.Size, page[:512]))
	require.NoError(t, c.ReadAt(ctx, v.ID, 0, page))
	assert.ErrorIs(t, c.ReadAt(ctx, v.ID, 1<<20, page), pageid.ErrOutOfRange)

	open := srv.Stats()
	assert.Equal(t, uint64(1), open.Open, "the client's connection is counted while open")

	_, err = Dial(ctx, addr, ClientOptions{Token: "guess"})
	require.ErrorIs(t, err, ErrUnauthorised)
	c.Close()
	srv.Close() // waits for every connection's goroutine: the counts are final

	s := srv.Stats()
	assert.Equal(t, uint64(2), s.Connections)
	assert.Equal(t, uint64(0), s.Open)
	assert.Equal(t, uint64(1), s.Refused, "the wrong token")
	assert.Equal(t, uint64(2), s.Requests[OpWrite])
	assert.GreaterOrEqual(t, s.Requests[OpRead], uint64(1), "the read that failed may be refused before it reaches the node")
	assert.Equal(t, uint64(2), s.Requests[OpHello])
	assert.Equal(t, uint64(pageid.Size+512), s.WrittenBytes)
	assert.Equal(t, uint64(pageid.Size), s.ReadBytes, "only the read that succeeded")
	assert.Equal(t, open.Requests[OpWrite], s.Requests[OpWrite], "a closed connection's counts are kept")
	assert.GreaterOrEqual(t, s.Failed, uint64(1), "the wrong token at least")
}
