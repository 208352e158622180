package cluster

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd3-go/pd3/pageid"
)

// Volume records through their life, against the embedded etcd and
// Debian's 3.4 alike (the removal's "nobody holds it" is a prefix compare
// in a transaction, which both must support).
func TestVolumeRecords(t *testing.T) {
	for name, start := range map[string]func(*testing.T) string{"embedded": embedded, "etcd 3.4": external} {
		t.Run(name, func(t *testing.T) {
			endpoint := start(t)
			ctx := context.Background()
			var cli = dialEventually(t, endpoint)
			rec, err := ReserveVolume(ctx, cli, "t", VolumeRecord{Name: "a", Size: 1 << 20, Node: "n1"})
			require.NoError(t, err)
			_, err = ReserveVolume(ctx, cli, "t", VolumeRecord{Name: "a", Size: 2 << 20})
			assert.ErrorIs(t, err, ErrVolumeExists)
			got, err := GetVolume(ctx, cli, "t", "a")
			require.NoError(t, err)
			assert.Equal(t, VolumeCreating, got.State)
			rec, err = VolumeCreated(ctx, cli, "t", rec, 7, 1<<20)
			require.NoError(t, err)
			_, err = VolumeCreated(ctx, cli, "t", got, 8, 1<<20)
			assert.ErrorIs(t, err, ErrRaced, "a record read before the change is stale")
			ensured, err := EnsureVolume(ctx, cli, "t", VolumeRecord{Name: "a", ID: 99})
			require.NoError(t, err)
			assert.Equal(t, uint16(7), ensured.ID, "an existing record is kept")
			assert.Equal(t, VolumeReady, ensured.State)

			h, err := NewHost(ctx, cli, "t", 5*time.Second)
			require.NoError(t, err)
			defer h.Close()
			hold, err := h.Hold(ctx, "a", time.Second)
			require.NoError(t, err)
			_, err = MarkDeleting(ctx, cli, "t", rec)
			assert.ErrorIs(t, err, pageid.ErrHeld)
			_, err = MarkResizing(ctx, cli, "t", rec)
			assert.ErrorIs(t, err, pageid.ErrHeld, "a served volume keeps its size")
			require.NoError(t, hold.Release(ctx))

			rec, err = MarkResizing(ctx, cli, "t", rec)
			require.NoError(t, err)
			hold, err = h.Hold(ctx, "a", time.Second) // a host may hold it, and then sees the state
			require.NoError(t, err)
			got, err = GetVolume(ctx, cli, "t", "a")
			require.NoError(t, err)
			assert.Equal(t, VolumeResizing, got.State)
			rec, err = MarkResizing(ctx, cli, "t", got) // a second command takes a half-done resize up
			assert.ErrorIs(t, err, pageid.ErrHeld)
			require.NoError(t, hold.Release(ctx))
			rec, err = MarkResizing(ctx, cli, "t", got)
			require.NoError(t, err)
			rec, err = VolumeResized(ctx, cli, "t", rec, 4<<20)
			require.NoError(t, err)
			got, err = GetVolume(ctx, cli, "t", "a")
			require.NoError(t, err)
			assert.Equal(t, VolumeReady, got.State)
			assert.Equal(t, uint64(4<<20), got.Size)

			rec, err = MarkDeleting(ctx, cli, "t", rec)
			require.NoError(t, err)
			_, err = MarkResizing(ctx, cli, "t", rec)
			assert.ErrorIs(t, err, ErrNotReady)
			vols, err := Volumes(ctx, cli, "t")
			require.NoError(t, err)
			require.Len(t, vols, 1)
			assert.Equal(t, VolumeDeleting, vols[0].State)
			require.NoError(t, DropVolume(ctx, cli, "t", rec))
			_, err = GetVolume(ctx, cli, "t", "a")
			assert.ErrorIs(t, err, ErrNoVolume)
		})
	}
}

func TestPlace(t *testing.T) {
	up := func(id string, capacity, stored uint64) Node {
		return Node{NodeRecord: NodeRecord{ID: id, Capacity: capacity}, Up: true, Stored: stored}
	}
	down := Node{NodeRecord: NodeRecord{ID: "down"}}
	for _, tc := range []struct {
		name  string
		nodes []Node
		size  uint64
		picks []int
		want  string
	}{
		{"the freer of the two drawn", []Node{up("a", 100, 90), up("b", 100, 10), up("c", 100, 0)}, 5, []int{0, 1}, "b"},
		{"unlimited beats any capacity", []Node{up("a", 1<<40, 0), up("b", 0, 1<<30)}, 5, []int{0, 1}, "b"},
		{"too full is never drawn", []Node{up("a", 100, 99), up("b", 100, 50)}, 20, []int{0, 0}, "b"},
		{"down is never drawn", []Node{down, up("b", 0, 0)}, 5, []int{0, 0}, "b"},
		{"nothing fits", []Node{down, up("a", 100, 90)}, 20, nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			i := 0
			n, err := Place(tc.nodes, tc.size, func(int) int { p := tc.picks[i]; i++; return p })
			if tc.want == "" {
				assert.ErrorIs(t, err, ErrNoNode)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, n.ID)
		})
	}
}
