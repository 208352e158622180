package pagestore

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd3-go/pd3/pageid"
)

func TestGhostRemembersForSpan(t *testing.T) {
	for _, span := range []int{1, 3, 64, 1000} {
		g := newGhost(span)
		g.remember(7)
		for i := range span - 1 {
			g.remember(pageid.Key(1000 + i))
		}
		assert.True(t, g.take(7), "span %d: remembered %d remembers ago", span, span-1)
		assert.False(t, g.take(7), "span %d: a take forgets", span)

		g.remember(8)
		for i := range span {
			g.remember(pageid.Key(5000 + i))
		}
		assert.False(t, g.take(8), "span %d: remembered %d remembers ago", span, span)

		g.remember(9)
		g.remember(9)
		assert.True(t, g.take(9), "span %d", span)
		assert.False(t, g.take(9), "span %d: a key remembered twice is kept once", span)
	}
}

func TestGhostAcrossTheSequenceWrap(t *testing.T) {
	g := newGhost(8)
	g.seq = 1<<32 - 3
	g.remember(1)
	for i := range 6 { // past 2^32, where 0 is skipped: a life one shorter
		g.remember(pageid.Key(100 + i))
	}
	assert.True(t, g.take(1), "remembered 6 remembers ago, across the wrap")
	assert.True(t, g.take(101), "remembered where the sequence wrapped")
	g.remember(2)
	for i := range 8 {
		g.remember(pageid.Key(200 + i))
	}
	assert.False(t, g.take(2), "remembered 8 remembers ago, across the wrap")
}

// The ghost may forget a key early when its bucket fills, and must never
// say yes for a key it was not told.
func TestGhostForgetsFewEarlyAndInventsNone(t *testing.T) {
	const span = 16384
	g := newGhost(span)
	r := rand.New(rand.NewPCG(1, 2))
	keys := make([]pageid.Key, 0, 10*span)
	for range 10 * span {
		k := pageid.Key(r.Uint64())
		keys = append(keys, k)
		g.remember(k)
	}
	// The last span keys are live, of every age from 0 to span-1.
	lost := 0
	for _, k := range keys[len(keys)-span:] {
		if !g.take(k) {
			lost++
		}
	}
	t.Logf("forgotten early: %d of %d", lost, span)
	assert.Less(t, lost, span/100, "a key is forgotten early rarely")
	for _, k := range keys[:len(keys)-span] {
		require.False(t, g.take(k), "key %v expired", k)
	}
	for range span {
		require.False(t, g.take(pageid.Key(r.Uint64())), "never remembered")
	}
}
