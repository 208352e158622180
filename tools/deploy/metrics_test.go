package deploy

import (
	"context"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A scrape takes one snapshot of a component, however many metrics it
// has (the page cache's snapshot walks every frame).
func TestCollectorTakesOneSnapshotPerScrape(t *testing.T) {
	type snap struct{ a, b uint64 }
	calls := 0
	c := newCollector(func() snap { calls++; return snap{a: 3, b: 5} },
		counter("x_total", "x", func(s snap) uint64 { return s.a }),
		gauge("y", "y", func(s snap) float64 { return float64(s.b) }),
	)
	r := prometheus.NewRegistry()
	r.MustRegister(c)
	require.NoError(t, testutil.GatherAndCompare(r, strings.NewReader(`
# HELP pd3_x_total x
# TYPE pd3_x_total counter
pd3_x_total 3
# HELP pd3_y y
# TYPE pd3_y gauge
pd3_y 5
`)))
	assert.Equal(t, 1, calls)
}

// The host's registry has every component's metrics, each read from its
// component (a few spot checks against the components' own counters).
func TestHostRegistry(t *testing.T) {
	h, _ := hostOnNewNode(t, HostConfig{Volumes: []VolumeSpec{{"disk0", 1 << 20}}, CacheBytes: 16 * 4096, DPU: "embedded", NBDListen: "127.0.0.1:0"})
	buf := make([]byte, 4096)
	require.NoError(t, h.Store.Get(context.Background(), 1<<48|3, buf))
	r := h.Registry()
	n, err := testutil.GatherAndCount(r)
	require.NoError(t, err)
	assert.GreaterOrEqual(t, n, 30)
	mfs, err := r.Gather()
	require.NoError(t, err)
	got := map[string]float64{}
	for _, mf := range mfs {
		m := mf.GetMetric()[0]
		got[mf.GetName()] = m.GetCounter().GetValue() + m.GetGauge().GetValue()
	}
	assert.Equal(t, float64(h.Store.Stats().Misses), got["pd3_cache_misses_total"])
	assert.Equal(t, float64(h.Store.Stats().ResidentPages), got["pd3_cache_resident_pages"])
	assert.Contains(t, got, "pd3_nbd_requests_total")
	assert.Contains(t, got, "pd3_prefetch_issued_total")
	assert.Contains(t, got, "pd3_hostview_keys")
}
