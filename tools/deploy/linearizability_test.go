package deploy

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/pd3-go/pd3/internal/linearize"
	"github.com/pd3-go/pd3/internal/testutil"
	"github.com/pd3-go/pd3/pagestore/pageproto"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestLinearizableWithPrefetching drives concurrent GET/PUT/SYNC through the
// page protocol of a host with the embedded agent prefetching, a cache of 8
// pages over 32 hot pages (constant eviction and write-back) and a small
// Loading Zone, and checks the history with porcupine.
func TestLinearizableWithPrefetching(t *testing.T) {
	for _, mode := range []string{"embedded", "none"} {
		t.Run(mode, func(t *testing.T) {
			ctx := context.Background()
			node, err := StartMemnode(ctx, MemnodeConfig{})
			require.NoError(t, err)
			defer node.Close()
			h, err := StartHost(ctx, HostConfig{
				Memnode: node.Addr, Volumes: []VolumeSpec{{"disk0", 1 << 20}},
				CacheBytes: 8 * 4096, LZBytes: 16 * 4096, PageListen: "127.0.0.1:0", DPU: mode, Workers: 4,
			})
			require.NoError(t, err)
			defer func() {
				require.NoError(t, h.Close(ctx))
				assert.NoError(t, h.Store.Check())
			}()
			const clients, opsPerClient, keys = 6, 700, 32
			base := testutil.Seed(t)
			hist := linearize.NewHistory()
			var wg sync.WaitGroup
			for c := 0; c < clients; c++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					cl, err := pageproto.Dial(ctx, h.PageAddr, pageproto.ClientOptions{})
					if !assert.NoError(t, err) {
						return
					}
					defer cl.Close()
					assert.NoError(t, hist.Run(c, linearize.PageClient{C: cl, Vol: 1}, keys, base, nil, opsPerClient))
				}()
			}
			wg.Wait()
			ok, vis := hist.Check(time.Minute)
			require.True(t, ok, "history of %d operations is not linearizable (see %s)", hist.Len(), vis)
			st := h.Store.Stats()
			t.Logf("%d ops; evictions %d, write-backs %d, Loading Zone hits %d", hist.Len(), st.Evictions, st.WriteBacks, st.PrefetchHits)
			assert.Greater(t, st.Evictions, uint64(200), "the cache must churn")
			if mode == "embedded" {
				assert.Positive(t, st.PrefetchHits, "prefetched pages must be served")
			}
		})
	}
}
