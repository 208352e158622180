package memnode

import (
	"context"
	"testing"
	"time"

	"github.com/pd3-go/pd3/internal/testutil"
	"github.com/pd3-go/pd3/internal/tlsfiles"
	"github.com/pd3-go/pd3/pageid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Mutual TLS: data moves between a node and a client that trust one CA;
// every other pairing fails with an error that says why.
func TestMutualTLS(t *testing.T) {
	serverDir, clientDir := testutil.TestCA(t)
	_, otherClientDir := testutil.TestCA(t)
	serverTLS, err := tlsfiles.ServerFiles(serverDir).Server()
	require.NoError(t, err)
	clientTLS, err := tlsfiles.ClientFiles(clientDir).Client()
	require.NoError(t, err)
	strangerTLS, err := tlsfiles.ClientFiles(otherClientDir).Client()
	require.NoError(t, err)
	anonymousTLS, err := tlsfiles.Files{CA: clientDir + "/" + tlsfiles.CACert}.Client()
	require.NoError(t, err)

	srv := &Server{Store: NewStore(0), TLS: serverTLS}
	addr := serveT(t, srv)
	plainAddr := serveT(t, &Server{Store: NewStore(0)})
	ctx := context.Background()
	dial := func(addr string, cfg ClientOptions) (*Client, error) {
		cfg.DialTimeout, cfg.OpTimeout = 5*time.Second, 5*time.Second
		c, err := Dial(ctx, addr, cfg)
		if err == nil {
			t.Cleanup(func() { c.Close() })
		}
		return c, err
	}

	c, err := dial(addr, ClientOptions{TLS: clientTLS})
	require.NoError(t, err)
	v, err := c.Create(ctx, "disk0", ChunkSize)
	require.NoError(t, err)
	page := make([]byte, pageid.Size)
	copy(page, "over mutual TLS")
	require.NoError(t, c.WriteAt(ctx, v.ID, 3*pageid.Size, page))
	got := make([]byte, pageid.Size)
	require.NoError(t, c.ReadAt(ctx, v.ID, 3*pageid.Size, got))
	assert.Equal(t, page, got)

	_, err = dial(addr, ClientOptions{})
	assert.ErrorIs(t, err, ErrTLSRequired, "a client in clear is told TLS is required")

	_, err = dial(plainAddr, ClientOptions{TLS: clientTLS})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "does not serve TLS")

	_, err = dial(addr, ClientOptions{TLS: strangerTLS})
	require.Error(t, err, "a client trusting another CA refuses the node")
	assert.Contains(t, err.Error(), "certificate")

	_, err = dial(addr, ClientOptions{TLS: anonymousTLS})
	require.Error(t, err, "a client without a certificate is refused")
	assert.Contains(t, err.Error(), "certificate")

	assert.Len(t, srv.Store.List(), 1, "the node survived every refused client")
	require.NoError(t, c.ReadAt(ctx, v.ID, 3*pageid.Size, got), "and so did the good connection")
}
