package host

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/pd3-go/pd3/cluster"
	"github.com/pd3-go/pd3/internal/nbdmodel"
	"github.com/pd3-go/pd3/internal/testutil"
)

// TestRandomNBDRequestsOnEveryReadPath runs internal/nbdmodel's random
// requests (every command, unaligned, pipelined, replies in any order)
// against a whole host on each of its read paths: the embedded agent
// parsing a tapped copy of the stream or the packets themselves and
// prefetching into the Loading Zone, and Leap's host-side prefetcher; with
// a 16-page cache, a background write-back every millisecond, and simple
// and structured replies. A prefetch that raced a write, a trim or a
// write-back and was served afterwards would show as a stale read.
func TestRandomNBDRequestsOnEveryReadPath(t *testing.T) {
	for _, tc := range []struct {
		dpu      AgentMode
		mirror   Mirror
		prefetch Prefetcher
	}{
		{EmbeddedAgent, MirrorTap, PrefetchNone}, {EmbeddedAgent, MirrorPacket, PrefetchNone}, {AgentMode{}, MirrorNone, PrefetchLeap},
	} {
		for _, structured := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/%s%s/structured=%v", tc.dpu, tc.mirror, tc.prefetch, structured), func(t *testing.T) {
				ctx := context.Background()
				const size = 8 << 20
				h, err := Start(ctx, Config{
					Memnode: newNode(t).Addr, Volumes: []VolumeSpec{{"disk0", size}},
					CacheBytes: 16 * 4096, LZBytes: 64 * 4096, NBDListen: "127.0.0.1:0",
					DPU: tc.dpu, Mirror: tc.mirror, Prefetch: tc.prefetch, Writeback: time.Millisecond,
				})
				if tc.mirror == MirrorPacket && errors.Is(err, unix.EPERM) {
					t.Skip("the packet mirror needs CAP_NET_RAW:", err)
				}
				require.NoError(t, err)
				defer func() {
					require.NoError(t, h.Close(ctx))
					assert.NoError(t, h.Store.Check())
				}()
				nbdmodel.Check(t, h.NBDAddr, "disk0", size, structured, testutil.Soak(t, 120, 600), nil)
				st := h.Store.Stats()
				t.Logf("evictions %d, write-backs %d, Loading Zone hits %d", st.Evictions, st.WriteBacks, st.PrefetchHits)
				if tc.dpu == EmbeddedAgent {
					assert.Positive(t, st.PrefetchHits, "prefetched pages must be served")
				}
			})
		}
	}
}

// killReplica closes a memory node that holds a replica of the first
// extent of volume name (the extent the model's hot head is in).
func killReplica(t *testing.T, access cluster.Access, nodes []*Memnode, name string) {
	t.Helper()
	ctx := context.Background()
	cli, err := cluster.Dial(ctx, access)
	require.NoError(t, err)
	defer cli.Close()
	rec, err := cluster.GetVolume(ctx, cli, "", name)
	require.NoError(t, err)
	require.NotNil(t, rec.Stripes, "%s is not replicated", name)
	for _, n := range nodes {
		if n.ID == rec.Stripes.Extents[0][0] {
			n.kill()
			return
		}
	}
	t.Fatalf("no node of %v holds %s's first extent", rec.Stripes.Extents[0], name)
}

// kill stops a volatile memory node as a crash of its process would, not
// as Close does: no de-registration (its record stays and reads as up until
// its lease runs out), its connections cut without a word, its memory
// gone. Its later Close does nothing.
func (m *Memnode) kill() {
	m.closeOnce.Do(func() {
		if m.reg != nil {
			m.reg.Abandon()
		}
		if m.etcd != nil {
			m.etcd.Close()
		}
		m.Server.Close()
		<-m.done
	})
}

// TestRandomNBDRequestsOnAReplicatedVolume: the same requests on a volume
// replicated twice over three memory nodes (extents of 16 MiB, the
// control plane embedded), with a node that holds the hot extent killed
// halfway: reads fail over, writes, trims and write-backs drop the dead
// node's replicas, and no reply differs from the model, with the host
// reading for itself and with the embedded agent prefetching.
func TestRandomNBDRequestsOnAReplicatedVolume(t *testing.T) {
	for _, dpuMode := range []AgentMode{{}, EmbeddedAgent} {
		t.Run("dpu="+dpuMode.String(), func(t *testing.T) {
			ctx := context.Background()
			access, nodes := startCluster(t, 3)
			const size = 32 << 20 // two extents
			h, err := Start(ctx, Config{
				Etcd: access, Replicas: 2, Volumes: []VolumeSpec{{"disk0", size}}, DPU: dpuMode,
				CacheBytes: 16 * 4096, NBDListen: "127.0.0.1:0", OpTimeout: 2 * time.Second, Writeback: time.Millisecond,
			})
			require.NoError(t, err)
			defer func() {
				require.NoError(t, h.Close(ctx))
				assert.NoError(t, h.Store.Check())
			}()
			nbdmodel.Check(t, h.NBDAddr, "disk0", size, dpuMode == EmbeddedAgent, testutil.Soak(t, 120, 600), func() {
				killReplica(t, access, nodes, "disk0")
			})
			t.Logf("failovers %d, dropped %d, repaired %d", h.Replicated.Failovers.Load(), h.Replicated.Dropped.Load(), h.Replicated.Repaired.Load())
			assert.Positive(t, h.Replicated.Dropped.Load(), "the dead node's replicas were dropped")
		})
	}
}
