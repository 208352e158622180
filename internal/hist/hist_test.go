package hist

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestBucketsRoundTrip(t *testing.T) {
	for _, v := range []uint64{0, 1, 63, 64, 65, 127, 128, 1000, 123456, 1 << 40} {
		i := index(v)
		lo := lower(i)
		assert.LessOrEqual(t, lo, v, "v=%d", v)
		assert.Less(t, float64(v-lo), float64(v)/float64(sub)+1, "v=%d", v)
		assert.Greater(t, lower(i+1), v, "v=%d", v)
	}
}

func TestQuantiles(t *testing.T) {
	var h, g H
	for i := 1; i <= 1000; i++ {
		h.Record(time.Duration(i) * time.Microsecond)
	}
	g.Merge(&h)
	assert.InEpsilon(t, 500e3, float64(g.Quantile(0.5)), 0.02)
	assert.InEpsilon(t, 990e3, float64(g.Quantile(0.99)), 0.02)
	assert.Equal(t, uint64(1000), g.Count())
	assert.Equal(t, time.Millisecond, g.Quantile(1))
}
