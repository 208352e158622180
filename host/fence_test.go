package host

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pd3-go/pd3/cluster"
	"github.com/pd3-go/pd3/cluster/etcdembed"
	"github.com/pd3-go/pd3/fs"
	"github.com/pd3-go/pd3/internal/testnet"
	"github.com/pd3-go/pd3/pageid"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The partition of ARCHITECTURE's Departures, closed by fencing: a host cut
// off from the memory node past its volume lease still has a write-back in
// flight; a second host takes the volume over and writes; when the link
// comes back, the node refuses the first host's late write-back, and the
// new owner's data stands.
func TestPartitionedHostIsFencedAtTheNode(t *testing.T) {
	ctx := context.Background()
	node, err := StartMemnode(ctx, MemnodeConfig{})
	require.NoError(t, err)
	defer node.Close()
	link := testnet.NewGate(t, node.Addr) // Cut: the link goes down, nothing is reset
	const lease = time.Second
	vol := []VolumeSpec{{"disk0", 1 << 20}}
	old, err := Start(ctx, Config{Memnode: link.Addr, Volumes: vol, CacheBytes: 16 * 4096,
		VolumeLease: lease, Writeback: -1, OpTimeout: time.Minute})
	require.NoError(t, err)
	defer old.Close(ctx)
	v := old.Volumes[0]
	page := make([]byte, 4096)
	copy(page, "the old host's late write")
	require.NoError(t, old.Store.WriteRange(ctx, v.ID, 0, page))

	link.Cut()
	flushed := make(chan error, 1)
	go func() { flushed <- old.Store.Flush(ctx) }() // its WRITE waits in the cut link
	// The new host waits for the old host's lease to run out (Lease.Acquire).

	next, err := Start(ctx, Config{Memnode: node.Addr, Volumes: vol, CacheBytes: 16 * 4096, VolumeLease: lease})
	require.NoError(t, err)
	defer next.Close(ctx)
	copy(page, "the new owner's data")
	require.NoError(t, next.Store.WriteRange(ctx, v.ID, 0, page))
	require.NoError(t, next.Store.Flush(ctx))

	link.Release()
	select {
	case err := <-flushed:
		assert.ErrorIs(t, err, pageid.ErrFenced, "the late write-back is refused")
	case <-time.After(30 * time.Second):
		t.Fatal("the old host's flush never returned")
	}
	got := make([]byte, 4096)
	require.NoError(t, node.Server.Store.ReadAt(v.ID, 0, got))
	assert.Equal(t, "the new owner's data", string(got[:20]))
	require.Eventually(t, func() bool { return old.Store.Fenced(v.ID) }, 5*time.Second, 10*time.Millisecond,
		"and the old host learns it lost the volume")
}

// The same partition for a mounted filesystem held in the control plane:
// the old host, cut off from etcd and the memory node, still has a file's
// write-back in flight; a second host mounts the filesystem once the old
// hold expired, rewrites the file and syncs. When the links come back, the
// node refuses the late write-back and the late DELETE of a file the old
// mount unlinked (the new mount presented a newer token
// on every file's volume) and the old host has stopped its mount.
func TestPartitionedMountIsFencedAtTheNode(t *testing.T) {
	if err := fs.Available(); err != nil {
		t.Skip(err)
	}
	ctx := context.Background()
	etcd, err := etcdembed.Start(ctx, etcdembed.Config{Dir: t.TempDir()})
	require.NoError(t, err)
	defer etcd.Close()
	node, err := StartMemnode(ctx, MemnodeConfig{})
	require.NoError(t, err)
	defer node.Close()
	nodeLink := testnet.NewGate(t, node.Addr)
	etcdLink := testnet.NewGate(t, strings.TrimPrefix(etcd.Endpoint, "http://"))
	const lease = time.Second
	cfg := func(memnode, etcd, mount string) Config {
		return Config{Memnode: memnode, Etcd: cluster.Access{Endpoints: []string{etcd}}, Volumes: []VolumeSpec{{"disk0", 1 << 20}},
			CacheBytes: 64 * 4096, VolumeLease: lease, Writeback: -1, OpTimeout: time.Minute, Mount: mount}
	}
	dirA, dirB := t.TempDir(), t.TempDir()
	old, err := Start(ctx, cfg(nodeLink.Addr, "http://"+etcdLink.Addr, dirA))
	require.NoError(t, err)
	defer old.Close(ctx)
	file := "f"
	// Past a page, so that each file has a volume of its own (smaller
	// ones live in the metadata).
	pad := func(s string) string { return s + strings.Repeat(".", 5000) }
	write := func(path, data string, sync bool) {
		t.Helper()
		data = pad(data)
		// No O_TRUNC: a truncation reaches the node at once (a TRIM).
		f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY, 0o644)
		require.NoError(t, err)
		_, err = f.WriteString(data)
		require.NoError(t, err)
		if sync {
			require.NoError(t, f.Sync())
		}
		require.NoError(t, f.Close())
	}
	// Volumes holding a file's data (not the metadata, nor the empty
	// ones a mount makes ahead of its creates).
	dataVolumes := func() map[string]pageid.VolumeInfo {
		m := map[string]pageid.VolumeInfo{}
		for _, v := range node.Server.Store.List() {
			if strings.HasPrefix(v.Name, "fs.pd3.") && v.Name != "fs.pd3.meta" && v.Stored > 0 {
				m[v.Name] = v
			}
		}
		return m
	}
	write(filepath.Join(dirA, "doomed"), "kept by the new owner", true)
	require.NoError(t, old.FS.Sync(ctx)) // the file is in the saved tree
	require.Len(t, dataVolumes(), 1)
	var doomed string
	for name := range dataVolumes() {
		doomed = name
	}
	write(filepath.Join(dirA, file), "synced first", true)
	// Into the host cache (the kernel's is flushed on close), not synced.
	write(filepath.Join(dirA, file), "the old host's late write", false)

	nodeLink.Cut()
	etcdLink.Cut()
	flushed := make(chan error, 1)
	go func() { flushed <- old.Store.Flush(ctx) }() // its WRITE waits in the cut link
	removed := make(chan error, 1)
	go func() { removed <- os.Remove(filepath.Join(dirA, "doomed")) }() // its DELETE too

	next, err := Start(ctx, cfg(node.Addr, etcd.Endpoint, dirB)) // waits out the old hold
	require.NoError(t, err)
	defer next.Close(ctx)
	got, err := os.ReadFile(filepath.Join(dirB, file))
	require.NoError(t, err)
	assert.Equal(t, pad("synced first"), string(got), "the new mount sees what the old one synced")
	write(filepath.Join(dirB, file), "the new owner's data", true)

	nodeLink.Release()
	etcdLink.Release()
	select {
	case err := <-flushed:
		assert.ErrorIs(t, err, pageid.ErrFenced, "the late write-back is refused")
	case <-time.After(30 * time.Second):
		t.Fatal("the old host's flush never returned")
	}
	select {
	case <-removed: // refused at the node; the old mount's own view is moot
	case <-time.After(30 * time.Second):
		t.Fatal("the old host's unlink never returned")
	}
	// The unlink's DELETE goes in the background: wait until the node
	// has answered it.
	require.Eventually(t, func() bool { return old.FS.PendingDeletes() == 0 }, 30*time.Second, 10*time.Millisecond,
		"the old mount's DELETE never returned")
	// The pool of volumes made ahead may still be filling (nothing takes
	// from it here): its gauge lies between the counts before and after.
	aheadBefore := old.FS.VolumesMadeAhead()
	mfs, err := old.Registry().Gather()
	require.NoError(t, err)
	aheadAfter := old.FS.VolumesMadeAhead()
	gauges := map[string]float64{}
	for _, mf := range mfs {
		if strings.HasPrefix(mf.GetName(), "pd3_fs_") && mf.GetType() == dto.MetricType_GAUGE {
			gauges[mf.GetName()] = mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	ahead := gauges["pd3_fs_volumes_made_ahead"]
	assert.True(t, float64(aheadBefore) <= ahead && ahead <= float64(aheadAfter), "volumes made ahead: gauge %v, pool %d then %d", ahead, aheadBefore, aheadAfter)
	delete(gauges, "pd3_fs_volumes_made_ahead")
	assert.Equal(t, map[string]float64{"pd3_fs_pending_deletes": 0, "pd3_fs_readahead_windows": 0}, gauges)
	vols := dataVolumes()
	require.Contains(t, vols, doomed, "the superseded mount's DELETE freed a file the new mount kept")
	delete(vols, doomed)
	require.Len(t, vols, 1, "the file's volume")
	page := make([]byte, 4096)
	for _, data := range vols {
		require.NoError(t, node.Server.Store.ReadAt(data.ID, 0, page))
		assert.Equal(t, "the new owner's data", string(page[:20]))
	}
	got, err = os.ReadFile(filepath.Join(dirB, "doomed"))
	require.NoError(t, err)
	assert.Equal(t, pad("kept by the new owner"), string(got))
	require.Eventually(t, old.FS.Fenced, 10*time.Second, 10*time.Millisecond, "the old host stopped its mount")
	err = os.WriteFile(filepath.Join(dirA, "g"), []byte("x"), 0o644)
	assert.ErrorIs(t, err, syscall.EROFS, "and refuses changes")
}
