package host

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd3-go/pd3/cluster"
	"github.com/pd3-go/pd3/fs"
	"github.com/pd3-go/pd3/internal/fsmodel"
	"github.com/pd3-go/pd3/internal/testutil"
)

// TestRandomFileOpsOnAHostMount runs internal/fsmodel (fsx and fsstress
// in one) on a whole host's mount: the embedded agent prefetching what
// the mount's reads announce, a background write-back every millisecond,
// a 1 MiB cache under 2 MiB files; on one memory node, and on volumes
// replicated twice over three with a node that holds the files killed at
// the first remount.
// A host has no crash here: every remount is a clean stop and start
// (fs.TestRandomOpsMatchAReference crashes one).
func TestRandomFileOpsOnAHostMount(t *testing.T) {
	if err := fs.Available(); err != nil {
		t.Skip(err)
	}
	for _, replicated := range []bool{false, true} {
		name := "one-node"
		if replicated {
			name = "replicated"
		}
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			dir := t.TempDir()
			cfg := Config{
				Volumes: []VolumeSpec{{"disk0", 1 << 20}}, DPU: EmbeddedAgent, CacheBytes: 1 << 20,
				Writeback: time.Millisecond, OpTimeout: 2 * time.Second, Mount: dir, FSName: "pd3",
			}
			var nodes []*Memnode
			if replicated {
				var access cluster.Access
				access, nodes = startCluster(t, 3)
				cfg.Etcd, cfg.Replicas = access, 2
			} else {
				cfg.Memnode = newNode(t).Addr
			}
			h, err := Start(ctx, cfg)
			require.NoError(t, err)
			// What every host did, summed at each stop.
			var misses, lzHits, evictions, writeBacks uint64
			sum := func() {
				st := h.Store.Stats()
				misses, lzHits, evictions, writeBacks = misses+st.Misses, lzHits+st.PrefetchHits, evictions+st.Evictions, writeBacks+st.WriteBacks
			}
			defer func() {
				if h != nil {
					assert.NoError(t, h.Close(ctx))
				}
			}()
			ops := fsmodel.Run(t, fsmodel.Config{
				Dir: dir, Ref: t.TempDir(), Steps: testutil.Soak(t, 500, 4000), Seed: testutil.Seed(t),
				Remount: func(bool) string {
					sum()
					var victim string
					if nodes != nil {
						victim = h.group.Stripes().Extents[0][0] // a node the files are on
					}
					require.NoError(t, h.Close(ctx))
					for i, n := range nodes {
						if n.ID == victim {
							n.kill()
							nodes = nil // once
							break
						}
						require.Less(t, i, len(nodes)-1, "no node is %s", victim)
					}
					h, err = Start(ctx, cfg)
					require.NoError(t, err)
					return dir
				},
			})
			sum()
			t.Logf("calls that succeeded on both sides: %v; misses %d, Loading Zone hits %d, evictions %d, write-backs %d", ops, misses, lzHits, evictions, writeBacks)
			assert.Positive(t, lzHits, "the agent's prefetches served the mount")
		})
	}
}
