package host

import (
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd3-go/pd3/internal/nbdclient"
)

// A scan spread over three connections, request by request, as nbdfuse
// sends one (NBD multi-conn), is predicted: the agent has the host read
// ahead of it, the predictions are read, and the host takes most pages
// from its read-ahead windows instead of waiting for the memory node
// (docs/decisions.md, 33). Its large reads are not cached
// (--nbd-stream-from), and every byte is right.
func TestNBDScanIsPredicted(t *testing.T) {
	const size, chunk = 16 << 20, 128 << 10
	h, _ := hostOnNewNode(t, Config{Volumes: []VolumeSpec{{"disk0", size}}, CacheBytes: 64 * 4096,
		DPU: EmbeddedAgent, NBDListen: "127.0.0.1:0", NBDStreamFrom: 64 << 10})
	var conns []*nbdclient.Client
	for range 3 {
		c, err := nbdclient.Dial(h.NBDAddr, "disk0")
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		conns = append(conns, c)
	}
	buf := make([]byte, 1<<20)
	for off := 0; off < size; off += len(buf) {
		for p := 0; p < len(buf); p += 4096 {
			binary.LittleEndian.PutUint64(buf[p:], uint64(off+p)/4096+1)
		}
		require.NoError(t, conns[0].Write(uint64(off), buf))
	}
	require.NoError(t, conns[0].Flush())
	st0 := h.Store.Stats()
	pred, _ := h.Agent.Predictors()
	u0, w0 := pred.Useful.Load(), pred.Wasted.Load()

	p := make([]byte, chunk)
	for i, off := 0, 0; off < size; i, off = i+1, off+chunk {
		require.NoError(t, conns[i%len(conns)].Read(uint64(off), p))
		for q := 0; q < chunk; q += 4096 {
			require.Equal(t, uint64(off+q)/4096+1, binary.LittleEndian.Uint64(p[q:]), "page %d", (off+q)/4096)
		}
	}
	st := h.Store.Stats()
	useful, wasted := pred.Useful.Load()-u0, pred.Wasted.Load()-w0
	t.Logf("predictions used %d, wasted %d; read-ahead hits %d, remote reads %d", useful, wasted, st.ReadAheadHits-st0.ReadAheadHits, st.RemoteReads-st0.RemoteReads)
	assert.Greater(t, useful, uint64(size/4096/2), "most of the scan was predicted")
	assert.GreaterOrEqual(t, float64(useful), 0.9*float64(useful+wasted), "the predictions were read")
	assert.Zero(t, pred.Off.Load())
	assert.Greater(t, st.ReadAheadHits-st0.ReadAheadHits, uint64(size/4096/2), "the host took most pages from its read-ahead windows")
	assert.Zero(t, st.PrefetchHits-st0.PrefetchHits, "nothing went through the Loading Zone")
	assert.Equal(t, st0.Evictions, st.Evictions, "stream reads took no frame from the cache")
}
