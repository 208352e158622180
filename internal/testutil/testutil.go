// Package testutil holds helpers shared by pd3's tests.
package testutil

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pd3-go/pd3/internal/tlsfiles"
	"github.com/stretchr/testify/require"
)

// Soak returns n, the size of a randomised test's run in make test, or
// long under make test-long (PD3_SOAK=1): the long runs find the rare
// interleavings, the short ones keep make test within minutes.
func Soak(t testing.TB, n, long int) int {
	t.Helper()
	if os.Getenv("PD3_SOAK") == "1" {
		n = long
	}
	t.Logf("%d steps (make test-long: %d)", n, long)
	return n
}

// Seed returns a random seed, logged so a failure can be replayed with
// PD3_SEED=n.
func Seed(t testing.TB) uint64 {
	t.Helper()
	s := uint64(time.Now().UnixNano())
	if v := os.Getenv("PD3_SEED"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("PD3_SEED=%q: %v", v, err)
		}
		s = n
	}
	t.Logf("seed %d (PD3_SEED=%d to replay)", s, s)
	return s
}

// DropCaches empties the kernel page cache (root only). Call
// LockPageCache first.
func DropCaches(t testing.TB) {
	t.Helper()
	syscall.Sync()
	if err := os.WriteFile("/proc/sys/vm/drop_caches", []byte("1"), 0); err != nil {
		t.Fatalf("dropping caches: %v", err)
	}
}

// LockPageCache takes, until the test ends, a lock shared by every test
// that drops or inspects the kernel page cache, across test binaries:
// `go test ./...` runs packages in parallel, and a test that compares the
// page cache with what it expects must not see another drop it midway.
// Call it once per test.
func LockPageCache(t testing.TB) {
	t.Helper()
	f, err := os.OpenFile(filepath.Join(os.TempDir(), "pd3-test-pagecache.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatalf("page-cache lock: %v", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
		f.Close()
		t.Fatalf("page-cache lock: %v", err)
	}
	t.Cleanup(func() { f.Close() }) // closing releases the lock
}

// SyncBuffer is a bytes.Buffer that one goroutine (a logger, a child
// process's output) may write while a test reads it.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestCA makes a throwaway CA (tlsfiles.WriteCA) in two temporary
// directories: the server's and the client's, in nbdkit's layout.
func TestCA(t testing.TB) (serverDir, clientDir string) {
	t.Helper()
	serverDir, clientDir = t.TempDir(), t.TempDir()
	require.NoError(t, tlsfiles.WriteCA(serverDir, clientDir))
	return serverDir, clientDir
}

// SmallFiles writes files small files of 0 to 3 KB under dir/tree, in 100
// directories, the bytes a function of each file's number, and returns
// dir/tree: the shape of a source tree or a mail spool, for tests of
// filesystems that must hold many of them.
func SmallFiles(t testing.TB, dir string, files int) string {
	t.Helper()
	root := filepath.Join(dir, "tree")
	for i := range files {
		d := filepath.Join(root, "d"+strconv.Itoa(i%100))
		require.NoError(t, os.MkdirAll(d, 0o755))
		b := bytes.Repeat([]byte{byte(i % 251), byte(i / 251)}, i*37%1500)
		require.NoError(t, os.WriteFile(filepath.Join(d, "f"+strconv.Itoa(i)), b, 0o644))
	}
	return root
}

// FsyncTree fsyncs every regular file under dir, then dir.
func FsyncTree(t testing.TB, dir string) {
	t.Helper()
	require.NoError(t, filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil || !fi.Mode().IsRegular() {
			return err
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		return f.Sync()
	}))
	f, err := os.Open(dir)
	require.NoError(t, err)
	defer f.Close()
	require.NoError(t, f.Sync())
}

// SmallTmpfs mounts a tmpfs of size (mount(8)'s syntax, "3m") for the test,
// unmounted when it ends, and returns its directory and a function that
// resizes it (root only: skipped otherwise).
func SmallTmpfs(t testing.TB, size string) (string, func(size string)) {
	t.Helper()
	if os.Getuid() != 0 {
		t.Skip("needs root to mount a small tmpfs")
	}
	dir := t.TempDir()
	require.NoError(t, syscall.Mount("tmpfs", dir, "tmpfs", 0, "size="+size))
	t.Cleanup(func() { syscall.Unmount(dir, syscall.MNT_DETACH) })
	return dir, func(size string) {
		require.NoError(t, syscall.Mount("tmpfs", dir, "tmpfs", syscall.MS_REMOUNT, "size="+size))
	}
}

// LetPark gives a goroutine about to wait for input in Go's network poller
// the time to get there. Nothing reports that a goroutine parked there (a
// wait in poll(2) has a gauge: sockio.Busy.Polls), so the tests that assert
// what such a wait did not do pause here; their assertions hold whether or
// not the park came first. The one sleep they share is this one.
func LetPark() { time.Sleep(5 * time.Millisecond) }
