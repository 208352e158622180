package host

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd3-go/pd3/internal/testutil"
)

// StartEmbedded starts etcd and memory nodes a host can use at once, and
// Close stops them and removes etcd's temporary data; a failed start (a
// node's port in use) leaves nothing behind.
func TestStartEmbedded(t *testing.T) {
	ctx := context.Background()
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	cfg := Config{Volumes: []VolumeSpec{{"disk0", 32 << 20}}, Replicas: 2, CacheBytes: 16 * 4096, NBDListen: "127.0.0.1:0"}
	emb, err := StartEmbedded(ctx, &cfg, EmbeddedConfig{Memnodes: 3})
	require.NoError(t, err)
	require.Len(t, emb.Nodes, 3)
	require.NotNil(t, emb.Etcd)
	assert.Equal(t, []string{emb.Etcd.Endpoint}, cfg.Etcd.Endpoints)
	h, err := Start(ctx, cfg)
	require.NoError(t, err)
	require.NoError(t, h.Close(ctx))
	require.NoError(t, emb.Close())
	left, _ := filepath.Glob(filepath.Join(tmp, "pd3-etcd-*"))
	assert.Empty(t, left, "etcd's temporary data is removed")

	one := Config{Volumes: []VolumeSpec{{"disk0", 1 << 20}}}
	_, err = StartEmbedded(ctx, &one, EmbeddedConfig{Memnodes: 2})
	var ce *ConfigError
	if assert.ErrorAs(t, err, &ce) {
		assert.Equal(t, "Replicas", ce.Field)
	}
	busy := newNode(t)
	_, err = StartEmbedded(ctx, &one, EmbeddedConfig{MemnodeListen: busy.Addr})
	assert.ErrorContains(t, err, "address already in use")
	left, _ = filepath.Glob(filepath.Join(tmp, "pd3-etcd-*"))
	assert.Empty(t, left, "a failed start removes etcd's data too")
	assert.Empty(t, one.Memnode)
}

// A scratch directory left by a pd3 that was SIGKILLed is removed by the
// next one; a running process's stays.
func TestScratchDirSweepsTheDead(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	dead := exec.Command("true")
	require.NoError(t, dead.Run())
	stale := filepath.Join(tmp, fmt.Sprintf("pd3-etcd-%d-abc", dead.Process.Pid))
	live := filepath.Join(tmp, fmt.Sprintf("pd3-etcd-%d-abc", os.Getppid()))
	other := filepath.Join(tmp, "pd3-etcd-notapid")
	for _, d := range []string{stale, live, other} {
		require.NoError(t, os.Mkdir(d, 0o700))
	}
	var logged testutil.SyncBuffer
	dir, err := scratchDir("pd3-etcd-", slog.New(slog.NewTextHandler(&logged, nil)))
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(filepath.Base(dir), fmt.Sprintf("pd3-etcd-%d-", os.Getpid())))
	assert.NoDirExists(t, stale)
	assert.DirExists(t, live)
	assert.DirExists(t, other)
	assert.Contains(t, logged.String(), "did not stop cleanly")
}
