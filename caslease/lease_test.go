package caslease

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd3-go/pd3/pageid"
)

// words is a memory node's CAS over a map of words, for one volume.
type words struct {
	mu sync.Mutex
	w  map[uint64]uint64
}

func (m *words) CompareAndSwap(_ context.Context, _ uint16, off, old, new uint64) (uint64, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	cur := m.w[off]
	if cur == old {
		m.w[off] = new
	}
	return cur, nil
}

func TestLease(t *testing.T) {
	ctx := context.Background()
	c := &words{w: map[uint64]uint64{}}
	v := struct{ ID uint16 }{1}
	a := &Lease{C: c, Vol: v.ID, Off: 64, TTL: time.Second}
	b := &Lease{C: c, Vol: v.ID, Off: 64, TTL: time.Second}
	other := &Lease{C: c, Vol: v.ID, Off: 72, TTL: time.Second}

	require.NoError(t, a.Acquire(ctx, 0))
	require.NoError(t, other.Acquire(ctx, 0), "another word is another lease")
	assert.ErrorIs(t, b.Acquire(ctx, 0), pageid.ErrHeld, "held, and no time to wait")
	require.NoError(t, a.Renew(ctx))

	// A node that lost its last writes shows an older lease of a's: still a's.
	old := a.cur
	require.NoError(t, a.Renew(ctx))
	_, err := c.CompareAndSwap(ctx, v.ID, 64, a.cur, old)
	require.NoError(t, err)
	require.NoError(t, a.Renew(ctx), "an older word of our own is ours")

	// Once a stops renewing, b waits the lease out and takes it; a is told.
	start := time.Now()
	require.NoError(t, b.Acquire(ctx, 5*time.Second))
	assert.Greater(t, time.Since(start), 500*time.Millisecond, "b waited for a's lease to run out")
	assert.ErrorIs(t, a.Renew(ctx), pageid.ErrHeld)
	require.NoError(t, a.Release(ctx), "releasing a lost lease changes nothing")
	assert.ErrorIs(t, (&Lease{C: c, Vol: v.ID, Off: 64, TTL: time.Second}).Acquire(ctx, 0), pageid.ErrHeld, "b still holds it")
	require.NoError(t, b.Release(ctx))
	require.NoError(t, (&Lease{C: c, Vol: v.ID, Off: 64, TTL: time.Second}).Acquire(ctx, 0), "free after release")
}
