package deploy

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/pd3-go/pd3/memnode"
	"github.com/pd3-go/pd3/pagestore/pageproto"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type regInput struct {
	put   bool
	key   uint64
	value uint64
}

// registerModel: every page is an independent register holding the version
// last put (0 before any put).
var registerModel = porcupine.Model{
	Partition: func(h []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[uint64][]porcupine.Operation{}
		for _, op := range h {
			k := op.Input.(regInput).key
			byKey[k] = append(byKey[k], op)
		}
		out := make([][]porcupine.Operation, 0, len(byKey))
		for _, ops := range byKey {
			out = append(out, ops)
		}
		return out
	},
	Init: func() any { return uint64(0) },
	Step: func(state, input, output any) (bool, any) {
		in := input.(regInput)
		if in.put {
			return true, in.value
		}
		return output.(uint64) == state.(uint64), state
	},
	DescribeOperation: func(input, output any) string {
		in := input.(regInput)
		if in.put {
			return fmt.Sprintf("put(%d)=%d", in.key, in.value)
		}
		return fmt.Sprintf("get(%d)→%v", in.key, output)
	},
}

func seed(t *testing.T) uint64 {
	s := uint64(time.Now().UnixNano())
	if v := os.Getenv("PD3_SEED"); v != "" {
		s, _ = strconv.ParseUint(v, 10, 64)
	}
	t.Logf("seed %d (PD3_SEED=%d to replay)", s, s)
	return s
}

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
			base := seed(t)
			start := time.Now()
			var mu sync.Mutex
			var history []porcupine.Operation
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
					rng := rand.New(rand.NewPCG(base, uint64(c)))
					buf := make([]byte, 4096)
					for i := 0; i < opsPerClient; i++ {
						k := memnode.MakeKey(1, uint64(rng.IntN(keys)))
						var op porcupine.Operation
						op.ClientId = c
						switch r := rng.IntN(10); {
						case r == 0:
							assert.NoError(t, cl.Sync(ctx))
							continue
						case r < 4:
							v := uint64(c)<<32 | uint64(i+1)
							binary.LittleEndian.PutUint64(buf, v)
							op.Input = regInput{put: true, key: uint64(k), value: v}
							op.Call = int64(time.Since(start))
							err = cl.Put(ctx, k, buf)
							op.Return = int64(time.Since(start))
							op.Output = uint64(0)
						default:
							op.Input = regInput{key: uint64(k)}
							op.Call = int64(time.Since(start))
							err = cl.Get(ctx, k, buf)
							op.Return = int64(time.Since(start))
							op.Output = binary.LittleEndian.Uint64(buf)
						}
						if !assert.NoError(t, err) {
							return
						}
						mu.Lock()
						history = append(history, op)
						mu.Unlock()
					}
				}()
			}
			wg.Wait()
			res, info := porcupine.CheckOperationsVerbose(registerModel, history, time.Minute)
			if res != porcupine.Ok {
				f, _ := os.CreateTemp("", "pd3-linearizability-*.html")
				if f != nil {
					porcupine.Visualize(registerModel, info, f)
					f.Close()
					t.Logf("history visualised in %s", f.Name())
				}
			}
			require.Equal(t, porcupine.Ok, res, "history of %d operations is not linearizable", len(history))
			st := h.Store.Stats()
			t.Logf("%d ops; evictions %d, write-backs %d, Loading Zone hits %d", len(history), st.Evictions, st.WriteBacks, st.PrefetchHits)
			assert.Greater(t, st.Evictions, uint64(200), "the cache must churn")
			if mode == "embedded" {
				assert.Positive(t, st.PrefetchHits, "prefetched pages must be served")
			}
		})
	}
}
