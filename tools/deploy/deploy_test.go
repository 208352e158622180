package deploy

import (
	"context"
	"errors"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/pd3-go/pd3/memnode"
	"github.com/pd3-go/pd3/pagestore/pageproto"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

func TestUnixSockets(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	node, err := StartMemnode(ctx, MemnodeConfig{Listen: "unix:" + filepath.Join(dir, "mem.sock")})
	require.NoError(t, err)
	defer node.Close()
	h, err := StartHost(ctx, HostConfig{
		Memnode: node.Addr, Volumes: []VolumeSpec{{"disk0", 1 << 20}},
		CacheBytes: 16 * 4096, PageListen: "unix:" + filepath.Join(dir, "page.sock"),
	})
	require.NoError(t, err)
	c, err := pageproto.Dial(ctx, h.PageAddr, pageproto.ClientOptions{})
	require.NoError(t, err)
	p := make([]byte, 4096)
	p[0] = 42
	require.NoError(t, c.Put(ctx, memnode.MakeKey(1, 3), p))
	c.Close()
	require.NoError(t, h.Close(ctx)) // writes the page back
	got := make([]byte, 4096)
	require.NoError(t, node.Server.Store.ReadAt(1, 3*4096, got))
	assert.Equal(t, p, got)
}

func TestParseVolume(t *testing.T) {
	v, err := ParseVolume("disk0:1GiB")
	require.NoError(t, err)
	assert.Equal(t, VolumeSpec{"disk0", 1 << 30}, v)
	for _, bad := range []string{"disk0", ":1G", "d:0", "d:x"} {
		_, err := ParseVolume(bad)
		assert.Error(t, err, bad)
	}
}

// TestLeapPrefetchesSequentialScans: a sequential read is predicted and
// served from the Loading Zone; without a trend nothing is prefetched.
func TestLeapPrefetchesSequentialScans(t *testing.T) {
	ctx := context.Background()
	node, err := StartMemnode(ctx, MemnodeConfig{})
	require.NoError(t, err)
	defer node.Close()
	h, err := StartHost(ctx, HostConfig{
		Memnode: node.Addr, Volumes: []VolumeSpec{{"disk0", 4 << 20}},
		CacheBytes: 16 * 4096, PageListen: "127.0.0.1:0", Prefetch: "leap",
	})
	require.NoError(t, err)
	defer h.Close(ctx)
	c, err := pageproto.Dial(ctx, h.PageAddr, pageproto.ClientOptions{})
	require.NoError(t, err)
	defer c.Close()
	buf := make([]byte, 4096)
	for p := uint64(0); p < 400; p++ {
		require.NoError(t, c.Get(ctx, memnode.MakeKey(1, p), buf))
	}
	assert.Positive(t, h.Leap.Predictions.Load())
	assert.Greater(t, h.Store.Stats().PrefetchHits, uint64(200), "most of a sequential scan comes from the Loading Zone")

	_, err = StartHost(ctx, HostConfig{Memnode: node.Addr, Volumes: []VolumeSpec{{"disk0", 4 << 20}}, DPU: "embedded", Prefetch: "leap"})
	assert.ErrorContains(t, err, "use it with --dpu none")
}

// TestAgentPrefetchesNBDReads: reads over NBD with an embedded agent are
// parsed and served from the Loading Zone.
// TestAgentPrefetchesNBDReads: with either mirror, the agent follows
// nbdcopy's connection (handshake included) and its prefetches serve
// reads. The packet mirror sees it on an AF_PACKET socket (root).
func TestAgentPrefetchesNBDReads(t *testing.T) {
	if _, err := exec.LookPath("nbdcopy"); err != nil {
		t.Skip("nbdcopy is not installed (apt-get install libnbd-bin; .ci/run does)")
	}
	for _, mirror := range []string{"tap", "packet"} {
		t.Run(mirror, func(t *testing.T) {
			ctx := context.Background()
			node, err := StartMemnode(ctx, MemnodeConfig{})
			require.NoError(t, err)
			defer node.Close()
			h, err := StartHost(ctx, HostConfig{
				Memnode: node.Addr, Volumes: []VolumeSpec{{"disk0", 64 << 20}},
				CacheBytes: 1 << 20, NBDListen: "127.0.0.1:0", DPU: "embedded", Mirror: mirror,
			})
			if errors.Is(err, unix.EPERM) {
				t.Skip("the packet mirror needs CAP_NET_RAW:", err)
			}
			require.NoError(t, err)
			defer h.Close(ctx)
			out, err := exec.Command("nbdcopy", "nbd://"+h.NBDAddr+"/disk0", "null:").CombinedOutput()
			require.NoError(t, err, "%s", out)
			require.Eventually(t, func() bool { return h.Agent.Parsed.Load() > 0 }, 5*time.Second, 10*time.Millisecond,
				"the agent parsed NBD requests")
			assert.Zero(t, h.Agent.LostStreams.Load(), "and followed every connection")
			assert.Positive(t, h.Store.Stats().PrefetchHits, "reads were served from the Loading Zone")
			t.Logf("parsed %d, prefetched %d, Loading Zone hits %d of %d misses", h.Agent.Parsed.Load(),
				h.Engine.Issued.Load(), h.Store.Stats().PrefetchHits, h.Store.Stats().Misses)
		})
	}
}

func TestMirrorModeErrors(t *testing.T) {
	ctx := context.Background()
	node, err := StartMemnode(ctx, MemnodeConfig{})
	require.NoError(t, err)
	defer node.Close()
	for _, tc := range []struct{ dpu, mirror, want string }{
		{"embedded", "pcap", "unknown --mirror"},
		{"none", "packet", "use it with --dpu embedded or shm:NAME"},
	} {
		_, err := StartHost(ctx, HostConfig{Memnode: node.Addr, Volumes: []VolumeSpec{{"disk0", 1 << 20}}, DPU: tc.dpu, Mirror: tc.mirror})
		assert.ErrorContains(t, err, tc.want)
	}
	// A server on every address cannot be watched on one interface.
	_, err = StartHost(ctx, HostConfig{Memnode: node.Addr, Volumes: []VolumeSpec{{"disk0", 1 << 20}}, DPU: "embedded",
		Mirror: "packet", PageListen: "0.0.0.0:0"})
	assert.ErrorContains(t, err, "needs the server on one IPv4 address")
}
