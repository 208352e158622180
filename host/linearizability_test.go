package host

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/pd3-go/pd3/cluster"
	"github.com/pd3-go/pd3/cluster/etcdembed"
	"github.com/pd3-go/pd3/internal/linearize"
	"github.com/pd3-go/pd3/internal/nbdclient"
	"github.com/pd3-go/pd3/internal/testutil"
	"github.com/pd3-go/pd3/pagestore/pageproto"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestLinearizableWithPrefetching drives concurrent reads, writes and
// syncs — GET/PUT/SYNC through the page protocol, or READ/WRITE/FLUSH over
// NBD, whose one-page reads the connection reader runs to completion
// (GetAsync) — at a host with the embedded agent prefetching, a cache of 8
// pages over 32 hot pages (constant eviction and write-back) and a small
// Loading Zone, and checks the history with porcupine.
func TestLinearizableWithPrefetching(t *testing.T) {
	for _, tc := range []struct {
		mode  AgentMode
		proto string
	}{
		{EmbeddedAgent, "page"}, {AgentMode{}, "page"}, {EmbeddedAgent, "nbd"}, {AgentMode{}, "nbd"},
	} {
		mode := tc.mode
		t.Run(mode.String()+"/"+tc.proto, func(t *testing.T) {
			ctx := context.Background()
			node, err := StartMemnode(ctx, MemnodeConfig{})
			require.NoError(t, err)
			defer node.Close()
			h, err := Start(ctx, Config{
				Memnode: node.Addr, Volumes: []VolumeSpec{{"disk0", 1 << 20}},
				CacheBytes: 8 * 4096, LZBytes: 16 * 4096, PageListen: "127.0.0.1:0", NBDListen: "127.0.0.1:0",
				DPU: mode, Workers: 4,
			})
			require.NoError(t, err)
			defer func() {
				require.NoError(t, h.Close(ctx))
				assert.NoError(t, h.Store.Check())
			}()
			const clients, opsPerClient, keys, volPages = 6, 700, 32, 256
			base := testutil.Seed(t)
			hist := linearize.NewHistory()
			var wg sync.WaitGroup
			for c := 0; c < clients; c++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					var lc linearize.Client
					if tc.proto == "nbd" {
						cl, err := nbdclient.Dial(h.NBDAddr, "disk0")
						if !assert.NoError(t, err) {
							return
						}
						defer cl.Close()
						lc = linearize.NBDClient{C: cl}
					} else {
						cl, err := pageproto.Dial(ctx, h.PageAddr, pageproto.ClientOptions{})
						if !assert.NoError(t, err) {
							return
						}
						defer cl.Close()
						lc = linearize.PageClient{C: cl, Vol: 1}
					}
					if tc.proto == "nbd" && c == 0 {
						// Over NBD the embedded agent prefetches only
						// what it predicts past the reads
						// (docs/decisions.md, 31): one client scans the
						// whole volume, the hot pages with the rest.
						assert.NoError(t, hist.Scan(c, lc, volPages, opsPerClient))
						return
					}
					assert.NoError(t, hist.Run(c, lc, keys, base, nil, opsPerClient))
				}()
			}
			wg.Wait()
			ok, vis := hist.Check(time.Minute)
			require.True(t, ok, "history of %d operations is not linearizable (see %s)", hist.Len(), vis)
			st := h.Store.Stats()
			t.Logf("%d ops; evictions %d, write-backs %d, Loading Zone hits %d, async loads %d", hist.Len(), st.Evictions, st.WriteBacks, st.PrefetchHits, st.AsyncLoads)
			assert.Greater(t, st.Evictions, uint64(200), "the cache must churn")
			if mode == EmbeddedAgent {
				assert.Positive(t, st.PrefetchHits, "prefetched pages must be served")
			}
			if tc.proto == "nbd" {
				assert.Positive(t, st.AsyncLoads, "NBD reads must take the reader's path")
			}
		})
	}
}

// TestLinearizableReplicatedWithANodeKilled: the same porcupine check over
// a replicated volume (R=2 over three memory nodes in process, the control
// plane embedded), with one node killed mid-run: constant eviction and
// write-back fail over and drop the dead node's replicas, the host's
// tender copies its extents to the node left over, and the history of
// GET/PUT/SYNC is linearizable throughout — with the host reading for
// itself, and with the embedded agent prefetching the pages of every
// request through the same node connections.
func TestLinearizableReplicatedWithANodeKilled(t *testing.T) {
	for _, dpuMode := range []AgentMode{{}, EmbeddedAgent} {
		t.Run("dpu="+dpuMode.String(), func(t *testing.T) { linearizableReplicatedWithANodeKilled(t, dpuMode) })
	}
}

// startCluster starts an embedded etcd and n memory nodes registered in
// it, all closed when the test ends.
func startCluster(t *testing.T, n int) (cluster.Access, []*Memnode) {
	t.Helper()
	ctx := context.Background()
	etcd, err := etcdembed.Start(ctx, etcdembed.Config{Dir: t.TempDir()})
	require.NoError(t, err)
	t.Cleanup(func() { etcd.Close() })
	access := cluster.Access{Endpoints: []string{etcd.Endpoint}}
	var nodes []*Memnode
	for range n {
		node, err := StartMemnode(ctx, MemnodeConfig{Etcd: access})
		require.NoError(t, err)
		t.Cleanup(func() { node.Close() })
		nodes = append(nodes, node)
	}
	return access, nodes
}

func linearizableReplicatedWithANodeKilled(t *testing.T, dpuMode AgentMode) {
	ctx := context.Background()
	access, nodes := startCluster(t, 3)
	// Four extents of 16 MiB, eight of the workload's keys in each.
	h, err := Start(ctx, Config{
		Etcd: access, Replicas: 2, Volumes: []VolumeSpec{{"disk0", 64 << 20}}, DPU: dpuMode,
		CacheBytes: 8 * 4096, PageListen: "127.0.0.1:0", Workers: 4, OpTimeout: 2 * time.Second, Writeback: 50 * time.Millisecond,
	})
	require.NoError(t, err)
	defer func() {
		require.NoError(t, h.Close(ctx))
		assert.NoError(t, h.Store.Check())
	}()
	const clients, opsPerClient, keys = 6, 900, 32
	base := testutil.Seed(t)
	hist := linearize.NewHistory()
	wait := runPageClients(t, h, hist, clients, opsPerClient, keys, base)
	require.Eventually(t, func() bool { return hist.Len() >= clients*opsPerClient/4 }, time.Minute, time.Millisecond, "a quarter of the run done")
	killReplica(t, access, nodes, "disk0") // mid-run
	wait()
	ok, vis := hist.Check(time.Minute)
	require.True(t, ok, "history of %d operations is not linearizable (see %s)", hist.Len(), vis)
	st := h.Store.Stats()
	t.Logf("%d ops; evictions %d, write-backs %d; failovers %d, dropped %d, repaired %d", hist.Len(), st.Evictions, st.WriteBacks,
		h.Replicated.Failovers.Load(), h.Replicated.Dropped.Load(), h.Replicated.Repaired.Load())
	assert.Greater(t, st.Evictions, uint64(200), "the cache must churn")
	assert.Positive(t, h.Replicated.Dropped.Load(), "the dead node's replicas were dropped")
	if dpuMode == EmbeddedAgent {
		t.Logf("agent: issued %d, placed %d, joined %d, stale %d, failed %d", h.Engine.Issued.Load(), h.Engine.Placed.Load(),
			h.Engine.Joined.Load(), h.Engine.Stale.Load(), h.Engine.Failed.Load())
		assert.Positive(t, h.Engine.Placed.Load()+h.Engine.Joined.Load(), "the agent's prefetches served the host")
	}
}

// TestLinearizableCodedWithANodeKilled: the porcupine check over an
// erasure-coded volume (4+2 over six memory nodes in process), with the
// node holding the first data shard killed mid-run as a crash would:
// its pages are decoded from the other shards, constant eviction and
// write-back code rows around the lost shard and drop it, and the
// history of GET/PUT/SYNC is linearizable throughout, with the host
// reading for itself and with the embedded agent prefetching.
func TestLinearizableCodedWithANodeKilled(t *testing.T) {
	for _, dpuMode := range []AgentMode{{}, EmbeddedAgent} {
		t.Run("dpu="+dpuMode.String(), func(t *testing.T) {
			ctx := context.Background()
			access, nodes := startCluster(t, 6)
			// One group of four 16 MiB extents; the workload's 32 keys 2
			// MiB apart fall in its first four data shards' rows.
			h, err := Start(ctx, Config{
				Etcd: access, EC: cluster.Scheme{K: 4, M: 2}, Volumes: []VolumeSpec{{"disk0", 64 << 20}}, DPU: dpuMode,
				CacheBytes: 8 * 4096, PageListen: "127.0.0.1:0", Workers: 4, OpTimeout: 2 * time.Second, Writeback: 50 * time.Millisecond,
			})
			require.NoError(t, err)
			defer func() {
				require.NoError(t, h.Close(ctx))
				assert.NoError(t, h.Store.Check())
			}()
			const clients, opsPerClient, keys = 6, 600, 32
			base := testutil.Seed(t)
			hist := linearize.NewHistory()
			wait := runPageClients(t, h, hist, clients, opsPerClient, keys, base)
			require.Eventually(t, func() bool { return hist.Len() >= clients*opsPerClient/4 }, time.Minute, time.Millisecond, "a quarter of the run done")
			p, ok := h.Coded.Placement(h.Volumes[0].ID)
			require.True(t, ok)
			killed := false
			for _, n := range nodes {
				if n.ID == p.Groups[0][0] {
					n.kill() // mid-run
					killed = true
				}
			}
			require.True(t, killed)
			wait()
			ok, vis := hist.Check(time.Minute)
			require.True(t, ok, "history of %d operations is not linearizable (see %s)", hist.Len(), vis)
			st := h.Store.Stats()
			t.Logf("%d ops; evictions %d, write-backs %d; decoded %d, dropped %d", hist.Len(), st.Evictions, st.WriteBacks,
				h.Coded.Decoded.Load(), h.Coded.Dropped.Load())
			assert.Greater(t, st.Evictions, uint64(200), "the cache must churn")
			assert.Positive(t, h.Coded.Decoded.Load()+h.Coded.Dropped.Load(), "the dead node's shard was decoded or dropped")
		})
	}
}

// runPageClients starts clients page-protocol clients at h's first
// volume, each running ops operations of the linearizability workload on
// keys pages 2 MiB apart (over the extents of a volume placed over many
// nodes), recorded in hist; the function returned waits for them.
func runPageClients(t *testing.T, h *Host, hist *linearize.History, clients, ops, keys int, base uint64) (wait func()) {
	var wg sync.WaitGroup
	for c := range clients {
		wg.Go(func() {
			cl, err := pageproto.Dial(context.Background(), h.PageAddr, pageproto.ClientOptions{})
			if !assert.NoError(t, err) {
				return
			}
			defer cl.Close()
			lc := linearize.PageClient{C: cl, Vol: h.Volumes[0].ID, Stride: 512}
			assert.NoError(t, hist.Run(c, lc, keys, base, nil, ops))
		})
	}
	return wg.Wait
}
