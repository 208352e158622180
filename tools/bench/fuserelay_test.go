package bench

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pd3-go/pd3/internal/nbdclient"
)

// TestFUSERelayIsItsExport: bytes written through the relay's file are
// the export's, and bytes written to the export read back through it.
func TestFUSERelayIsItsExport(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting needs root (DirectMount)")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skip("no /dev/fuse")
	}
	if _, err := exec.LookPath("nbdkit"); err != nil {
		t.Skip("nbdkit is not installed")
	}
	ctx, cancel := context.WithCancel(context.Background())
	kit, addr, err := startNbdkit(ctx, nil, "memory", "8M")
	require.NoError(t, err)
	t.Cleanup(kit.Stop)
	dir := t.TempDir()
	mounted := make(chan struct{})
	served := make(chan error, 1)
	go func() { served <- ServeFUSERelay(ctx, dir, addr, 2, func() { close(mounted) }) }()
	select {
	case <-mounted:
	case err := <-served:
		t.Fatal(err)
	case <-time.After(10 * time.Second):
		t.Fatal("not mounted")
	}
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-served)
	})

	file := filepath.Join(dir, "bench")
	st, err := os.Stat(file)
	require.NoError(t, err)
	assert.EqualValues(t, 8<<20, st.Size())

	f, err := os.OpenFile(file, os.O_RDWR, 0)
	require.NoError(t, err)
	defer f.Close()
	want := bytes.Repeat([]byte("relay!"), 1000)
	_, err = f.WriteAt(want, 12345)
	require.NoError(t, err)
	require.NoError(t, f.Sync())

	c, err := nbdclient.Dial(addr, "")
	require.NoError(t, err)
	defer c.Close()
	got := make([]byte, len(want))
	require.NoError(t, c.Read(12345, got))
	assert.Equal(t, want, got, "the export holds what the file was written")

	other := bytes.Repeat([]byte{0x5a}, 4096)
	require.NoError(t, c.Write(1<<20, other))
	got = make([]byte, len(other))
	_, err = f.ReadAt(got, 1<<20)
	require.NoError(t, err)
	assert.Equal(t, other, got, "the file reads what the export holds")
}
