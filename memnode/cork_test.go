package memnode

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/pd3-go/pd3/internal/pipeline"
	"github.com/pd3-go/pd3/pageid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A write-back batch over a client with a cork leaves in one write, and
// reads back (docs/decisions.md, 48).
func TestWritePagesLeaveInOneWrite(t *testing.T) {
	_, addr := startNode(t, "", 0)
	ctx := context.Background()
	c, err := Dial(ctx, addr, ClientOptions{OpTimeout: 5 * time.Second, Cork: new(pipeline.Cork)})
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	v, err := c.Create(ctx, "v", 1<<20)
	require.NoError(t, err)
	var keys []pageid.Key
	var pages [][]byte
	for i := range 3 {
		keys = append(keys, pageid.MakeKey(v.ID, uint64(i)))
		pages = append(pages, bytes.Repeat([]byte{byte(i + 1)}, pageid.Size))
	}
	before := c.RequestWrites()
	require.NoError(t, Remote{C: c}.WritePages(ctx, keys, pages))
	assert.Equal(t, uint64(1), c.RequestWrites()-before, "writes carrying 3 pages")
	got := make([]byte, pageid.Size)
	for i, k := range keys {
		require.NoError(t, c.ReadAt(ctx, v.ID, k.Page()*pageid.Size, got))
		assert.Equal(t, pages[i], got, "page %d", i)
	}
}

// A dial made while the cork is held (a redial on the way of a request
// sent under a hold) is not held up: its HELLO is answered before the dial
// returns, so it cannot wait for the holder's release.
func TestDialUnderAHeldCork(t *testing.T) {
	_, addr := startNode(t, "", 0)
	ctx := context.Background()
	cork := new(pipeline.Cork)
	cork.Hold()
	c, err := Dial(ctx, addr, ClientOptions{OpTimeout: 5 * time.Second, DialTimeout: 5 * time.Second, Cork: cork})
	cork.Release()
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	_, err = c.Create(ctx, "v", 1<<20)
	require.NoError(t, err)
}
