package host

import (
	"context"
	"encoding/json"
	"os"
	"regexp"
	"runtime"
	"strings"
	"testing"

	"github.com/pd3-go/pd3/cluster"
	"github.com/pd3-go/pd3/cluster/etcdembed"
	"github.com/pd3-go/pd3/fs"
	"github.com/pd3-go/pd3/internal/nbdclient"
	"github.com/pd3-go/pd3/internal/scrape"
	"github.com/pd3-go/pd3/memnode"
	"github.com/pd3-go/pd3/pagestore/pageproto"
	"github.com/pd3-go/pd3/replica"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
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
	h, _ := hostOnNewNode(t, Config{Volumes: []VolumeSpec{{"disk0", 1 << 20}}, CacheBytes: 16 * 4096, DPU: EmbeddedAgent, NBDListen: "127.0.0.1:0", LoneProcs: 1})
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
	if runtime.GOMAXPROCS(0) > 1 {
		assert.Contains(t, got, "pd3_procs_switches_total")
		assert.Contains(t, got, "pd3_procs_low")
	}
}

// Every metric the Grafana dashboard queries exists in a running host's
// /metrics (host with an embedded agent, NBD and the page protocol, after
// a request on each), with the type the query needs.
func TestDashboardQueriesExist(t *testing.T) {
	b, err := os.ReadFile("../deploy/grafana/pd3-host.json")
	require.NoError(t, err)
	var dash struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	require.NoError(t, json.Unmarshal(b, &dash))
	require.NotEmpty(t, dash.Panels)

	cfg := Config{Volumes: []VolumeSpec{{"disk0", 1 << 20}}, CacheBytes: 16 * 4096,
		DPU: EmbeddedAgent, NBDListen: "127.0.0.1:0", PageListen: "127.0.0.1:0", LoneProcs: 1}
	// The processors panel needs a governor: more than one P to govern.
	governed := runtime.GOMAXPROCS(0) > 1
	// The filesystem's panels need a mount: root and /dev/fuse.
	mounted := os.Geteuid() == 0 && fs.Available() == nil
	if mounted {
		cfg.Mount = t.TempDir()
	}
	h, _ := hostOnNewNode(t, cfg)
	if mounted {
		require.NoError(t, os.WriteFile(cfg.Mount+"/f", []byte("x"), 0o644))
		_, err := os.ReadFile(cfg.Mount + "/f")
		require.NoError(t, err)
	}
	addr, err := h.ServeMetrics(context.Background(), "127.0.0.1:0")
	require.NoError(t, err)
	nc, err := nbdclient.Dial(h.NBDAddr, "disk0")
	require.NoError(t, err)
	require.NoError(t, nc.Read(0, make([]byte, 4096)))
	nc.Close()
	pc, err := pageproto.Dial(context.Background(), h.PageAddr, pageproto.ClientOptions{})
	require.NoError(t, err)
	err = pc.Get(context.Background(), 1<<48|1, make([]byte, 4096))
	require.NoError(t, err)
	pc.Close()

	mfs, err := scrape.Families(context.Background(), addr)
	require.NoError(t, err)
	// The replica panel's metrics come from a replicated host, the memory
	// nodes' panels from `pd3 memnode --metrics`: their collectors, as
	// those register them.
	others := prometheus.NewRegistry()
	others.MustRegister(replicaCollector(&replica.Remote{}))
	node := &Memnode{Server: &memnode.Server{Store: memnode.NewStore(0)}}
	gathered, err := prometheus.Gatherers{others, node.Registry()}.Gather()
	require.NoError(t, err)
	for _, mf := range gathered {
		mfs[mf.GetName()] = mf
	}
	// Every query is narrowed by a dashboard variable: the host panels by
	// $instance (without it, hosts are summed), the node panels by $memnode.
	selector := regexp.MustCompile(`pd3_[a-z0-9_]+(\{[^}]*\})?`)
	for _, pn := range dash.Panels {
		for _, tg := range pn.Targets {
			for _, sel := range selector.FindAllStringSubmatch(tg.Expr, -1) {
				want := `{instance=~"$instance"}`
				if strings.HasPrefix(sel[0], "pd3_memnode_") {
					want = `{instance=~"$memnode"}`
				}
				assert.Equal(t, want, sel[1], "%s in panel %q", sel[0], pn.Title)
			}
		}
	}

	name := regexp.MustCompile(`pd3_[a-z0-9_]+`)
	queried := 0
	for _, pn := range dash.Panels {
		require.NotEmpty(t, pn.Targets, pn.Title)
		for _, tg := range pn.Targets {
			for _, m := range name.FindAllString(tg.Expr, -1) {
				if !mounted && strings.HasPrefix(m, "pd3_fs_") {
					t.Logf("%s not checked: no mount here", m)
					continue
				}
				if !governed && strings.HasPrefix(m, "pd3_procs_") {
					t.Logf("%s not checked: one P, no governor", m)
					continue
				}
				queried++
				if base, ok := strings.CutSuffix(m, "_bucket"); ok {
					mf, found := mfs[base]
					if assert.True(t, found, "%q (panel %q) is not in /metrics", base, pn.Title) {
						assert.Equal(t, dto.MetricType_HISTOGRAM, mf.GetType(), "%s", base)
					}
					continue
				}
				mf, found := mfs[m]
				if !assert.True(t, found, "%q (panel %q) is not in /metrics", m, pn.Title) {
					continue
				}
				if strings.Contains(tg.Expr, "rate("+m) || strings.Contains(tg.Expr, "increase("+m) {
					assert.Equal(t, dto.MetricType_COUNTER, mf.GetType(), "rate() or increase() of %s needs a counter", m)
				}
			}
		}
	}
	assert.Greater(t, queried, 20)
	// The requests above were measured.
	nbdLat := mfs["pd3_nbd_request_duration_seconds"]
	var reads uint64
	for _, m := range nbdLat.GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "cmd" && l.GetValue() == "READ" {
				reads = m.GetHistogram().GetSampleCount()
			}
		}
	}
	assert.Equal(t, uint64(1), reads, "one NBD READ observed")
}

// A host on the control plane reports how often it resumed its session.
func TestControlMetrics(t *testing.T) {
	ctx := context.Background()
	etcd, err := etcdembed.Start(ctx, etcdembed.Config{Dir: t.TempDir()})
	require.NoError(t, err)
	// A cleanup, not a defer: etcd must outlive the host, whose Close
	// (a cleanup of hostOnNewNode's, run first) releases its hold there.
	t.Cleanup(func() { etcd.Close() })
	h, _ := hostOnNewNode(t, Config{Volumes: []VolumeSpec{{"disk0", 1 << 20}}, CacheBytes: 16 * 4096,
		Etcd: cluster.Access{Endpoints: []string{etcd.Endpoint}}})
	mfs, err := h.Registry().Gather()
	require.NoError(t, err)
	var names []string
	for _, mf := range mfs {
		names = append(names, mf.GetName())
	}
	assert.Contains(t, names, "pd3_control_sessions_resumed_total")
}
