package scrape

import (
	"context"
	"math"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const exposition = `# TYPE pd3_cache_hits_total counter
pd3_cache_hits_total 1.5e+06
# TYPE pd3_cache_dirty_pages gauge
pd3_cache_dirty_pages 12
# TYPE pd3_nbd_request_duration_seconds histogram
pd3_nbd_request_duration_seconds_bucket{cmd="READ",le="0.001"} 50
pd3_nbd_request_duration_seconds_bucket{cmd="READ",le="0.002"} 90
pd3_nbd_request_duration_seconds_bucket{cmd="READ",le="+Inf"} 100
pd3_nbd_request_duration_seconds_sum{cmd="READ"} 0.1
pd3_nbd_request_duration_seconds_count{cmd="READ"} 100
# TYPE go_goroutines gauge
go_goroutines 9
`

func TestScrape(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte(exposition)) }))
	defer srv.Close()
	mfs, err := Families(context.Background(), srv.URL)
	require.NoError(t, err)
	assert.Equal(t, map[string]float64{"cache_hits_total": 1.5e6, "cache_dirty_pages": 12}, Values(mfs))
	h := Histograms(mfs, "pd3_nbd_request_duration_seconds", "cmd")
	require.Contains(t, h, "READ")
	assert.Equal(t, Buckets{0.001: 50, 0.002: 90, math.Inf(1): 100}, h["READ"])

	p50, ok := Quantile(0.5, nil, h["READ"])
	require.True(t, ok)
	assert.InDelta(t, 0.001, p50, 1e-9, "the 50th of 100 is at the first bound")
	p70, _ := Quantile(0.7, nil, h["READ"])
	assert.InDelta(t, 0.0015, p70, 1e-9, "interpolated within (1ms, 2ms]")
	p99, _ := Quantile(0.99, nil, h["READ"])
	assert.Equal(t, 0.002, p99, "past the last finite bound: that bound")
	_, ok = Quantile(0.5, h["READ"], h["READ"])
	assert.False(t, ok, "nothing observed between two equal scrapes")

	bad := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("pd3_x{ 1\n")) }))
	defer bad.Close()
	_, err = Families(context.Background(), bad.URL)
	assert.Error(t, err, "a malformed exposition is an error")
}
