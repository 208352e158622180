package workload

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestZipfSkew(t *testing.T) {
	const n = 10000
	z := NewZipf(n, 0.99)
	r := rand.New(rand.NewPCG(1, 2))
	counts := make([]int, n)
	for i := 0; i < 200000; i++ {
		counts[z.rank(r)]++
	}
	// Rank 0 is the most popular and ranks follow the power law roughly:
	// p(0)/p(9) ≈ 10^0.99.
	assert.Greater(t, counts[0], counts[1])
	ratio := float64(counts[0]) / float64(counts[9])
	assert.InDelta(t, 9.8, ratio, 3)
	for i := 0; i < 1000; i++ {
		assert.Less(t, z.Next(r), uint64(n))
	}
}

func TestParse(t *testing.T) {
	d, err := Parse("zipf:0.99", 100)
	require.NoError(t, err)
	assert.Equal(t, "zipf:0.99", d.String())
	_, err = Parse("zipf:1", 100)
	assert.Error(t, err)
	_, err = Parse("pareto", 100)
	assert.Error(t, err)
}
