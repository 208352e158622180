package nbd

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// blockDevice exposes export as a real block device: nbdfuse serves it as
// a file, losetup attaches a loop device to that file. Everything is undone
// in cleanup, in reverse order, even when the test fails.
func blockDevice(t *testing.T, uri string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root for loop devices and mounts")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skip("needs /dev/fuse for nbdfuse")
	}
	need(t, "nbdfuse", "fusermount3", "losetup")
	dir := t.TempDir()
	mnt := filepath.Join(dir, "fuse")
	require.NoError(t, os.Mkdir(mnt, 0o755))
	pidfile := filepath.Join(dir, "nbdfuse.pid")
	fuse := exec.Command("nbdfuse", "-P", pidfile, mnt+"/disk", uri)
	fuse.Stderr = os.Stderr
	require.NoError(t, fuse.Start())
	exited := make(chan struct{})
	go func() { fuse.Wait(); close(exited) }()
	t.Cleanup(func() {
		exec.Command("fusermount3", "-u", mnt).Run()
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			fuse.Process.Kill()
			<-exited
		}
	})
	require.Eventually(t, func() bool {
		select {
		case <-exited:
			return true // reported below
		default:
		}
		_, err := os.Stat(pidfile)
		return err == nil
	}, 30*time.Second, 20*time.Millisecond, "nbdfuse did not become ready")
	select {
	case <-exited:
		t.Fatal("nbdfuse exited before it was ready")
	default:
	}
	out, err := exec.Command("losetup", "--find", "--show", mnt+"/disk").CombinedOutput()
	require.NoError(t, err, "%s", out)
	dev := strings.TrimSpace(string(out))
	t.Cleanup(func() {
		if out, err := exec.Command("losetup", "-d", dev).CombinedOutput(); err != nil {
			t.Logf("detaching %s: %v: %s", dev, err, out)
		}
	})
	return dev
}

// mount mounts dev on a fresh directory and unmounts it in cleanup.
func mount(t *testing.T, dev string) string {
	t.Helper()
	dir := t.TempDir()
	out, err := exec.Command("mount", dev, dir).CombinedOutput()
	require.NoError(t, err, "%s", out)
	mounted := true
	t.Cleanup(func() {
		if mounted {
			exec.Command("umount", dir).Run()
		}
	})
	return dir
}

func umount(t *testing.T, dir string) {
	t.Helper()
	out, err := exec.Command("umount", dir).CombinedOutput()
	require.NoError(t, err, "%s", out)
}

// sqliteWorkload writes, updates and deletes rows in a database in dir and
// checks its integrity.
func sqliteWorkload(t *testing.T, dir string) {
	t.Helper()
	need(t, "sqlite3")
	db := filepath.Join(dir, "test.db")
	script := `PRAGMA journal_mode=WAL;
CREATE TABLE IF NOT EXISTS t(id INTEGER PRIMARY KEY, v TEXT, n INTEGER);
WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x+1 FROM c WHERE x < 20000)
  INSERT INTO t(v, n) SELECT hex(randomblob(64)), x FROM c;
CREATE INDEX IF NOT EXISTS tn ON t(n);
UPDATE t SET v = hex(randomblob(100)) WHERE n % 3 = 0;
DELETE FROM t WHERE n % 7 = 0;
VACUUM;
PRAGMA integrity_check;
SELECT count(*) FROM t;`
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "sqlite3", db)
	cmd.Stdin = strings.NewReader(script)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	assert.Contains(t, string(out), "ok\n", "integrity_check")
	t.Logf("sqlite on %s: %s", dir, strings.Join(strings.Fields(string(out)), " "))
}

func TestFilesystemsOnNBD(t *testing.T) {
	r := newRig(t, 512<<20, 64<<20)
	dev := blockDevice(t, r.uri("disk0"))

	t.Run("ext4", func(t *testing.T) {
		need(t, "mkfs.ext4", "e2fsck")
		run(t, "mkfs.ext4", "-q", "-F", dev)
		run(t, "e2fsck", "-fn", dev)
		dir := mount(t, dev)
		sqliteWorkload(t, dir)
		umount(t, dir)
		run(t, "e2fsck", "-fn", dev) // clean after real use, not just after mkfs
		// And the database survives a remount.
		dir = mount(t, dev)
		sqliteWorkload(t, dir)
		umount(t, dir)
	})
	t.Run("xfs", func(t *testing.T) {
		need(t, "mkfs.xfs", "xfs_repair")
		run(t, "mkfs.xfs", "-q", "-f", dev)
		run(t, "xfs_repair", "-n", dev)
		dir := mount(t, dev)
		require.NoError(t, os.WriteFile(filepath.Join(dir, "hello"), []byte("pd3"), 0o644))
		sqliteWorkload(t, dir)
		umount(t, dir)
		run(t, "xfs_repair", "-n", dev)
	})
}
