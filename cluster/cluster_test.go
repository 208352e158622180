package cluster

import (
	"context"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pd3-go/pd3/cluster/etcdembed"
	"github.com/pd3-go/pd3/internal/testetcd"
	"github.com/pd3-go/pd3/pageid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// embedded starts an in-process etcd member for the test.
func embedded(t *testing.T) string {
	t.Helper()
	s, err := etcdembed.Start(context.Background(), etcdembed.Config{Dir: t.TempDir()})
	require.NoError(t, err)
	t.Cleanup(s.Close)
	return s.Endpoint
}

// external starts Debian's etcd (3.4) as its own process, as an operator's
// existing control plane would be; skipped where it is not installed.
func external(t *testing.T) string { return externalWith(t, "http") }

// externalWith is external with clients served over scheme (https needs
// the etcd flags of TLS in args).
func externalWith(t *testing.T, scheme string, args ...string) string {
	return testetcd.Start(t, 1, scheme, args...).Clients[0]
}

// dialEventually connects to an etcd that may still be starting; the
// client is closed in cleanup.
func dialEventually(t *testing.T, endpoint string) *clientv3.Client {
	t.Helper()
	var cli *clientv3.Client
	require.Eventually(t, func() bool {
		var err error
		cli, err = Dial(context.Background(), Access{Endpoints: []string{endpoint}})
		return err == nil
	}, 20*time.Second, 100*time.Millisecond)
	t.Cleanup(func() { cli.Close() })
	return cli
}

// Membership against the embedded etcd and Debian's 3.4 alike: a node is up
// while it renews its lease, down once a crash stops the renewals for a
// TTL, and gone when a volatile node stops cleanly.
func TestMembership(t *testing.T) {
	for name, start := range map[string]func(*testing.T) string{"embedded": embedded, "etcd 3.4": external} {
		t.Run(name, func(t *testing.T) {
			endpoint := start(t)
			ctx := context.Background()
			cli := dialEventually(t, endpoint)

			persistent, err := Register(ctx, cli, NodeRecord{ID: "aaa", Addr: "10.0.0.1:7100", Capacity: 1 << 30},
				RegisterOptions{Cluster: "t", TTL: time.Second, Persistent: true, Stored: func() uint64 { return 4 << 20 }})
			require.NoError(t, err)
			volatile, err := Register(ctx, cli, NodeRecord{ID: "bbb", Addr: "10.0.0.2:7100"}, RegisterOptions{Cluster: "t", TTL: time.Second})
			require.NoError(t, err)
			nodes, err := Nodes(ctx, cli, "t")
			require.NoError(t, err)
			require.Len(t, nodes, 2)
			assert.Equal(t, "aaa", nodes[0].ID)
			assert.Equal(t, "up", nodes[0].State())
			assert.Equal(t, uint64(4<<20), nodes[0].Stored)
			assert.Equal(t, "10.0.0.2:7100", nodes[1].Addr)
			other, err := Nodes(ctx, cli, "another")
			require.NoError(t, err)
			assert.Empty(t, other, "clusters do not see each other")

			require.NoError(t, volatile.Close())
			// A crash: the renewals stop and nobody revokes the lease.
			persistent.Abandon()
			require.Eventually(t, func() bool {
				nodes, err := Nodes(ctx, cli, "t")
				return err == nil && len(nodes) == 1 && !nodes[0].Up
			}, 10*time.Second, 100*time.Millisecond, "the crashed node is down, the stopped volatile one gone")

			// Forgetting the down node: refused while a volume names it.
			rec, err := ReserveVolume(ctx, cli, "t", VolumeRecord{Name: "v", Size: 1 << 20, Node: "aaa"})
			require.NoError(t, err)
			assert.ErrorIs(t, Forget(ctx, cli, "t", "aaa"), ErrNodeHolds)
			require.NoError(t, DropVolume(ctx, cli, "t", rec))
			require.NoError(t, Forget(ctx, cli, "t", "aaa"))
			nodes, err = Nodes(ctx, cli, "t")
			require.NoError(t, err)
			assert.Empty(t, nodes)
			assert.ErrorContains(t, Forget(ctx, cli, "t", "aaa"), "no memory node aaa in cluster t")
			up, err := Register(ctx, cli, NodeRecord{ID: "ccc", Addr: "10.0.0.3:7100"}, RegisterOptions{Cluster: "t", TTL: time.Second})
			require.NoError(t, err)
			defer up.Close()
			assert.ErrorIs(t, Forget(ctx, cli, "t", "ccc"), ErrNodeUp)
		})
	}
}

func TestDialUnreachable(t *testing.T) {
	_, err := Dial(context.Background(), Access{Endpoints: []string{"127.0.0.1:1"}})
	assert.ErrorIs(t, err, ErrUnreachable)
	assert.Contains(t, err.Error(), "127.0.0.1:1")
	// The cause, not the client's timeout.
	_, err = Dial(context.Background(), Access{Endpoints: []string{"http://127.0.0.1:1"}})
	assert.ErrorContains(t, err, "connection refused")
	assert.ErrorContains(t, err, "is etcd running there?")
	assert.NotContains(t, err.Error(), "deadline exceeded")
}

func TestNodeIDIsStableInADirectory(t *testing.T) {
	dir := t.TempDir()
	a, err := NodeID(dir)
	require.NoError(t, err)
	b, err := NodeID(dir)
	require.NoError(t, err)
	assert.Equal(t, a, b)
	c, err := NodeID("")
	require.NoError(t, err)
	assert.NotEqual(t, a, c)
	assert.FileExists(t, filepath.Join(dir, "node-id"))
}

// One host holds a volume at a time: a second waits and is refused; it
// gets the volume once the first releases it, or once the first's session
// expires after a crash.
func TestVolumeHolds(t *testing.T) {
	endpoint := embedded(t)
	ctx := context.Background()
	cli, err := Dial(ctx, Access{Endpoints: []string{endpoint}})
	require.NoError(t, err)
	defer cli.Close()
	a, err := NewHost(ctx, cli, "t", time.Second)
	require.NoError(t, err)
	b, err := NewHost(ctx, cli, "t", time.Second)
	require.NoError(t, err)
	defer b.Close()

	ha, err := a.Hold(ctx, "disk0", time.Second)
	require.NoError(t, err)
	_, err = b.Hold(ctx, "disk0", 300*time.Millisecond)
	assert.ErrorIs(t, err, pageid.ErrHeld)
	_, err = b.Hold(ctx, "disk1", time.Second)
	require.NoError(t, err, "other volumes are free")
	holders, err := Holders(ctx, cli, "t")
	require.NoError(t, err)
	require.Contains(t, holders, "disk0")
	require.Contains(t, holders, "disk1")
	assert.Equal(t, os.Getpid(), holders["disk0"].PID)
	require.NoError(t, ha.Release(ctx))
	hb, err := b.Hold(ctx, "disk0", time.Second)
	require.NoError(t, err)
	require.NoError(t, hb.Release(ctx))

	_, err = a.Hold(ctx, "disk0", time.Second)
	require.NoError(t, err)
	// A crash: the renewals stop, and nothing of the host resumes them.
	a.once.Do(func() { close(a.stop) })
	<-a.done
	a.session().Orphan()
	start := time.Now()
	_, err = b.Hold(ctx, "disk0", 5*time.Second)
	require.NoError(t, err, "the crashed holder's session expires")
	assert.Less(t, time.Since(start), 4*time.Second)
}

// The client's "session lost" is checked with etcd before the host gives
// its volumes up: a lease etcd still keeps (the client missed renewals,
// e.g. while the etcd leader changed) is resumed, holds and all; one etcd
// has let go of is lost.
func TestHostSessionResumedOrLost(t *testing.T) {
	cli := dialEventually(t, embedded(t))
	ctx := context.Background()
	h, err := NewHost(ctx, cli, "t", 2*time.Second)
	require.NoError(t, err)
	defer h.Close()
	_, err = h.Hold(ctx, "disk0", time.Second)
	require.NoError(t, err)
	doubts := make(chan bool, 4)
	h.SetDoubt(func(d bool) { doubts <- d })
	h.session().Orphan() // the client's keepalive gives up; etcd's lease lives on
	require.Eventually(t, func() bool { return h.Resumed.Load() == 1 }, 5*time.Second, 10*time.Millisecond)
	assert.True(t, <-doubts, "in doubt while etcd is asked")
	assert.False(t, <-doubts, "and sure again")
	// Past the TTL: a lease etcd would have dropped had the resumed
	// session not renewed it. That is a span of time; nothing shorter
	// shows it (etcd's remaining TTL reads 1 s throughout).
	time.Sleep(3 * time.Second)
	select {
	case <-h.Lost():
		t.Fatal("a lease etcd kept was given up")
	default:
	}
	holders, err := Holders(ctx, cli, "t")
	require.NoError(t, err)
	assert.Contains(t, holders, "disk0", "the hold outlived the client's doubt")

	_, err = cli.Revoke(ctx, h.session().Lease()) // what expiry at etcd does
	require.NoError(t, err)
	select {
	case <-h.Lost():
	case <-time.After(5 * time.Second):
		t.Fatal("a lease etcd let go of is not reported lost")
	}
	assert.Equal(t, uint64(1), h.Resumed.Load())
	assert.True(t, <-doubts, "in doubt, then lost")
	assert.Empty(t, doubts)
}

// A node whose session is lost while it keeps running (etcd restarted
// without its data, or a partition past the TTL) comes back up in the
// cluster's view by itself.
func TestNodeRejoinsAfterLosingItsSession(t *testing.T) {
	cli := dialEventually(t, embedded(t))
	ctx := context.Background()
	r, err := Register(ctx, cli, NodeRecord{ID: "n1", Addr: "10.0.0.1:7100"}, RegisterOptions{Cluster: "t", TTL: time.Second})
	require.NoError(t, err)
	defer r.Close()
	// What a partition past the TTL does to the lease, without the wait.
	_, err = cli.Revoke(ctx, r.session().Lease())
	require.NoError(t, err)
	require.Eventually(t, func() bool { return r.Rejoined.Load() == 1 }, 10*time.Second, 10*time.Millisecond)
	require.Eventually(t, func() bool {
		nodes, err := Nodes(ctx, cli, "t")
		return err == nil && len(nodes) == 1 && nodes[0].Up
	}, 10*time.Second, 50*time.Millisecond, "the node is up again under a new session")
}

// A node stopped while etcd is gone stops: its registration gives up
// rejoining and its goodbye to etcd within a bound (it waited for etcd
// for ever, so a memory node ignored SIGTERM until etcd came back).
func TestNodeStopsWhileEtcdIsGone(t *testing.T) {
	etcd, err := etcdembed.Start(context.Background(), etcdembed.Config{Dir: t.TempDir()})
	require.NoError(t, err)
	cli := dialEventually(t, etcd.Endpoint)
	r, err := Register(context.Background(), cli, NodeRecord{ID: "n1", Addr: "10.0.0.1:7100"}, RegisterOptions{Cluster: "t", TTL: time.Second})
	require.NoError(t, err)
	etcd.Close()
	<-r.session().Done() // lost: the registration now tries to rejoin
	closed := make(chan error, 1)
	go func() { closed <- r.Close() }()
	select {
	case err := <-closed:
		assert.Error(t, err, "etcd is gone: the goodbye could not be said")
	case <-time.After(30 * time.Second):
		t.Fatal("Close does not return while etcd is gone")
	}
}

// The alive key is written when the node's figures change, not on every
// refresh (each put is a write and an fdatasync in etcd), and is put again
// every repairTicks refreshes anyway, which mends a deleted key.
func TestAliveKeyPutWhenItChanges(t *testing.T) {
	cli := dialEventually(t, embedded(t))
	ctx := context.Background()
	var stored, refreshes atomic.Uint64
	stored.Store(4096)
	figures := func() uint64 { refreshes.Add(1); return stored.Load() } // asked at every refresh
	r, err := Register(ctx, cli, NodeRecord{ID: "n1", Addr: "10.0.0.1:7100"},
		RegisterOptions{Cluster: "t", TTL: time.Second, Stored: figures, repairTicks: 6}) // refreshes every 500 ms
	require.NoError(t, err)
	defer r.Close()
	key := prefix("t") + "alive/n1"
	rev := func() int64 {
		resp, err := cli.Get(ctx, key)
		require.NoError(t, err)
		if len(resp.Kvs) == 0 {
			return 0
		}
		return resp.Kvs[0].ModRevision
	}
	first := rev()
	require.NotZero(t, first)
	then := refreshes.Load()
	require.Eventually(t, func() bool { return refreshes.Load() >= then+3 }, 10*time.Second, 10*time.Millisecond,
		"three refreshes, nothing new to say")
	assert.Equal(t, first, rev(), "an unchanged alive key was put again")

	stored.Store(8192)
	require.Eventually(t, func() bool {
		nodes, err := Nodes(ctx, cli, "t")
		return err == nil && len(nodes) == 1 && nodes[0].Stored == 8192
	}, 2*time.Second, 20*time.Millisecond, "the new figure reaches the key")

	_, err = cli.Delete(ctx, key)
	require.NoError(t, err)
	require.Eventually(t, func() bool { return rev() != 0 }, 10*time.Second, 50*time.Millisecond, "a deleted alive key is put again")
}
