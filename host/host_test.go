package host

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pd3-go/pd3/internal/nbdclient"
	"github.com/pd3-go/pd3/internal/testutil"
	"github.com/pd3-go/pd3/pageid"
	"github.com/pd3-go/pd3/pagestore/pageproto"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"golang.org/x/sys/unix"
)

func TestUnixSockets(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	node, err := StartMemnode(ctx, MemnodeConfig{Listen: "unix:" + filepath.Join(dir, "mem.sock")})
	require.NoError(t, err)
	defer node.Close()
	h, err := Start(ctx, Config{
		Memnode: node.Addr, Volumes: []VolumeSpec{{"disk0", 1 << 20}},
		CacheBytes: 16 * 4096, PageListen: "unix:" + filepath.Join(dir, "page.sock"), NBDListen: "unix:" + filepath.Join(dir, "nbd.sock"),
	})
	require.NoError(t, err)
	// Both front ends count their requests where the memory-node client's
	// reader looks (sockio.Reader.DirectIf).
	require.NotNil(t, h.busy)
	assert.Same(t, h.busy, h.NBD.Busy)
	assert.Same(t, h.busy, h.Page.Busy)
	// NBD on a unix socket, reached by the URI the command prints.
	if _, err := exec.LookPath("nbdinfo"); err == nil {
		uri := NBDURI(h.NBDAddr, "disk0")
		assert.Equal(t, "nbd+unix:///disk0?socket="+filepath.Join(dir, "nbd.sock"), uri)
		out, err := exec.Command("nbdinfo", "--size", uri).CombinedOutput()
		require.NoError(t, err, "%s", out)
		assert.Equal(t, "1048576", strings.TrimSpace(string(out)))
	}
	c, err := pageproto.Dial(ctx, h.PageAddr, pageproto.ClientOptions{})
	require.NoError(t, err)
	p := make([]byte, 4096)
	p[0] = 42
	require.NoError(t, c.Put(ctx, pageid.MakeKey(1, 3), p))
	c.Close()
	require.NoError(t, h.Close(ctx)) // writes the page back
	got := make([]byte, 4096)
	require.NoError(t, node.Server.Store.ReadAt(1, 3*4096, got))
	assert.Equal(t, p, got)
}

// newNode starts a memory node, stopped when the test ends.
func newNode(t *testing.T) *Memnode {
	t.Helper()
	node, err := StartMemnode(context.Background(), MemnodeConfig{})
	require.NoError(t, err)
	t.Cleanup(func() { node.Close() })
	return node
}

// hostOnNewNode starts a memory node and a host on it (cfg.Memnode is set
// here), both stopped when the test ends; it returns the host and the
// node's address.
func hostOnNewNode(t *testing.T, cfg Config) (*Host, string) {
	t.Helper()
	ctx := context.Background()
	node := newNode(t)
	cfg.Memnode = node.Addr
	h, err := Start(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { h.Close(ctx) })
	return h, node.Addr
}

// TestFlushKeepsPagesInHostView: pages the host wrote and flushed are
// still cached, so Host View must keep them — dropping them at the flush
// made the agent prefetch pages the host held.
func TestFlushKeepsPagesInHostView(t *testing.T) {
	ctx := context.Background()
	h, _ := hostOnNewNode(t, Config{
		Volumes: []VolumeSpec{{"disk0", 1 << 20}}, CacheBytes: 64 * 4096, PageListen: "127.0.0.1:0", DPU: EmbeddedAgent,
	})
	c, err := pageproto.Dial(ctx, h.PageAddr, pageproto.ClientOptions{})
	require.NoError(t, err)
	defer c.Close()
	p := make([]byte, 4096)
	const pages = 32
	for i := uint64(0); i < pages; i++ {
		require.NoError(t, c.Put(ctx, pageid.MakeKey(1, i), p))
	}
	// Let the agent apply the PUTs (Host View adds) before the flush, so a
	// write-back that dropped keys would drop these. Writes alone do not
	// wake the prefetcher; a read does, and it finds them applied first:
	// the page it reads was written, so it is not prefetched.
	require.NoError(t, c.Get(ctx, pageid.MakeKey(1, 0), p))
	require.Eventually(t, func() bool { return h.Agent.Parsed.Load() >= pages+1 }, 5*time.Second, time.Millisecond)
	require.Eventually(t, func() bool { return h.HostView.Contains(uint64(pageid.MakeKey(1, pages-1))) }, 5*time.Second, time.Millisecond)
	require.NoError(t, c.Sync(ctx))
	require.EqualValues(t, pages, h.Store.Stats().WriteBacks, "SYNC wrote every page back")
	for i := uint64(0); i < pages; i++ {
		assert.True(t, h.HostView.Contains(uint64(pageid.MakeKey(1, i))), "page %d", i)
	}
	assert.Zero(t, h.Engine.Issued.Load(), "nothing the host holds is prefetched")
}

// NBD over TLS on a unix socket, through the host's configuration, with a
// real client; the configuration's errors name what is missing.
func TestNBDTLSOverUnixSocket(t *testing.T) {
	if _, err := exec.LookPath("nbdinfo"); err != nil {
		t.Skip("nbdinfo is not installed")
	}
	serverDir, clientDir := testutil.TestCA(t)
	sock := filepath.Join(t.TempDir(), "nbd.sock")
	h, _ := hostOnNewNode(t, Config{Volumes: []VolumeSpec{{"disk0", 1 << 20}}, CacheBytes: 16 * 4096,
		NBDListen: "unix:" + sock, NBDTLS: TLSRequire, NBDTLSCertificates: serverDir, RequireClientCert: true})
	require.NotNil(t, h.NBD.TLS)
	uri := "nbds+unix:///disk0?socket=" + sock + "&tls-certificates=" + clientDir
	out, err := exec.Command("nbdinfo", "--size", uri).CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.Equal(t, "1048576", strings.TrimSpace(string(out)))
	out, err = exec.Command("nbdinfo", "--size", "nbd+unix:///disk0?socket="+sock).CombinedOutput()
	assert.Error(t, err, "plaintext refused: %s", out)

	for _, tc := range []struct {
		mode      TLSMode
		dir, want string
	}{
		{TLSRequire, "", "needs a certificate directory"},
		{TLSOn, t.TempDir(), "server-cert.pem"},
	} {
		_, err := NBDTLSConfig(tc.mode, tc.dir, false)
		assert.ErrorContains(t, err, tc.want)
	}
	cfg, err := NBDTLSConfig(TLSOff, "", false)
	assert.NoError(t, err)
	assert.Nil(t, cfg)
}

func TestNBDURI(t *testing.T) {
	assert.Equal(t, "nbd://127.0.0.1:10809/disk0", NBDURI("127.0.0.1:10809", "disk0"))
	assert.Equal(t, "nbd+unix:///disk0?socket=/run/pd3/nbd.sock", NBDURI("unix:/run/pd3/nbd.sock", "disk0"))
	assert.Equal(t, "nbd+unix:///disk0?socket=/tmp/a%20b%26c.sock", NBDURI("unix:/tmp/a b&c.sock", "disk0"))
	assert.Equal(t, "nbd://[::1]:10809/my%20disk", NBDURI("[::1]:10809", "my disk"))
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
	h, nodeAddr := hostOnNewNode(t, Config{
		Volumes: []VolumeSpec{{"disk0", 4 << 20}}, CacheBytes: 16 * 4096, PageListen: "127.0.0.1:0", Prefetch: PrefetchLeap,
	})
	c, err := pageproto.Dial(ctx, h.PageAddr, pageproto.ClientOptions{})
	require.NoError(t, err)
	defer c.Close()
	buf := make([]byte, 4096)
	for p := uint64(0); p < 400; p++ {
		require.NoError(t, c.Get(ctx, pageid.MakeKey(1, p), buf))
	}
	assert.Positive(t, h.Leap.Predictions.Load())
	assert.Greater(t, h.Store.Stats().PrefetchHits, uint64(200), "most of a sequential scan comes from the Loading Zone")

	_, err = Start(ctx, Config{Memnode: nodeAddr, Volumes: []VolumeSpec{{"disk0", 4 << 20}}, DPU: EmbeddedAgent, Prefetch: PrefetchLeap})
	assert.ErrorContains(t, err, "set Config.DPU to none")
}

// TestAgentPrefetchesNBDReads: with either mirror, the agent follows
// nbdcopy's connection (handshake included) and its prefetches serve
// reads. The packet mirror sees it on an AF_PACKET socket (root).
func TestAgentPrefetchesNBDReads(t *testing.T) {
	if _, err := exec.LookPath("nbdcopy"); err != nil {
		t.Skip("nbdcopy is not installed (apt-get install libnbd-bin; .ci/run does)")
	}
	for _, mirror := range []Mirror{MirrorTap, MirrorPacket} {
		t.Run(mirror.String(), func(t *testing.T) {
			ctx := context.Background()
			node, err := StartMemnode(ctx, MemnodeConfig{})
			require.NoError(t, err)
			defer node.Close()
			h, err := Start(ctx, Config{
				Memnode: node.Addr, Volumes: []VolumeSpec{{"disk0", 64 << 20}},
				CacheBytes: 1 << 20, NBDListen: "127.0.0.1:0", DPU: EmbeddedAgent, Mirror: mirror,
			})
			if mirror == MirrorPacket && errors.Is(err, unix.EPERM) {
				t.Skip("the packet mirror needs CAP_NET_RAW:", err)
			}
			require.NoError(t, err)
			defer h.Close(ctx)
			// Written first: nbdcopy reads only what BLOCK_STATUS calls data.
			data := bytes.Repeat([]byte{7}, 64<<20)
			require.NoError(t, h.Store.WriteRange(ctx, h.Volumes[0].ID, 0, data))
			require.NoError(t, h.Store.Flush(ctx))
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

// TestConfigErrors: a mode is refused where it is parsed, and a Config
// whose fields contradict each other is refused by Start before it dials
// anything (the memory node's address here accepts no connection), with
// an error that names the field.
func TestConfigErrors(t *testing.T) {
	_, err := ParseMirror("pcap")
	assert.ErrorContains(t, err, `unknown mirror "pcap": tap, packet or none`)
	_, err = ParseAgent("shm:")
	assert.ErrorContains(t, err, "embedded, none or shm:NAME")
	_, err = ParsePrefetcher("stride")
	assert.ErrorContains(t, err, "none or leap")
	_, err = ParseTLSMode("maybe")
	assert.ErrorContains(t, err, `unknown TLS mode "maybe"`)
	for _, s := range []string{"none", "embedded", "shm:r1"} {
		a, err := ParseAgent(s)
		require.NoError(t, err)
		assert.Equal(t, s, a.String())
	}

	vols := []VolumeSpec{{"disk0", 1 << 20}}
	for _, tc := range []struct {
		cfg          Config
		field, issue string
	}{
		{Config{Memnode: "127.0.0.1:1"}, "Volumes", "no volume"},
		{Config{Volumes: vols}, "Memnode", "no memory node address"},
		{Config{Memnode: "127.0.0.1:1", Volumes: vols, Mirror: MirrorPacket}, "Mirror", "set Config.DPU to embedded or shm:NAME"},
		{Config{Memnode: "127.0.0.1:1", Volumes: vols, DPU: EmbeddedAgent, Prefetch: PrefetchLeap}, "Prefetch", "set Config.DPU to none"},
		{Config{Volumes: vols, Replicas: 2}, "Replicas", "Config.Etcd"},
		{Config{Volumes: vols, Local: true, Mount: "/mnt"}, "Local", "Config.Mount needs a memory node"},
		{Config{Memnode: "127.0.0.1:1", Volumes: vols, FSName: "a.b"}, "FSName", `name "a.b" may be neither empty nor contain '.' or '/'`},
		{Config{Memnode: "127.0.0.1:1", Volumes: vols, NBDListen: "127.0.0.1:0", NBDTLS: TLSOn}, "NBDTLS", "Config.NBDTLSCertificates"},
	} {
		_, err := Start(context.Background(), tc.cfg)
		var ce *ConfigError
		if assert.ErrorAs(t, err, &ce, "%+v", tc.cfg) {
			assert.Equal(t, tc.field, ce.Field)
			assert.ErrorContains(t, err, tc.issue)
		}
	}
}

// TestPacketMirrorNeedsOneAddress: a server on every address cannot be
// watched on one interface.
func TestPacketMirrorNeedsOneAddress(t *testing.T) {
	ctx := context.Background()
	node, err := StartMemnode(ctx, MemnodeConfig{})
	require.NoError(t, err)
	defer node.Close()
	_, err = Start(ctx, Config{Memnode: node.Addr, Volumes: []VolumeSpec{{"disk0", 1 << 20}}, DPU: EmbeddedAgent,
		Mirror: MirrorPacket, PageListen: "0.0.0.0:0"})
	assert.ErrorContains(t, err, "needs the server on one IPv4 address")
}

// TestVolumeLease: two hosts cannot serve one volume; the second gets it
// once the first has stopped, without waiting for the lease to run out.
func TestVolumeLease(t *testing.T) {
	ctx := context.Background()
	node, err := StartMemnode(ctx, MemnodeConfig{})
	require.NoError(t, err)
	defer node.Close()
	cfg := Config{Memnode: node.Addr, Volumes: []VolumeSpec{{"disk0", 1 << 20}}, CacheBytes: 16 * 4096, VolumeLease: 2 * time.Second}
	a, err := Start(ctx, cfg)
	require.NoError(t, err)
	_, err = Start(ctx, cfg)
	require.ErrorIs(t, err, pageid.ErrHeld)
	assert.ErrorContains(t, err, `volume "disk0" is served by another host`)

	other := cfg
	other.Volumes = []VolumeSpec{{"disk1", 1 << 20}}
	b, err := Start(ctx, other)
	require.NoError(t, err, "another volume is another lease")
	require.NoError(t, b.Close(ctx))

	require.NoError(t, a.Close(ctx))
	start := time.Now()
	c, err := Start(ctx, cfg)
	require.NoError(t, err)
	assert.Less(t, time.Since(start), 1500*time.Millisecond, "a released lease is free at once")
	require.NoError(t, c.Close(ctx))
}

// TestVolumeLeaseLostFences: a host whose volume lease another host took
// (as after a partition longer than the lease) stops serving the volume
// and does not write its dirty pages over the new owner's data.
func TestVolumeLeaseLostFences(t *testing.T) {
	ctx := context.Background()
	node, err := StartMemnode(ctx, MemnodeConfig{})
	require.NoError(t, err)
	defer node.Close()
	h, err := Start(ctx, Config{Memnode: node.Addr, Volumes: []VolumeSpec{{"disk0", 1 << 20}},
		CacheBytes: 16 * 4096, VolumeLease: 900 * time.Millisecond})
	require.NoError(t, err)
	v := h.Volumes[0]
	page := make([]byte, 4096)
	page[0] = 7
	require.NoError(t, h.Store.WriteRange(ctx, v.ID, 0, page)) // dirty, not written back

	// Another host takes the lease word over.
	lv, err := h.Client.Open(ctx, leasesVolume)
	require.NoError(t, err)
	cur, err := h.Client.CompareAndSwap(ctx, lv.ID, uint64(v.ID)*8, 0, 0)
	require.NoError(t, err)
	thief := uint64(time.Now().Add(time.Hour).Unix())<<32 | 0xbeef
	_, err = h.Client.CompareAndSwap(ctx, lv.ID, uint64(v.ID)*8, cur, thief)
	require.NoError(t, err)

	require.Eventually(t, func() bool { return h.Store.Fenced(v.ID) }, 5*time.Second, 10*time.Millisecond)
	assert.ErrorIs(t, h.Store.ReadRange(ctx, v.ID, 0, make([]byte, 4096)), pageid.ErrFenced)
	assert.ErrorIs(t, h.Store.WriteRange(ctx, v.ID, 0, page), pageid.ErrFenced)
	require.NoError(t, h.Close(ctx))
	got := make([]byte, 4096)
	require.NoError(t, node.Server.Store.ReadAt(v.ID, 0, got))
	assert.Zero(t, got[0], "the fenced host wrote its dirty page back over the new owner")
	var word [8]byte
	require.NoError(t, node.Server.Store.ReadAt(lv.ID, uint64(v.ID)*8, word[:]))
	assert.Equal(t, thief, binary.LittleEndian.Uint64(word[:]), "and left the new owner's lease alone")
}

// openFDs counts this process's open file descriptors.
func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	return len(ents)
}

// A Start that fails part way leaves nothing behind: no goroutine (the
// agent, engine, write-back, lease renewal, NBD server), no listener, no
// Loading Zone mapping, no memory-node connection.
func TestStartHostUndoesWhatItStartedOnFailure(t *testing.T) {
	ctx := context.Background()
	node, err := StartMemnode(ctx, MemnodeConfig{})
	require.NoError(t, err)
	defer node.Close()
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer busy.Close()
	holder, err := Start(ctx, Config{Memnode: node.Addr, Volumes: []VolumeSpec{{"held", 1 << 20}}, CacheBytes: 16 * 4096})
	require.NoError(t, err)
	defer holder.Close(ctx)
	// Every strategy: one memory node, replicated over a cluster, local.
	access, _ := startCluster(t, 3)
	rholder, err := Start(ctx, Config{Volumes: []VolumeSpec{{"rheld", 1 << 20}}, Etcd: access, Replicas: 2, CacheBytes: 16 * 4096})
	require.NoError(t, err)
	defer rholder.Close(ctx)

	for _, tc := range []struct {
		name, want string
		cfg        Config
	}{
		{"replicated, page port in use", "address already in use",
			Config{Volumes: []VolumeSpec{{"rdisk0", 32 << 20}}, Etcd: access, Replicas: 2, DPU: EmbeddedAgent, PageListen: busy.Addr().String()}},
		{"replicated, volume held by another host", "held by another host",
			Config{Volumes: []VolumeSpec{{"rdisk1", 1 << 20}, {"rheld", 1 << 20}}, Etcd: access, Replicas: 2, DPU: EmbeddedAgent, Writeback: 10 * time.Millisecond}},
		{"local, page port in use", "address already in use",
			Config{Volumes: []VolumeSpec{{"ldisk0", 1 << 20}}, Local: true, PageListen: busy.Addr().String()}},
		{"page port in use, after the NBD server started", "address already in use",
			Config{Volumes: []VolumeSpec{{"disk0", 1 << 20}}, DPU: EmbeddedAgent, Writeback: 10 * time.Millisecond, PageListen: busy.Addr().String()}},
		{"volume served by another host", "served by another host",
			Config{Volumes: []VolumeSpec{{"disk1", 1 << 20}, {"held", 1 << 20}}, DPU: EmbeddedAgent, Writeback: 10 * time.Millisecond}},
		{"packet capture on every address", "needs the server on one IPv4 address",
			Config{Volumes: []VolumeSpec{{"disk2", 1 << 20}}, DPU: EmbeddedAgent, Mirror: MirrorPacket, PageListen: "0.0.0.0:0"}},
		{"leap prefetcher, page port in use", "address already in use",
			Config{Volumes: []VolumeSpec{{"disk3", 1 << 20}}, Prefetch: PrefetchLeap, PageListen: busy.Addr().String()}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// A free port for NBD, to check it is free again afterwards.
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			require.NoError(t, err)
			nbdAddr := ln.Addr().String()
			ln.Close()
			before := goleak.IgnoreCurrent()
			fds := openFDs(t)

			cfg := tc.cfg
			cfg.CacheBytes, cfg.NBDListen, cfg.VolumeLease = 16*4096, nbdAddr, time.Second
			if cfg.Replicas == 0 && !cfg.Local {
				cfg.Memnode = node.Addr
			}
			_, err = Start(ctx, cfg)
			require.ErrorContains(t, err, tc.want)

			goleak.VerifyNone(t, before)
			require.Eventually(t, func() bool { return openFDs(t) <= fds }, 5*time.Second, 10*time.Millisecond, "file descriptors: %d before", fds)
			ln, err = net.Listen("tcp", nbdAddr)
			require.NoError(t, err, "the NBD port is free again")
			ln.Close()
		})
	}
}

// A stop that comes before the servers' goroutines first run (a SIGTERM
// right after start) is a clean stop, not "client closed": systemd would
// otherwise record a failed service.
func TestStopRightAfterStartIsClean(t *testing.T) {
	ctx := context.Background()
	for i := 0; i < 20; i++ {
		node, err := StartMemnode(ctx, MemnodeConfig{})
		require.NoError(t, err)
		h, err := Start(ctx, Config{Memnode: node.Addr, Volumes: []VolumeSpec{{"disk0", 1 << 20}}, CacheBytes: 16 * 4096,
			PageListen: "127.0.0.1:0", NBDListen: "127.0.0.1:0"})
		require.NoError(t, err)
		require.NoError(t, h.Close(ctx), "host")
		require.NoError(t, node.Close(), "memory node")
	}
}

// TestAgentLeavesReadsToTheHost: the host reads a mirrored read's own
// pages itself (a stream straight into the reply, a small read on its
// connection's reader), so the embedded agent considers none of them for
// a prefetch, large or small; it prefetches what it predicts past a
// sequential run of reads (docs/decisions.md, 8 and 31).
func TestAgentLeavesReadsToTheHost(t *testing.T) {
	h, _ := hostOnNewNode(t, Config{Volumes: []VolumeSpec{{"disk0", 64 << 20}}, CacheBytes: 1 << 20,
		NBDListen: "127.0.0.1:0", DPU: EmbeddedAgent, NBDStreamFrom: 64 << 10})
	nc, err := nbdclient.Dial(h.NBDAddr, "disk0")
	require.NoError(t, err)
	defer nc.Close()
	buf := make([]byte, 128<<10)
	parsed := func(n uint64) {
		t.Helper()
		require.Eventually(t, func() bool { return h.Agent.Parsed.Load() >= n }, 5*time.Second, time.Millisecond)
	}
	for i, mib := range []uint64{40, 3, 27, 11, 60, 19, 33, 7} { // far apart: no stream
		require.NoError(t, nc.Read(mib<<20, buf))
		parsed(uint64(32 * (i + 1)))
	}
	decided := func() uint64 {
		return h.Agent.Prefetches.Load() + h.Agent.Skipped.Load() + h.Agent.KernelSkipped.Load()
	}
	assert.Zero(t, decided(), "the pages of stream reads were considered for a prefetch")

	for i, off := range []uint64{50 << 20, 13 << 20, 45 << 20} { // small reads, one and two pages
		require.NoError(t, nc.Read(off, buf[:4096*(1+i%2)]))
	}
	parsed(8*32 + 4)
	assert.Zero(t, decided(), "the pages of small reads were considered for a prefetch")

	for off := uint64(0); off < 1<<20; off += 128 << 10 { // a sequential run
		require.NoError(t, nc.Read(off, buf))
	}
	require.Eventually(t, func() bool { return h.Agent.Prefetches.Load() > 0 }, 5*time.Second, time.Millisecond,
		"what the predictor expects past a sequential run is prefetched")
}

// TestNBDPredictorFollowsScansAndStepsAside: through a real NBD
// connection and the embedded agent, short runs at random places (two
// adjacent reads, then a jump: what the predictor guesses is never read)
// switch the request predictor off, and off it proposes nothing; a scan
// then brings it back, and what it prefetches for the scan is consumed.
// Counted, not timed: each phase waits for the agent to have parsed
// every read sent.
func TestNBDPredictorFollowsScansAndStepsAside(t *testing.T) {
	ctx := context.Background()
	node, err := StartMemnode(ctx, MemnodeConfig{})
	require.NoError(t, err)
	defer node.Close()
	const size = 256 << 20
	h, err := Start(ctx, Config{
		Memnode: node.Addr, Volumes: []VolumeSpec{{"disk0", size}},
		CacheBytes: 1 << 20, NBDListen: "127.0.0.1:0", DPU: EmbeddedAgent,
	})
	require.NoError(t, err)
	defer h.Close(ctx)
	c, err := nbdclient.Dial(h.NBDAddr, "disk0")
	require.NoError(t, err)
	defer c.Close()
	st, _ := h.Agent.Predictors()
	sent := uint64(0)
	read := func(off uint64, p []byte) {
		t.Helper()
		require.NoError(t, c.Read(off, p))
		sent += uint64(len(p) / pageid.Size)
	}
	parsed := func() {
		t.Helper()
		require.Eventually(t, func() bool { return h.Agent.Parsed.Load() >= sent }, 10*time.Second, time.Millisecond,
			"the agent parses every read (%d of %d)", h.Agent.Parsed.Load(), sent)
	}

	buf := make([]byte, 128<<10)
	rng := uint64(1)
	randomRun := func() { // two adjacent 8 KiB reads at a random 64 KiB boundary
		rng = rng*6364136223846793005 + 1442695040888963407
		off := (rng >> 20) % (size/(64<<10) - 1) * (64 << 10)
		read(off, buf[:8192])
		read(off+8192, buf[:8192])
	}
	for i := 0; i < 4000 && st.Off.Load() == 0; i++ {
		randomRun()
		if i%64 == 63 {
			parsed()
		}
	}
	parsed()
	require.Equal(t, uint32(1), st.Off.Load(), "random runs switch the request predictor off: useful %d, wasted %d",
		st.Useful.Load(), st.Wasted.Load())
	before := st.Predicted.Load()
	for range 200 {
		randomRun()
	}
	parsed()
	assert.Equal(t, before, st.Predicted.Load(), "off, it proposes nothing")

	// A scan, 128 KiB at a time as the kernel's readahead sends it.
	// Consumed: taken from the Loading Zone, whether the read found the
	// page there or waited for its prefetch in flight.
	taken0, placed0 := h.Zone.Hits.Load(), h.Engine.Placed.Load()
	for off := uint64(0); off < 64<<20; off += uint64(len(buf)) {
		read(off, buf)
	}
	parsed()
	assert.Zero(t, st.Off.Load(), "an accurate stream brings it back")
	placed, taken := h.Engine.Placed.Load()-placed0, h.Zone.Hits.Load()-taken0
	require.Positive(t, placed, "the scan's pages were prefetched")
	assert.GreaterOrEqual(t, float64(taken), 0.6*float64(placed), "and the scan consumed them: %d of %d placed", taken, placed)
	t.Logf("random: useful %d wasted %d switches %d; scan: %d placed, %d consumed",
		st.Useful.Load(), st.Wasted.Load(), st.Switches.Load(), placed, taken)
}
