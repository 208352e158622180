package host

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/pd3-go/pd3/cluster"
	"github.com/pd3-go/pd3/fs"
	"github.com/pd3-go/pd3/pageid"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A FUSE mount over replicated volumes, host after host, over four
// nodes: the first host writes a tree and unmounts; one of the
// filesystem's two nodes stops; the second host reads the tree from the
// other, writes more, and copies the filesystem to another node (its
// tender, as for an extent), then moves it off the last original node
// (as pd3 node drain asks), which then holds none of it; every node not
// holding the filesystem stops; a third host reads everything from the
// copies. Only what fs.Written reports is copied, so this fails if a
// file's bytes or the metadata's newest snapshot are left out.
func TestMountOverReplicatedVolumes(t *testing.T) {
	if err := fs.Available(); err != nil {
		t.Skip(err)
	}
	ctx := context.Background()
	access, started := startCluster(t, 4)
	nodes := map[string]*Memnode{}
	for _, n := range started {
		nodes[n.ID] = n
	}
	host := func(dir string) *Host {
		t.Helper()
		h, err := Start(ctx, Config{Etcd: access, Replicas: 2, Volumes: []VolumeSpec{{"disk0", 16 << 20}},
			CacheBytes: 1 << 20, OpTimeout: 2 * time.Second, Writeback: 50 * time.Millisecond, Mount: dir}) // FSName: the default
		require.NoError(t, err)
		return h
	}
	files := map[string][]byte{}
	write := func(dir, name string, n int) {
		t.Helper()
		b := make([]byte, n)
		rand.Read(b)
		require.NoError(t, os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), b, 0o644))
		files[name] = b
	}
	check := func(dir, when string) {
		t.Helper()
		for name, want := range files {
			got, err := os.ReadFile(filepath.Join(dir, name))
			require.NoError(t, err, "%s: %s", when, name)
			require.True(t, bytes.Equal(want, got), "%s: %s differs", when, name)
		}
	}
	cli, err := cluster.Dial(ctx, access)
	require.NoError(t, err)
	defer cli.Close()
	group := func() []string {
		rec, err := cluster.GetVolume(ctx, cli, "", "fs.pd3")
		require.NoError(t, err)
		require.True(t, rec.Filesystem)
		return rec.Stripes.Extents[0]
	}

	dirA := t.TempDir()
	a := host(dirA)
	for i := range 40 {
		write(dirA, fmt.Sprintf("d%d/f%d", i%4, i), 100+i*37)
	}
	write(dirA, "big", 3<<20+123)
	require.NoError(t, a.Close(ctx))
	first := group()
	require.Len(t, first, 2)
	require.NoError(t, nodes[first[0]].Close())

	dirB := t.TempDir()
	b := host(dirB)
	check(dirB, "one node of two gone")
	write(dirB, "after/one", 5<<20+7)
	write(dirB, "d0/f0", 9000) // rewritten
	require.Eventually(t, func() bool {
		s := b.group.Stripes()
		return len(s.Extents[0]) == 2 && !slices.Contains(s.Extents[0], first[0])
	}, 30*time.Second, 100*time.Millisecond, "copied to the third node: %v", b.group.Stripes())
	assert.Positive(t, b.Replicated.Repaired.Load())
	var spare string
	for id := range nodes {
		if id != first[0] && !slices.Contains(group(), id) {
			spare = id
		}
	}
	_, err = cluster.AddMoves(ctx, cli, "", "fs.pd3", []cluster.Move{{Extent: 0, From: first[1], To: spare}})
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		s := b.group.Stripes()
		return len(s.Moves) == 0 && slices.Contains(s.Extents[0], spare) && !slices.Contains(s.Extents[0], first[1])
	}, 30*time.Second, 100*time.Millisecond, "moved off %s: %v", first[1], b.group.Stripes())
	for _, v := range nodes[first[1]].Server.Store.List() {
		assert.NotContains(t, v.Name, "fs.pd3.", "the node moved off holds none of the filesystem")
	}
	require.NoError(t, b.Close(ctx))
	for id, n := range nodes {
		if !slices.Contains(group(), id) {
			require.NoError(t, n.Close())
		}
	}

	dirC := t.TempDir()
	c := host(dirC)
	defer c.Close(ctx)
	check(dirC, "on the copy alone")
}

// TestServeThroughTheControlPlane: a host given the control plane and no
// memory node places its volume over the registered nodes (one copy of
// each extent), finds it again after a restart with what was written, and
// says how much room each node has when the volume does not fit.
func TestServeThroughTheControlPlane(t *testing.T) {
	ctx := context.Background()
	access, _ := startCluster(t, 3)
	cfg := Config{Etcd: access, Volumes: []VolumeSpec{{"disk0", 64 << 20}}, CacheBytes: 16 * 4096, OpTimeout: 2 * time.Second}
	h, err := Start(ctx, cfg)
	require.NoError(t, err)
	require.NotNil(t, h.Replicated, "placed through the control plane")
	s, ok := h.Replicated.Stripes(h.Volumes[0].ID)
	require.True(t, ok)
	assert.Equal(t, 1, s.Replicas)
	assert.Len(t, s.Extents, 4)
	page := make([]byte, pageid.Size)
	for p := range uint64(64) {
		page[0], page[1] = byte(p), 0xa5
		require.NoError(t, h.Store.Put(ctx, pageid.MakeKey(h.Volumes[0].ID, p*256), page))
	}
	require.NoError(t, h.Close(ctx))

	h, err = Start(ctx, cfg)
	require.NoError(t, err)
	defer h.Close(ctx)
	got := make([]byte, pageid.Size)
	for p := range uint64(64) {
		require.NoError(t, h.Store.Get(ctx, pageid.MakeKey(h.Volumes[0].ID, p*256), got))
		assert.Equal(t, []byte{byte(p), 0xa5}, got[:2], "page %d", p*256)
	}

	// Three nodes of 32 MiB hold no 256 MiB volume.
	small, _ := startCluster(t, 0)
	for range 3 {
		node, err := StartMemnode(ctx, MemnodeConfig{Etcd: small, Capacity: 32 << 20})
		require.NoError(t, err)
		t.Cleanup(func() { node.Close() })
	}
	_, err = Start(ctx, Config{Etcd: small, Volumes: []VolumeSpec{{"big", 256 << 20}}, CacheBytes: 16 * 4096})
	assert.ErrorIs(t, err, cluster.ErrNoNode)
	assert.ErrorContains(t, err, "32MiB of 32MiB free")
	assert.ErrorContains(t, err, "add a memory node")
}
