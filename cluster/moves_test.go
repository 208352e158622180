package cluster

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestRebalanceMoves(t *testing.T) {
	up := func(id string) Node { return Node{NodeRecord: NodeRecord{ID: id}, Up: true} }
	vol := func(name string, extents ...[]string) VolumeRecord {
		return VolumeRecord{Name: name, Stripes: &Stripes{Replicas: 2, ExtentBytes: 1 << 20, Extents: extents}}
	}
	// Three nodes held 4 extents × 2 replicas; d is new.
	vols := []VolumeRecord{vol("v", []string{"a", "b"}, []string{"b", "c"}, []string{"c", "a"}, []string{"a", "b"})}
	moves := RebalanceMoves([]Node{up("a"), up("b"), up("c"), up("d")}, vols)
	assert.Len(t, moves["v"], 2, "8 replicas over 4 nodes: 2 each, and a and b had 3")
	count := map[string]int{"a": 3, "b": 3, "c": 2}
	for _, m := range moves["v"] {
		assert.Equal(t, "d", m.To)
		assert.NotContains(t, vols[0].Stripes.Extents[m.Extent], "d")
		count[m.From]--
		count[m.To]++
	}
	assert.Equal(t, map[string]int{"a": 2, "b": 2, "c": 2, "d": 2}, count)

	balanced := RebalanceMoves([]Node{up("a"), up("b"), up("c")}, vols)
	assert.Empty(t, balanced, "3,3,2 is within one of the average")
	drain := up("d")
	drain.Draining = true
	assert.Empty(t, RebalanceMoves([]Node{up("a"), up("b"), up("c"), drain}, vols), "a draining node takes nothing")
}

func TestMovesOff(t *testing.T) {
	up := func(id string) Node { return Node{NodeRecord: NodeRecord{ID: id}, Up: true} }
	s := Stripes{Replicas: 2, ExtentBytes: 1 << 20, Extents: [][]string{{"a", "b"}, {"b", "c"}, {"c", "a"}}}
	a := up("a")
	a.Draining = true
	moves, err := MovesOff([]Node{a, up("b"), up("c"), up("d")}, s, s.ExtentBytes, "a", rand.IntN)
	assert.NoError(t, err)
	assert.Len(t, moves, 2)
	for _, m := range moves {
		assert.Equal(t, "a", m.From)
		assert.NotContains(t, s.Extents[m.Extent], m.To)
		assert.NotEqual(t, "a", m.To)
	}
	_, err = MovesOff([]Node{a, up("b")}, s, s.ExtentBytes, "a", rand.IntN)
	assert.ErrorIs(t, err, ErrNoNode, "extent 0 has b already, and nothing else is up")

	// A filesystem's placement (one extent of 4 TiB) off a node, onto
	// nodes of 1 GiB: weighed as what it is, it fits nowhere; as nothing
	// up front (its files grow where it is), anywhere.
	fsys := Stripes{Replicas: 2, ExtentBytes: 4 << 40, Extents: [][]string{{"a", "b"}}}
	small := up("c")
	small.Capacity = 1 << 30
	_, err = MovesOff([]Node{a, up("b"), small}, fsys, fsys.ExtentBytes, "a", rand.IntN)
	assert.ErrorIs(t, err, ErrNoNode)
	moves, err = MovesOff([]Node{a, up("b"), small}, fsys, 0, "a", rand.IntN)
	require.NoError(t, err)
	assert.Equal(t, []Move{{Extent: 0, From: "a", To: "c"}}, moves)
}
