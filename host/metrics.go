package host

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/pd3-go/pd3/cluster"
	"github.com/pd3-go/pd3/dpu"
	"github.com/pd3-go/pd3/dpu/split"
	"github.com/pd3-go/pd3/ec"
	"github.com/pd3-go/pd3/fs"
	"github.com/pd3-go/pd3/hostview"
	"github.com/pd3-go/pd3/hostview/pagecache"
	"github.com/pd3-go/pd3/internal/procgov"
	"github.com/pd3-go/pd3/loadingzone"
	"github.com/pd3-go/pd3/memnode"
	"github.com/pd3-go/pd3/nbd"
	"github.com/pd3-go/pd3/nbd/nbdproto"
	"github.com/pd3-go/pd3/pagestore"
	"github.com/pd3-go/pd3/pagestore/pageproto"
	"github.com/pd3-go/pd3/replica"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Metrics is a registry of pd3's components: one prometheus.Collector per
// component, which takes one snapshot of the component's counters per
// scrape (the page cache's walks its frames once, not once per metric).
// Every metric reads a counter the components keep anyway: metrics cost
// nothing per request.
type Metrics struct{ R *prometheus.Registry }

// NewMetrics returns an empty set.
func NewMetrics() Metrics { return Metrics{R: prometheus.NewRegistry()} }

// metric is one sample of a component's snapshot S.
type metric[S any] struct {
	name, help string
	kind       prometheus.ValueType
	val        func(S) float64
}

func counter[S any](name, help string, val func(S) uint64) metric[S] {
	return metric[S]{"pd3_" + name, help, prometheus.CounterValue, func(s S) float64 { return float64(val(s)) }}
}

func gauge[S any](name, help string, val func(S) float64) metric[S] {
	return metric[S]{"pd3_" + name, help, prometheus.GaugeValue, val}
}

// collector exposes metrics read from one snapshot per scrape.
type collector[S any] struct {
	snap    func() S
	metrics []metric[S]
	descs   []*prometheus.Desc
}

func newCollector[S any](snap func() S, ms ...metric[S]) *collector[S] {
	c := &collector[S]{snap: snap, metrics: ms}
	for _, m := range ms {
		c.descs = append(c.descs, prometheus.NewDesc(m.name, m.help, nil, nil))
	}
	return c
}

// Describe implements prometheus.Collector.
func (c *collector[S]) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *collector[S]) Collect(ch chan<- prometheus.Metric) {
	s := c.snap()
	for i, m := range c.metrics {
		ch <- prometheus.MustNewConstMetric(c.descs[i], m.kind, m.val(s))
	}
}

// atomics is the snapshot of a component whose counters are atomics: the
// collector loads them in place.
func atomics[T any](x *T) func() *T { return func() *T { return x } }

// Registry returns the host's metrics.
func (h *Host) Registry() *prometheus.Registry {
	m := NewMetrics()
	type stats = pagestore.Stats
	m.R.MustRegister(newCollector(h.Store.Stats,
		counter("cache_hits_total", "Page reads and writes served by the host cache.", func(s stats) uint64 { return s.Hits }),
		counter("cache_misses_total", "Page accesses that missed the host cache.", func(s stats) uint64 { return s.Misses }),
		counter("cache_evictions_total", "Pages evicted from the host cache.", func(s stats) uint64 { return s.Evictions }),
		counter("cache_writebacks_total", "Dirty pages written back to the memory node.", func(s stats) uint64 { return s.WriteBacks }),
		counter("cache_loadingzone_hits_total", "Misses served from the Loading Zone.", func(s stats) uint64 { return s.PrefetchHits }),
		counter("cache_remote_reads_total", "Misses read from the memory node by the host.", func(s stats) uint64 { return s.RemoteReads }),
		counter("cache_readahead_pages_total", "Pages read ahead into the host's windows for stream reads to come (NBD reads the agent predicts, scans through the mount of files the kernel caches in part).", func(s stats) uint64 { return s.ReadAheadPages }),
		counter("cache_readahead_hits_total", "Pages stream reads took from read-ahead windows.", func(s stats) uint64 { return s.ReadAheadHits }),
		counter("cache_readahead_dropped_total", "Pages read ahead and dropped unread (the window replaced, or written to).", func(s stats) uint64 { return s.ReadAheadDropped }),
		counter("cache_shadow_pages_total", "Pages read again from the memory nodes and dropped, to measure a perfect prefetcher's cost (--shadow-reads).", func(s stats) uint64 { return s.ShadowPages }),
		counter("cache_async_loads_total", "Pages read from the remote without blocking (NBD reads of up to 16 pages run by the connection reader).", func(s stats) uint64 { return s.AsyncLoads }),
		counter("cache_eviction_writebacks_total", "Write-backs a miss waited for because its victim was dirty (the background write-back fell behind).", func(s stats) uint64 { return s.EvictionWriteBacks }),
		counter("cache_fresh_writes_total", "Partial-page writes past a file's written bytes that started from zeroes instead of a read of the memory node.", func(s stats) uint64 { return s.FreshWrites }),
		counter("cache_writeback_failures_total", "Background write-back rounds that failed (retried).", func(s stats) uint64 { return s.WritebackFailures }),
		counter("cache_uncached_reads_total", "Page reads served past the cache because no frame could be freed (every frame busy, or dirty while the memory node refuses write-backs).", func(s stats) uint64 { return s.UncachedReads }),
		gauge("cache_dirty_pages", "Dirty pages in the host cache.", func(s stats) float64 { return float64(s.DirtyPages) }),
		gauge("cache_resident_pages", "Pages in the host cache.", func(s stats) float64 { return float64(s.ResidentPages) }),
	))
	if h.lat != nil {
		m.R.MustRegister(h.lat.nbd, h.lat.page)
	}
	if p := h.Page; p != nil {
		m.R.MustRegister(newCollector(atomics(p),
			counter("page_requests_total", "Page-protocol requests executed.", func(s *pageproto.Server) uint64 { return s.Requests.Load() }),
			counter("page_errors_total", "Page-protocol requests that failed.", func(s *pageproto.Server) uint64 { return s.Errors.Load() }),
		))
	}
	if n := h.NBD; n != nil {
		m.R.MustRegister(newCollector(atomics(n),
			counter("nbd_connections_total", "NBD connections accepted.", func(s *nbd.Server) uint64 { return s.Connections.Load() }),
			counter("nbd_requests_total", "NBD transmission-phase requests received.", func(s *nbd.Server) uint64 { return s.Requests.Load() }),
			counter("nbd_errors_total", "NBD requests answered with an error by the backend.", func(s *nbd.Server) uint64 { return s.Errors.Load() }),
			counter("nbd_protocol_violations_total", "NBD connections closed for a protocol violation.", func(s *nbd.Server) uint64 { return s.ProtocolViolations.Load() }),
		))
	}
	if g := h.procs; g != nil {
		m.R.MustRegister(newCollector(atomics(g),
			gauge("procs_low", "1 while the host runs with --lone-procs Ps (through a run of cached reads answered one at a time), 0 with every P.", func(g *procgov.Governor) float64 {
				if g.Low() {
					return 1
				}
				return 0
			}),
			counter("procs_switches_total", "Changes of GOMAXPROCS by the lone-hits governor, down and up.", func(g *procgov.Governor) uint64 { return g.Switches.Load() }),
		))
	}
	if r := h.Replicated; r != nil {
		m.R.MustRegister(replicaCollector(r))
	}
	if c := h.Coded; c != nil {
		m.R.MustRegister(newCollector(atomics(c),
			counter("ec_decoded_runs_total", "Reads of erasure-coded volumes decoded from other shards (a node down, silent or answering a corrupt page), in runs of up to 256 KiB.", func(c *ec.Remote) uint64 { return c.Decoded.Load() }),
			counter("ec_healed_runs_total", "Corrupt shard runs of erasure-coded volumes rewritten from a decode.", func(c *ec.Remote) uint64 { return c.Healed.Load() }),
			counter("ec_dropped_shards_total", "Shards of erasure-coded volumes dropped (they missed a write, or their node is down).", func(c *ec.Remote) uint64 { return c.Dropped.Load() }),
			counter("ec_repaired_shards_total", "Lost shards of erasure-coded volumes rebuilt on another node.", func(c *ec.Remote) uint64 { return c.Repaired.Load() }),
			counter("ec_repair_bytes_total", "Bytes repairs of erasure-coded shards wrote (runs that decode to zeroes are not written).", func(c *ec.Remote) uint64 { return c.RepairBytes.Load() }),
		))
	}
	if f := h.FS; f != nil {
		m.R.MustRegister(newCollector(atomics(f),
			gauge("fs_pending_deletes", "Volumes of freed files not yet deleted at the memory node (deleted in the background).", func(f *fs.FS) float64 { return float64(f.PendingDeletes()) }),
			gauge("fs_volumes_made_ahead", "Empty file volumes made ahead of the mount's creates.", func(f *fs.FS) float64 { return float64(f.VolumesMadeAhead()) }),
			counter("fs_readahead_hits_total", "Stream READs answered from the mount's read-ahead.", func(f *fs.FS) uint64 { h, _, _ := f.ReadAheadStats(); return h }),
			counter("fs_readahead_discards_total", "Read-ahead windows dropped unread (the file changed, the reader sought or closed).", func(f *fs.FS) uint64 { _, d, _ := f.ReadAheadStats(); return d }),
			gauge("fs_readahead_windows", "Read-ahead windows held (at most 32, 1 MiB each).", func(f *fs.FS) float64 { _, _, w := f.ReadAheadStats(); return float64(w) }),
			counter("fs_reads_total", "FUSE READ requests served.", func(f *fs.FS) uint64 { return f.Stats().Reads }),
			counter("fs_read_bytes_total", "Bytes FUSE READs asked for, up to each file's size.", func(f *fs.FS) uint64 { return f.Stats().ReadBytes }),
			counter("fs_writes_total", "FUSE WRITE requests served.", func(f *fs.FS) uint64 { return f.Stats().Writes }),
			counter("fs_written_bytes_total", "Bytes of FUSE WRITEs.", func(f *fs.FS) uint64 { return f.Stats().WrittenBytes }),
			counter("fs_stale_tails_zeroed_total", "Files whose bytes past their saved size were zeroed because the previous mount crashed (once per file and run).", func(f *fs.FS) uint64 { return f.Stats().StaleTailsZeroed }),
		))
	}
	if tr := h.Tracker; tr != nil {
		m.R.MustRegister(newCollector(atomics(tr),
			counter("pagecache_events_total", "Kernel page-cache events of the mount taken from the tracker's ring.", func(t *pagecache.Tracker) uint64 { return t.Events.Load() }),
			counter("pagecache_lost_total", "Kernel page-cache events dropped because the tracker's ring was full.", func(t *pagecache.Tracker) uint64 { return t.Lost() }),
			counter("pagecache_mutes_total", "Times a file's page-cache events were muted in the kernel because the mount read it ahead itself.", func(t *pagecache.Tracker) uint64 { return t.Mutes.Load() }),
			gauge("pagecache_muted_files", "Files whose page-cache events are muted now.", func(t *pagecache.Tracker) float64 { return float64(t.MutedFiles()) }),
			gauge("pagecache_followed_files", "Files whose page cache the tracker follows: those of 1 MiB or more the kernel holds.", func(t *pagecache.Tracker) float64 { return float64(t.FollowedFiles()) }),
		))
	}
	if c := h.control; c != nil {
		m.R.MustRegister(newCollector(atomics(c),
			counter("control_sessions_resumed_total", "Times the host's etcd session ended on its side while etcd still kept the lease: resumed, with requests held while it asked.", func(s *cluster.Host) uint64 { return s.Resumed.Load() }),
		))
	}
	m.RegisterAgent(h.Agent, h.Engine, h.Zone, h.HostView)
	if l := h.Leap; l != nil {
		m.R.MustRegister(newCollector(atomics(l),
			counter("leap_predictions_total", "Host misses in which Leap found a trend.", func(s *dpu.Leap) uint64 { return s.Predictions.Load() }),
			counter("leap_predicted_pages_total", "Pages Leap asked to prefetch.", func(s *dpu.Leap) uint64 { return s.Predicted.Load() }),
		))
	}
	if l := h.Link; l != nil {
		m.R.MustRegister(newCollector(atomics(l),
			counter("link_attaches_total", "Times the host attached to a DPU agent process.", func(s *split.Link) uint64 { return s.Attaches.Load() }),
			counter("link_agent_deaths_total", "Times the attached agent stopped and the host went direct.", func(s *split.Link) uint64 { return s.Deaths.Load() }),
			counter("link_fallbacks_total", "Host reads/writes redone on the direct path because the agent was gone.", func(s *split.Link) uint64 { return s.Fallbacks.Load() }),
			counter("link_mirror_drops_total", "Mirrored connections cut because the agent's ring was full.", func(s *split.Link) uint64 { return s.MirrorDrops.Load() }),
			counter("link_agent_reads_total", "Host misses served through the agent.", func(s *split.Link) uint64 { return s.AgentReads.Load() }),
			counter("link_agent_writes_total", "Write-backs carried by the agent.", func(s *split.Link) uint64 { return s.AgentWrites.Load() }),
			gauge("link_attached", "1 while a live agent serves the host.", func(s *split.Link) float64 {
				if s.Attached() {
					return 1
				}
				return 0
			}),
		))
	}
	return m.R
}

// replicaCollector exposes a replicated volume set's failovers and repair.
func replicaCollector(r *replica.Remote) prometheus.Collector {
	return newCollector(atomics(r),
		counter("replica_read_failovers_total", "Reads of a replicated volume that went on to another replica.", func(r *replica.Remote) uint64 { return r.Failovers.Load() }),
		counter("replica_dropped_total", "Replicas taken off a stripe map: they missed a write, or their node went down.", func(r *replica.Remote) uint64 { return r.Dropped.Load() }),
		counter("replica_repaired_extents_total", "Extents copied to a new replica.", func(r *replica.Remote) uint64 { return r.Repaired.Load() }),
		counter("replica_repair_bytes_total", "Bytes read to copy extents to new replicas: the chunks that hold memory (holes are not read).", func(r *replica.Remote) uint64 { return r.RepairBytes.Load() }),
	)
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

// RegisterAgent adds the agent's, engine's, Loading Zone's and Host View's
// collectors (any may be nil); the host and the pd3 dpu process share it.
func (m Metrics) RegisterAgent(a *dpu.Agent, e *dpu.Engine, z *loadingzone.Zone, hv *hostview.Set) {
	if a != nil {
		m.R.MustRegister(newCollector(atomics(a),
			counter("agent_parsed_total", "Page accesses parsed from mirrored requests.", func(s *dpu.Agent) uint64 { return s.Parsed.Load() }),
			counter("agent_skipped_cached_total", "Parsed reads Host View said the host holds.", func(s *dpu.Agent) uint64 { return s.Skipped.Load() }),
			counter("agent_lost_streams_total", "Mirrored connections the parser could not follow.", func(s *dpu.Agent) uint64 { return s.LostStreams.Load() }),
			counter("agent_queue_drops_total", "Parsed accesses dropped because the agent lagged.", func(s *dpu.Agent) uint64 { return s.QueueDrops.Load() }),
			counter("agent_eviction_notices_total", "Host cache evictions reported to the agent.", func(s *dpu.Agent) uint64 { return s.Evictions.Load() }),
			counter("hostview_false_negatives_total", "Prefetches of pages the host cache held (embedded agent only).", func(s *dpu.Agent) uint64 { return s.FalseNegatives.Load() }),
		))
		mirrored, fuse := a.Predictors()
		for _, p := range []struct {
			name string
			s    *dpu.SequentialStats
		}{{"requests", mirrored}, {"fuse", fuse}} {
			what := map[string]string{"requests": "mirrored requests' (NBD, page protocol)", "fuse": "FUSE reads'"}[p.name]
			m.R.MustRegister(newCollector(atomics(p.s),
				counter("predict_"+p.name+"_pages_total", "Pages the "+what+" stream predictor proposed to prefetch.", func(s *dpu.SequentialStats) uint64 { return s.Predicted.Load() }),
				counter("predict_"+p.name+"_useful_total", "Predicted pages a later read of their stream asked for (judged while off too).", func(s *dpu.SequentialStats) uint64 { return s.Useful.Load() }),
				counter("predict_"+p.name+"_wasted_total", "Predicted pages their stream never asked for.", func(s *dpu.SequentialStats) uint64 { return s.Wasted.Load() }),
				counter("predict_"+p.name+"_switches_total", "Changes of the "+what+" predictor's level by its accuracy governor (on, narrowed, off).", func(s *dpu.SequentialStats) uint64 { return s.Switches.Load() }),
				gauge("predict_"+p.name+"_off", "1 while the accuracy governor holds the "+what+" predictor off (it keeps judging, and returns when accurate).", func(s *dpu.SequentialStats) float64 { return float64(s.Off.Load()) }),
			))
		}
	}
	if e != nil {
		m.R.MustRegister(newCollector(atomics(e),
			counter("prefetch_issued_total", "Prefetches sent to the memory node.", func(s *dpu.Engine) uint64 { return s.Issued.Load() }),
			counter("prefetch_placed_total", "Prefetched pages placed in the Loading Zone.", func(s *dpu.Engine) uint64 { return s.Placed.Load() }),
			counter("prefetch_deduped_total", "Prefetches skipped because one was in flight.", func(s *dpu.Engine) uint64 { return s.Deduped.Load() }),
			counter("prefetch_throttled_total", "Prefetches skipped because too many were in flight.", func(s *dpu.Engine) uint64 { return s.Throttled.Load() }),
			counter("prefetch_stale_total", "Prefetched pages discarded because a write-back overtook them.", func(s *dpu.Engine) uint64 { return s.Stale.Load() }),
			counter("prefetch_deferred_total", "Prefetch completions the memory-node reader handed to a goroutine because the engine was busy.", func(s *dpu.Engine) uint64 { return s.Deferred.Load() }),
			counter("prefetch_joined_total", "Host misses that waited for a prefetch in flight instead of reading.", func(s *dpu.Engine) uint64 { return s.Joined.Load() }),
			counter("remote_reads_via_agent_total", "Host misses read through the transfer engine.", func(s *dpu.Engine) uint64 { return s.HostReads.Load() }),
			counter("hostview_false_positives_total", "Host misses on keys Host View said were held.", func(s *dpu.Engine) uint64 { return s.FalsePositives.Load() }),
		))
	}
	if z != nil {
		m.R.MustRegister(newCollector(atomics(z),
			counter("prefetch_consumed_total", "Prefetched pages taken by the host.", func(s *loadingzone.Zone) uint64 { return s.Hits.Load() }),
			counter("prefetch_dropped_unconsumed_total", "Prefetched pages reclaimed before the host took them.", func(s *loadingzone.Zone) uint64 { return s.DroppedUnconsumed.Load() }),
			counter("prefetch_invalidated_total", "Loading Zone pages invalidated by write-backs.", func(s *loadingzone.Zone) uint64 { return s.Invalidated.Load() }),
			counter("loadingzone_misses_total", "CheckAndReturn calls that found nothing.", func(s *loadingzone.Zone) uint64 { return s.Misses.Load() }),
			gauge("loadingzone_unconsumed", "Pages waiting in the Loading Zone.", func(s *loadingzone.Zone) float64 { return float64(s.Unconsumed()) }),
		))
	}
	if hv != nil {
		m.R.MustRegister(newCollector(atomics(hv),
			gauge("hostview_keys", "Keys in Host View.", func(s *hostview.Set) float64 { return float64(s.Len()) }),
		))
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

// latencies are the request-latency histograms of a host's servers. They
// exist before the servers start (the servers' Latency hooks observe into
// them) and are registered with the host's metrics.
type latencies struct {
	nbd, page     *prometheus.HistogramVec
	nbdBy, pageBy [8]prometheus.Observer // by command/op, resolved once
	nbdOther      prometheus.Observer
	pageOther     prometheus.Observer
}

func newLatencies() *latencies {
	// 5 µs (a cache hit on a fast machine) to about 2.6 s (a memory-node
	// outage riding on retries), in factors of two.
	latencyBuckets := prometheus.ExponentialBuckets(5e-6, 2, 20)
	l := &latencies{
		nbd: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "pd3_nbd_request_duration_seconds",
			Help: "NBD requests from header read to reply queued, by command.", Buckets: latencyBuckets}, []string{"cmd"}),
		page: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "pd3_page_request_duration_seconds",
			Help: "Page-protocol requests from header read to reply queued, by operation.", Buckets: latencyBuckets}, []string{"op"}),
	}
	// Children are resolved here, so an observation is a slice index and
	// atomic adds, not a label lookup.
	l.nbdOther, l.pageOther = l.nbd.WithLabelValues("other"), l.page.WithLabelValues("other")
	for i := range l.nbdBy {
		l.nbdBy[i] = l.nbd.WithLabelValues(nbdproto.Cmd(i).String())
	}
	for i := range l.pageBy {
		l.pageBy[i] = l.pageOther
	}
	for _, op := range []pageproto.Op{pageproto.OpGet, pageproto.OpPut, pageproto.OpSync, pageproto.OpVolumes} {
		l.pageBy[op] = l.page.WithLabelValues(op.String())
	}
	return l
}

func (l *latencies) observeNBD(c nbdproto.Cmd, d time.Duration) {
	o := l.nbdOther
	if int(c) < len(l.nbdBy) {
		o = l.nbdBy[c]
	}
	o.Observe(d.Seconds())
}

func (l *latencies) observePage(op pageproto.Op, d time.Duration) {
	o := l.pageOther
	if int(op) < len(l.pageBy) {
		o = l.pageBy[op]
	}
	o.Observe(d.Seconds())
}

// Registry returns the memory node's metrics: its connections and
// requests (one snapshot of memnode.Server.Stats per scrape), its memory
// and, with --persist, its log's group commits.
func (m *Memnode) Registry() *prometheus.Registry {
	r := NewMetrics().R
	type stats = memnode.Stats
	r.MustRegister(newCollector(m.Server.Stats,
		counter("memnode_connections_total", "Connections accepted.", func(s stats) uint64 { return s.Connections }),
		gauge("memnode_connections_open", "Connections being served.", func(s stats) float64 { return float64(s.Open) }),
		counter("memnode_connections_refused_total", "Connections closed at or before HELLO: a wrong token or protocol version, TLS on one side only, no HELLO in time.", func(s stats) uint64 { return s.Refused }),
		counter("memnode_failed_requests_total", "Requests answered with an error status.", func(s stats) uint64 { return s.Failed }),
		counter("memnode_read_bytes_total", "Bytes READ and PREFETCH returned.", func(s stats) uint64 { return s.ReadBytes }),
		counter("memnode_written_bytes_total", "Bytes WRITE stored.", func(s stats) uint64 { return s.WrittenBytes }),
	), memnodeRequests{m.Server, prometheus.NewDesc("pd3_memnode_requests_total", "Requests received, by operation.", []string{"op"}, nil)})
	store := m.Server.Store
	r.MustRegister(newCollector(atomics(store),
		gauge("memnode_used_bytes", "Bytes of page memory allocated to volumes (a chunk at a time: a chunk any byte of which was written holds memory).", func(s *memnode.Store) float64 { return float64(s.Used()) }),
		gauge("memnode_capacity_bytes", "The most page memory the node allocates (--capacity; 0: unlimited).", func(s *memnode.Store) float64 { return float64(s.Capacity()) }),
		counter("memnode_reclaims_total", "Times the memory of freed chunks (deleted volumes, trims) was given back to the operating system, after every 64 MiB freed.", func(s *memnode.Store) uint64 { return s.Reclaims() }),
		gauge("memnode_volumes", "Volumes the node holds.", func(s *memnode.Store) float64 { return float64(len(s.List())) }),
		counter("memnode_log_syncs_total", "fdatasyncs of the --persist log (entries/syncs is the group-commit batch; 0 when volatile).", func(s *memnode.Store) uint64 { n, _ := s.LogStats(); return n }),
		counter("memnode_log_entries_total", "Entries written to the --persist log.", func(s *memnode.Store) uint64 { _, n := s.LogStats(); return n }),
	))
	return r
}

// memnodeRequests exposes a memory node's requests with an op label.
type memnodeRequests struct {
	srv  *memnode.Server
	desc *prometheus.Desc
}

// Describe implements prometheus.Collector.
func (c memnodeRequests) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

// Collect implements prometheus.Collector.
func (c memnodeRequests) Collect(ch chan<- prometheus.Metric) {
	s := c.srv.Stats()
	// Every operation is exported from the start, at 0 until used, so a
	// rate() has a series to work on; unknown codes only once seen.
	for op, n := range s.Requests {
		name := memnode.Op(op).String()
		if op == 0 {
			if n == 0 {
				continue
			}
			name = "UNKNOWN"
		}
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.CounterValue, float64(n), name)
	}
}
