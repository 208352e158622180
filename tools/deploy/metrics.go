package deploy

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Registry returns the host's metrics. Every metric reads a counter the
// components keep anyway, at scrape time: metrics cost nothing per request.
func (h *Host) Registry() *prometheus.Registry {
	r := prometheus.NewRegistry()
	counter := func(name, help string, f func() uint64) {
		r.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "pd3_" + name, Help: help}, func() float64 { return float64(f()) }))
	}
	gauge := func(name, help string, f func() float64) {
		r.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "pd3_" + name, Help: help}, f))
	}
	load := func(a *atomic.Uint64) func() uint64 { return a.Load }
	st := h.Store
	counter("cache_hits_total", "Page reads and writes served by the host cache.", func() uint64 { return st.Stats().Hits })
	counter("cache_misses_total", "Page accesses that missed the host cache.", func() uint64 { return st.Stats().Misses })
	counter("cache_evictions_total", "Pages evicted from the host cache.", func() uint64 { return st.Stats().Evictions })
	counter("cache_writebacks_total", "Dirty pages written back to the memory node.", func() uint64 { return st.Stats().WriteBacks })
	counter("cache_loadingzone_hits_total", "Misses served from the Loading Zone.", func() uint64 { return st.Stats().PrefetchHits })
	counter("cache_remote_reads_total", "Misses read from the memory node by the host.", func() uint64 { return st.Stats().RemoteReads })
	gauge("cache_dirty_pages", "Dirty pages in the host cache.", func() float64 { return float64(st.Stats().DirtyPages) })
	gauge("cache_resident_pages", "Pages in the host cache.", func() float64 { return float64(st.Stats().ResidentPages) })
	if h.Page != nil {
		counter("page_requests_total", "Page-protocol requests executed.", load(&h.Page.Requests))
		counter("page_errors_total", "Page-protocol requests that failed.", load(&h.Page.Errors))
	}
	if a := h.Agent; a != nil {
		counter("agent_parsed_total", "Page accesses parsed from mirrored requests.", load(&a.Parsed))
		counter("agent_skipped_cached_total", "Parsed reads Host View said the host holds.", load(&a.Skipped))
		counter("agent_lost_streams_total", "Mirrored connections the parser could not follow.", load(&a.LostStreams))
		counter("agent_queue_drops_total", "Parsed accesses dropped because the agent lagged.", load(&a.QueueDrops))
		counter("agent_eviction_notices_total", "Host cache evictions reported to the agent.", load(&a.Evictions))
		counter("hostview_false_negatives_total", "Prefetches of pages the host cache held.", load(&a.FalseNegatives))
	}
	if l := h.Leap; l != nil {
		counter("leap_predictions_total", "Host misses in which Leap found a trend.", load(&l.Predictions))
		counter("leap_predicted_pages_total", "Pages Leap asked to prefetch.", load(&l.Predicted))
	}
	if h.Engine != nil {
		e, z := h.Engine, h.Zone
		counter("prefetch_issued_total", "Prefetches sent to the memory node.", load(&e.Issued))
		counter("prefetch_placed_total", "Prefetched pages placed in the Loading Zone.", load(&e.Placed))
		counter("prefetch_consumed_total", "Prefetched pages taken by the host.", load(&z.Hits))
		counter("prefetch_dropped_unconsumed_total", "Prefetched pages reclaimed before the host took them.", load(&z.DroppedUnconsumed))
		counter("prefetch_deduped_total", "Prefetches skipped because one was in flight.", load(&e.Deduped))
		counter("prefetch_throttled_total", "Prefetches skipped because too many were in flight.", load(&e.Throttled))
		counter("prefetch_stale_total", "Prefetched pages discarded because a write-back overtook them.", load(&e.Stale))
		counter("prefetch_invalidated_total", "Loading Zone pages invalidated by write-backs.", load(&z.Invalidated))
		counter("loadingzone_misses_total", "CheckAndReturn calls that found nothing.", load(&z.Misses))
		counter("prefetch_joined_total", "Host misses that waited for a prefetch in flight instead of reading.", load(&e.Joined))
		counter("remote_reads_via_agent_total", "Host misses read through the transfer engine.", load(&e.HostReads))
		counter("hostview_false_positives_total", "Host misses on keys Host View said were held.", load(&e.FalsePositives))
		if h.HostView != nil {
			gauge("hostview_keys", "Keys in Host View.", func() float64 { return float64(h.HostView.Len()) })
		}
		gauge("loadingzone_unconsumed", "Pages waiting in the Loading Zone.", func() float64 { return float64(z.Unconsumed()) })
	}
	return r
}

// ServeMetrics serves /metrics on addr until ctx ends; it returns the
// address it listens on.
func (h *Host) ServeMetrics(ctx context.Context, addr string) (string, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("metrics: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(h.Registry(), promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			return
		}
	}()
	context.AfterFunc(ctx, func() { srv.Close() })
	h.closers = append(h.closers, srv.Close)
	return ln.Addr().String(), nil
}
