package bench

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestDelta(t *testing.T) {
	d := delta(map[string]float64{"cache_hits_total": 5e5, "cache_dirty_pages": 3},
		map[string]float64{"cache_hits_total": 1.5e6, "cache_dirty_pages": 12})
	assert.Equal(t, 1e6, d["cache_hits_total"], "counters are differenced")
	assert.Equal(t, 12.0, d["cache_dirty_pages"], "gauges keep the last value")
}
