package cluster

import (
	"context"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestPlaceStripes(t *testing.T) {
	up := func(id string, capacity, stored uint64) Node {
		return Node{NodeRecord: NodeRecord{ID: id, Capacity: capacity}, Up: true, Stored: stored}
	}
	const mib = 1 << 20
	nodes := []Node{up("a", 64*mib, 0), up("b", 64*mib, 0), up("c", 32*mib, 0), {NodeRecord: NodeRecord{ID: "down"}}}
	rng := rand.New(rand.NewPCG(1, 2))
	s, err := PlaceStripes(nodes, 40*mib, 4*mib, 2, rng.IntN)
	require.NoError(t, err)
	assert.Len(t, s.Extents, 10)
	held := map[string]int{}
	for i, e := range s.Extents {
		require.Len(t, e, 2, "extent %d", i)
		assert.NotEqual(t, e[0], e[1], "distinct nodes")
		for _, id := range e {
			held[id]++
		}
	}
	assert.Zero(t, held["down"])
	assert.LessOrEqual(t, held["c"]*4, 32, "c's capacity")
	assert.Greater(t, held["a"], held["c"], "the roomier nodes take more")
	deg, lost := s.Degraded()
	assert.Zero(t, deg+lost)
	assert.Equal(t, []string{"a", "b", "c"}, s.Nodes())

	one, err := PlaceStripes(nodes[:1], 8*mib, 4*mib, 2, rng.IntN)
	require.NoError(t, err)
	assert.Equal(t, 1, one.Replicas, "R is capped by the nodes up")
	_, err = PlaceStripes(nodes, 400*mib, 4*mib, 2, rng.IntN)
	assert.ErrorIs(t, err, ErrNoNode)
	_, err = PlaceStripes(nodes, 4*mib, 4096, 2, rng.IntN)
	assert.Error(t, err)
}

func TestStripesInEtcd(t *testing.T) {
	for name, start := range map[string]func(*testing.T) string{"embedded": embedded, "etcd 3.4": external} {
		t.Run(name, func(t *testing.T) {
			cli := dialEventually(t, start(t))
			ctx := context.Background()
			a, err := NextVolumeID(ctx, cli, "t")
			require.NoError(t, err)
			b, err := NextVolumeID(ctx, cli, "t")
			require.NoError(t, err)
			assert.Equal(t, a+1, b)

			s := Stripes{Epoch: 1, ExtentBytes: 1 << 20, Replicas: 2, Extents: [][]string{{"a", "b"}, {"b", "c"}}}
			rec, err := ReserveVolume(ctx, cli, "t", VolumeRecord{Name: "rv", Size: 2 << 20, Stripes: &s})
			require.NoError(t, err)
			_, err = VolumeCreated(ctx, cli, "t", rec, a, 2<<20)
			require.NoError(t, err)
			got, err := DropReplica(ctx, cli, "t", "rv", 1, "b")
			require.NoError(t, err)
			assert.Equal(t, uint64(2), got.Epoch)
			assert.Equal(t, [][]string{{"a", "b"}, {"c"}}, got.Extents)
			again, err := DropReplica(ctx, cli, "t", "rv", 1, "b")
			require.NoError(t, err, "dropped already")
			assert.Equal(t, got, again)
			_, err = DropReplica(ctx, cli, "t", "rv", 1, "c")
			assert.ErrorIs(t, err, ErrLastReplica)
			rec, err = GetVolume(ctx, cli, "t", "rv")
			require.NoError(t, err)
			assert.Equal(t, got, *rec.Stripes)
		})
	}
}
