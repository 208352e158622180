package deploy

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"sync/atomic"
	"time"

	"github.com/pd3-go/pd3/dpu"
	"github.com/pd3-go/pd3/hostview"
	"github.com/pd3-go/pd3/loadingzone"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Metrics adds read-at-scrape-time metrics to a registry. Every metric
// reads a counter the components keep anyway: metrics cost nothing per
// request.
type Metrics struct{ R *prometheus.Registry }

// NewMetrics returns an empty set.
func NewMetrics() Metrics { return Metrics{R: prometheus.NewRegistry()} }

// Counter registers pd3_NAME reading f.
func (m Metrics) Counter(name, help string, f func() uint64) {
	m.R.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "pd3_" + name, Help: help}, func() float64 { return float64(f()) }))
}

// Gauge registers pd3_NAME reading f.
func (m Metrics) Gauge(name, help string, f func() float64) {
	m.R.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "pd3_" + name, Help: help}, f))
}

// Registry returns the host's metrics.
func (h *Host) Registry() *prometheus.Registry {
	m := NewMetrics()
	r := m.R
	counter, gauge := m.Counter, m.Gauge
	load := func(a *atomic.Uint64) func() uint64 { return a.Load }
	st := h.Store
	counter("cache_hits_total", "Page reads and writes served by the host cache.", func() uint64 { return st.Stats().Hits })
	counter("cache_misses_total", "Page accesses that missed the host cache.", func() uint64 { return st.Stats().Misses })
	counter("cache_evictions_total", "Pages evicted from the host cache.", func() uint64 { return st.Stats().Evictions })
	counter("cache_writebacks_total", "Dirty pages written back to the memory node.", func() uint64 { return st.Stats().WriteBacks })
	counter("cache_loadingzone_hits_total", "Misses served from the Loading Zone.", func() uint64 { return st.Stats().PrefetchHits })
	counter("cache_remote_reads_total", "Misses read from the memory node by the host.", func() uint64 { return st.Stats().RemoteReads })
	counter("cache_async_loads_total", "Remote reads started without blocking (NBD one-page reads run by the connection reader).", func() uint64 { return st.Stats().AsyncLoads })
	counter("cache_writeback_failures_total", "Background write-back rounds that failed (retried).", func() uint64 { return st.Stats().WritebackFailures })
	gauge("cache_dirty_pages", "Dirty pages in the host cache.", func() float64 { return float64(st.Stats().DirtyPages) })
	gauge("cache_resident_pages", "Pages in the host cache.", func() float64 { return float64(st.Stats().ResidentPages) })
	if h.Page != nil {
		counter("page_requests_total", "Page-protocol requests executed.", load(&h.Page.Requests))
		counter("page_errors_total", "Page-protocol requests that failed.", load(&h.Page.Errors))
	}
	if n := h.NBD; n != nil {
		counter("nbd_connections_total", "NBD connections accepted.", load(&n.Connections))
		counter("nbd_requests_total", "NBD transmission-phase requests received.", load(&n.Requests))
		counter("nbd_errors_total", "NBD requests answered with an error by the backend.", load(&n.Errors))
		counter("nbd_protocol_violations_total", "NBD connections closed for a protocol violation.", load(&n.ProtocolViolations))
	}
	m.RegisterAgent(h.Agent, h.Engine, h.Zone, h.HostView)
	if l := h.Leap; l != nil {
		counter("leap_predictions_total", "Host misses in which Leap found a trend.", load(&l.Predictions))
		counter("leap_predicted_pages_total", "Pages Leap asked to prefetch.", load(&l.Predicted))
	}
	if l := h.Link; l != nil {
		counter("link_attaches_total", "Times the host attached to a DPU agent process.", load(&l.Attaches))
		counter("link_agent_deaths_total", "Times the attached agent stopped and the host went direct.", load(&l.Deaths))
		counter("link_fallbacks_total", "Host reads/writes redone on the direct path because the agent was gone.", load(&l.Fallbacks))
		counter("link_mirror_drops_total", "Mirrored connections cut because the agent's ring was full.", load(&l.MirrorDrops))
		counter("link_agent_reads_total", "Host misses served through the agent.", load(&l.AgentReads))
		counter("link_agent_writes_total", "Write-backs carried by the agent.", load(&l.AgentWrites))
		gauge("link_attached", "1 while a live agent serves the host.", func() float64 {
			if l.Attached() {
				return 1
			}
			return 0
		})
	}
	return r
}

// ServeMetrics serves /metrics on addr until ctx ends; it returns the
// address it listens on.
func (h *Host) ServeMetrics(ctx context.Context, addr string) (string, error) {
	a, closer, err := ServeRegistry(ctx, addr, h.Registry())
	if err != nil {
		return "", err
	}
	h.closers = append(h.closers, closer)
	return a, nil
}

// RegisterAgent adds the agent's, engine's and Loading Zone's metrics (any
// may be nil); the host and the pd3 dpu process share it.
func (m Metrics) RegisterAgent(a *dpu.Agent, e *dpu.Engine, z *loadingzone.Zone, hv *hostview.Set) {
	counter, gauge := m.Counter, m.Gauge
	load := func(x *atomic.Uint64) func() uint64 { return x.Load }
	if a != nil {
		counter("agent_parsed_total", "Page accesses parsed from mirrored requests.", load(&a.Parsed))
		counter("agent_skipped_cached_total", "Parsed reads Host View said the host holds.", load(&a.Skipped))
		counter("agent_lost_streams_total", "Mirrored connections the parser could not follow.", load(&a.LostStreams))
		counter("agent_queue_drops_total", "Parsed accesses dropped because the agent lagged.", load(&a.QueueDrops))
		counter("agent_eviction_notices_total", "Host cache evictions reported to the agent.", load(&a.Evictions))
		counter("hostview_false_negatives_total", "Prefetches of pages the host cache held (embedded agent only).", load(&a.FalseNegatives))
	}
	if e != nil {
		counter("prefetch_issued_total", "Prefetches sent to the memory node.", load(&e.Issued))
		counter("prefetch_placed_total", "Prefetched pages placed in the Loading Zone.", load(&e.Placed))
		counter("prefetch_deduped_total", "Prefetches skipped because one was in flight.", load(&e.Deduped))
		counter("prefetch_throttled_total", "Prefetches skipped because too many were in flight.", load(&e.Throttled))
		counter("prefetch_stale_total", "Prefetched pages discarded because a write-back overtook them.", load(&e.Stale))
		counter("prefetch_joined_total", "Host misses that waited for a prefetch in flight instead of reading.", load(&e.Joined))
		counter("remote_reads_via_agent_total", "Host misses read through the transfer engine.", load(&e.HostReads))
		counter("hostview_false_positives_total", "Host misses on keys Host View said were held.", load(&e.FalsePositives))
	}
	if z != nil {
		counter("prefetch_consumed_total", "Prefetched pages taken by the host.", load(&z.Hits))
		counter("prefetch_dropped_unconsumed_total", "Prefetched pages reclaimed before the host took them.", load(&z.DroppedUnconsumed))
		counter("prefetch_invalidated_total", "Loading Zone pages invalidated by write-backs.", load(&z.Invalidated))
		counter("loadingzone_misses_total", "CheckAndReturn calls that found nothing.", load(&z.Misses))
		gauge("loadingzone_unconsumed", "Pages waiting in the Loading Zone.", func() float64 { return float64(z.Unconsumed()) })
	}
	if hv != nil {
		gauge("hostview_keys", "Keys in Host View.", func() float64 { return float64(hv.Len()) })
	}
}

// ServeRegistry serves a registry's metrics on /metrics at addr until ctx
// ends; it returns the address and a closer.
func ServeRegistry(ctx context.Context, addr string, r *prometheus.Registry) (string, func() error, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", nil, fmt.Errorf("metrics: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(r, promhttp.HandlerOpts{}))
	// Profiles of a running host, so a slow phase can be profiled alone
	// (PD3_CPUPROFILE covers the whole process, fills included).
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	context.AfterFunc(ctx, func() { srv.Close() })
	return ln.Addr().String(), srv.Close, nil
}
