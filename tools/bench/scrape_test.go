package bench

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestScrapeReadsPd3Samples(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Write([]byte(`# HELP pd3_cache_hits_total Hits.
# TYPE pd3_cache_hits_total counter
pd3_cache_hits_total 1.5e+06
# TYPE pd3_cache_dirty_pages gauge
pd3_cache_dirty_pages 12
# TYPE go_goroutines gauge
go_goroutines 9
`))
	}))
	defer srv.Close()
	got, err := scrape(context.Background(), srv.URL)
	require.NoError(t, err)
	assert.Equal(t, map[string]float64{"cache_hits_total": 1.5e6, "cache_dirty_pages": 12}, got)
	d := delta(map[string]float64{"cache_hits_total": 5e5}, got)
	assert.Equal(t, 1e6, d["cache_hits_total"], "counters are differenced")
	assert.Equal(t, 12.0, d["cache_dirty_pages"], "gauges keep the last value")

	bad := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("pd3_x{ 1\n")) }))
	defer bad.Close()
	_, err = scrape(context.Background(), bad.URL)
	assert.Error(t, err, "a malformed exposition is an error, not silently skipped")
}
