package fs_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pd3-go/pd3/fs"
	"github.com/pd3-go/pd3/host"
	"github.com/pd3-go/pd3/memnode"
	"github.com/pd3-go/pd3/pageid"
	"github.com/pd3-go/pd3/pagestore"
)

// env is one mounted filesystem over a memory node that outlives it, so a
// test can unmount (or abandon) the host side and mount again.
type env struct {
	t     *testing.T
	addr  string
	dir   string
	c     *memnode.Client
	st    *pagestore.Store
	fs    *fs.FS
	m     *fs.Mounted
	nbd   []pageid.VolumeInfo
	cache int64
}

func needFUSE(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("mounting needs root here (DirectMount)")
	}
	if err := fs.Available(); err != nil {
		t.Skip(err)
	}
}

// startNode starts a memory node for the test; capacity 0 is unlimited.
func startNode(t *testing.T, capacity uint64) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	mn, err := host.StartMemnode(ctx, host.MemnodeConfig{Capacity: capacity})
	require.NoError(t, err)
	t.Cleanup(func() {
		cancel()
		mn.Close()
	})
	return mn.Addr
}

// mount connects a fresh host (client, page store) to addr and mounts the
// filesystem in dir ("" = a new temporary directory).
func mount(t *testing.T, addr, dir string, cache int64, nbdVolumes ...host.VolumeSpec) *env {
	t.Helper()
	return mountWith(t, addr, dir, cache, nil, nbdVolumes...)
}

// mountWith is mount with a last say over the filesystem's Config.
func mountWith(t *testing.T, addr, dir string, cache int64, tweak func(*fs.Config), nbdVolumes ...host.VolumeSpec) *env {
	t.Helper()
	needFUSE(t)
	ctx := context.Background()
	if dir == "" {
		dir = t.TempDir()
	}
	if cache == 0 {
		cache = 16 << 20
	}
	c, err := memnode.Dial(ctx, addr, memnode.ClientOptions{OpTimeout: 10 * time.Second})
	require.NoError(t, err)
	st, err := pagestore.New(memnode.Remote{C: c}, pagestore.Options{CacheBytes: cache})
	require.NoError(t, err)
	e := &env{t: t, addr: addr, dir: dir, c: c, st: st, cache: cache}
	for _, vs := range nbdVolumes {
		v, err := c.OpenOrCreate(ctx, vs.Name, vs.Size)
		require.NoError(t, err)
		st.AddVolume(v)
		e.nbd = append(e.nbd, v)
	}
	cfg := fs.Config{Backend: c, Store: st, Volumes: e.nbd, SyncInterval: -1, LeaseTTL: time.Second}
	if tweak != nil {
		tweak(&cfg)
	}
	e.fs, err = fs.Open(ctx, cfg)
	require.NoError(t, err)
	e.m, err = fs.Mount(e.fs, dir)
	require.NoError(t, err)
	t.Cleanup(func() { e.unmount() })
	return e
}

// unmount is a clean unmount: everything is written back.
func (e *env) unmount() {
	if e.m == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := e.m.Unmount(ctx)
	e.m = nil
	e.c.Close()
	require.NoError(e.t, err)
}

// crash takes the host away without writing anything back, as a killed
// process would: what the memory node holds is what was fsynced (and
// whatever eviction happened to write).
func (e *env) crash() {
	if e.m == nil {
		return
	}
	require.NoError(e.t, e.m.Server.Unmount())
	e.m.Server.Wait()
	e.m = nil
	e.c.Close()
}

func (e *env) path(name string) string { return e.dir + "/" + name }
