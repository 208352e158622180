package memnode

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd3-go/pd3/pageid"
)

// Fencing: once a newer holder presents its token, the older holder's
// writes and deletes (and writes of a client with no token) are refused
// while reads go on; a stale token cannot be presented again.
func TestFencing(t *testing.T) {
	_, addr := startNode(t, "", 0)
	ctx := context.Background()
	old, next, plain := dialT(t, addr, ""), dialT(t, addr, ""), dialT(t, addr, "")
	v, err := old.Create(ctx, "disk0", ChunkSize)
	require.NoError(t, err)
	page := make([]byte, pageid.Size)

	require.NoError(t, plain.WriteAt(ctx, v.ID, 0, page), "no token presented yet: no fence")
	require.NoError(t, old.Fence(ctx, v.ID, 1))
	copy(page, "old holder")
	require.NoError(t, old.WriteAt(ctx, v.ID, 0, page))
	assert.ErrorIs(t, plain.WriteAt(ctx, v.ID, 0, page), pageid.ErrFenced, "a writer without a token, once the volume has one")

	require.NoError(t, next.Fence(ctx, v.ID, 2))
	copy(page, "late write")
	assert.ErrorIs(t, old.WriteAt(ctx, v.ID, 0, page), pageid.ErrFenced)
	assert.ErrorIs(t, old.Trim(ctx, v.ID, 0, pageid.Size), pageid.ErrFenced)
	_, err = old.CompareAndSwap(ctx, v.ID, 0, 0, 1)
	assert.ErrorIs(t, err, pageid.ErrFenced)
	got := make([]byte, pageid.Size)
	require.NoError(t, old.ReadAt(ctx, v.ID, 0, got), "reads are never fenced")
	assert.Equal(t, "old holder", string(got[:10]))
	assert.ErrorIs(t, old.Fence(ctx, v.ID, 1), pageid.ErrFenced, "a superseded token is not taken back")

	copy(page, "new holder")
	require.NoError(t, next.WriteAt(ctx, v.ID, 0, page))
	require.NoError(t, next.Fence(ctx, v.ID, 2), "presenting the same token again is harmless")
	require.NoError(t, next.WriteAt(ctx, v.ID, 0, page))
	require.NoError(t, plain.ReadAt(ctx, v.ID, 0, got))
	assert.Equal(t, "new holder", string(got[:10]))

	// The superseded holder's DELETE does not free the new holder's volume;
	// the holder's own does, and an operator's (token 0) is not fenced.
	assert.ErrorIs(t, old.DeleteFenced(ctx, "disk0", 1), pageid.ErrFenced)
	_, err = plain.Open(ctx, "disk0")
	require.NoError(t, err, "still there")
	require.NoError(t, next.DeleteFenced(ctx, "disk0", 2))
	_, err = plain.Create(ctx, "scratch", ChunkSize)
	require.NoError(t, err)
	require.NoError(t, plain.Delete(ctx, "scratch"))
}

// A persistent node keeps its volumes' fences across a restart: the
// superseded host must not land a write on the restarted node.
func TestFencePersists(t *testing.T) {
	dir := t.TempDir()
	s, err := OpenPersistent(dir, 0)
	require.NoError(t, err)
	srv := &Server{Store: s}
	addr := serveT(t, srv)
	c := dialT(t, addr, "")
	ctx := context.Background()
	v, err := c.Create(ctx, "disk0", ChunkSize)
	require.NoError(t, err)
	require.NoError(t, c.Fence(ctx, v.ID, 7))
	c.Close()
	srv.Close()
	require.NoError(t, s.Close())

	s, err = OpenPersistent(dir, 0)
	require.NoError(t, err)
	defer s.Close()
	f, err := s.Fence(v.ID)
	require.NoError(t, err)
	assert.Equal(t, uint64(7), f)

	// The superseded holder comes back with its token: refused.
	srv = &Server{Store: s}
	stale := dialT(t, serveT(t, srv), "")
	require.ErrorIs(t, stale.Fence(ctx, v.ID, 6), pageid.ErrFenced)
	assert.ErrorIs(t, stale.WriteAt(ctx, v.ID, 0, make([]byte, pageid.Size)), pageid.ErrFenced)
}

// A fence raised while a write of the superseded token is between its
// token check and its copy: the raise, and so the new holder's BIND, waits
// for that write, which lands first; once the BIND is answered nothing of
// the old holder lands. Without the fence lock the BIND was answered at
// once and the old write landed after the new holder had read.
func TestFenceRaiseWaitsForWritesInFlight(t *testing.T) {
	srv, addr := startNode(t, "", 0)
	ctx := context.Background()
	old, next := dialT(t, addr, ""), dialT(t, addr, "")
	v, err := old.Create(ctx, "disk0", ChunkSize)
	require.NoError(t, err)
	require.NoError(t, old.Fence(ctx, v.ID, 1))
	vol, err := srv.Store.volume(v.ID)
	require.NoError(t, err)

	held, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	srv.Store.afterFenceCheck = func() { once.Do(func() { close(held); <-release }) }
	raising := make(chan struct{})
	var raiseOnce sync.Once
	srv.Store.beforeRaise = func(token uint64) {
		if token == 2 {
			raiseOnce.Do(func() { close(raising) })
		}
	}

	page := make([]byte, pageid.Size)
	copy(page, "old holder")
	wrote := make(chan error, 1)
	go func() { wrote <- old.WriteAt(ctx, v.ID, 0, page) }()
	<-held // the old holder's write passed its check
	bound := make(chan error, 1)
	go func() { bound <- next.Fence(ctx, v.ID, 2) }()
	<-raising

	read := func() string {
		got := make([]byte, pageid.Size)
		require.NoError(t, next.ReadAt(ctx, v.ID, 0, got))
		return string(got[:10])
	}
	// Either the BIND is answered (the race) or the raise waits for the
	// write: a raise waiting for the lock makes TryRLock fail.
	var answered bool
	var bindErr error
	require.Eventually(t, func() bool {
		select {
		case bindErr = <-bound:
			answered = true
			return true
		default:
		}
		if vol.fenceMu.TryRLock() {
			vol.fenceMu.RUnlock()
			return false
		}
		return true
	}, 5*time.Second, time.Millisecond)
	if answered {
		require.NoError(t, bindErr)
		before := read()
		close(release)
		require.NoError(t, <-wrote)
		assert.Equal(t, before, read(), "a write of the superseded holder landed after the new holder's BIND was answered")
		return
	}
	close(release)
	require.NoError(t, <-wrote, "the write that passed its check before the raise lands")
	require.NoError(t, <-bound)
	assert.Equal(t, "old holder", read())
	copy(page, "late write")
	assert.ErrorIs(t, old.WriteAt(ctx, v.ID, 0, page), pageid.ErrFenced)
	assert.Equal(t, "old holder", read(), "nothing of the old holder lands after the raise")
}
