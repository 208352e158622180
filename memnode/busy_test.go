package memnode

import (
	"context"
	"testing"
	"time"

	"github.com/pd3-go/pd3/pageid"
	"github.com/stretchr/testify/require"
)

// A node serving one connection waits for its requests in poll(2), as a
// NIC would; while it serves a second, both wait in Go's network poller:
// each thread blocked in poll(2) would keep a P that the other
// connection's requests need (docs/decisions.md, 45).
func TestSecondConnectionWaitsInTheNetworkPoller(t *testing.T) {
	srv, addr := startNode(t, "", 0)
	ctx := context.Background()
	a, err := Dial(ctx, addr, ClientOptions{})
	require.NoError(t, err)
	defer a.Close()
	vol, err := a.Create(ctx, "v", 1<<20)
	require.NoError(t, err)
	page := make([]byte, pageid.Size)
	waits := func(polls, parked int) func() bool {
		return func() bool { return srv.busy.Polls() == polls && srv.busy.Parked() == parked }
	}
	require.Eventually(t, waits(1, 0), 10*time.Second, time.Millisecond, "the only connection waits in poll(2)")

	b, err := Dial(ctx, addr, ClientOptions{})
	require.NoError(t, err)
	_, err = b.Open(ctx, "v")
	require.NoError(t, err)
	// a's reader leaves poll(2) with this request and waits in the
	// poller after it.
	require.NoError(t, a.ReadAt(ctx, vol.ID, 0, page))
	require.Eventually(t, waits(0, 2), 10*time.Second, time.Millisecond, "two connections wait in the network poller")

	require.NoError(t, b.Close())
	require.Eventually(t, func() bool { return srv.Stats().Open == 1 }, 10*time.Second, time.Millisecond)
	require.NoError(t, a.ReadAt(ctx, vol.ID, 0, page))
	require.Eventually(t, waits(1, 0), 10*time.Second, time.Millisecond, "alone again, the connection waits in poll(2)")
}
