package fs_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"

	"github.com/pd3-go/pd3/internal/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// statTree is everything a mount shows of dir that the metadata keeps:
// per path its inode number, type and mode, link count, size, xattrs,
// and its bytes (a hash) or symlink target.
func statTree(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	require.NoError(t, filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		require.NoError(t, err)
		rel := strings.TrimPrefix(p, dir)
		if rel == "/volumes" {
			return filepath.SkipDir
		}
		st := fi.Sys().(*syscall.Stat_t)
		s := fmt.Sprintf("ino %d mode %o nlink %d size %d", st.Ino, st.Mode, st.Nlink, st.Size)
		buf := make([]byte, 4096)
		n, err := unix.Llistxattr(p, buf)
		require.NoError(t, err)
		names := strings.Split(strings.TrimRight(string(buf[:n]), "\x00"), "\x00")
		sort.Strings(names)
		for _, name := range names {
			if name == "" {
				continue
			}
			v := make([]byte, 256)
			m, err := unix.Lgetxattr(p, name, v)
			require.NoError(t, err)
			s += fmt.Sprintf(" %s=%q", name, v[:m])
		}
		switch {
		case fi.Mode()&os.ModeSymlink != 0:
			target, err := os.Readlink(p)
			require.NoError(t, err)
			s += " -> " + target
		case fi.Mode().IsRegular():
			b, err := os.ReadFile(p)
			require.NoError(t, err)
			s += fmt.Sprintf(" %x", sha256.Sum256(b))
		}
		out[rel] = s
		return nil
	}))
	return out
}

// churn makes ops random changes of every kind the metadata records
// under dir, and fsyncs a file or directory now and then (a journal
// record each). Without data, files are made empty and never written, so
// that no file's fsync is needed: with the writeback cache, the kernel
// sends a file's times (SETATTR) when it fsyncs it, which would record
// that inode whatever else forgot to.
func churn(t *testing.T, rng *rand.Rand, dir string, ops int, data bool) {
	t.Helper()
	var dirs, files []string
	dirs = append(dirs, dir)
	pick := func(s []string) string { return s[rng.IntN(len(s))] }
	fresh := func() string { return fmt.Sprintf("%s/n%d", pick(dirs), rng.Uint32()) }
	bytesOf := func(n int) []byte {
		b := make([]byte, n)
		for i := range b {
			b[i] = byte(rng.Uint32())
		}
		return b
	}
	// Names go stale (a move onto a name, a removal of one of two
	// names a list holds): those calls may find nothing.
	ok := func(err error) {
		if !errors.Is(err, os.ErrNotExist) {
			require.NoError(t, err)
		}
	}
	for range ops {
		switch op := rng.IntN(12); {
		case op == 0 || len(files) == 0:
			p := fresh()
			if rng.IntN(3) == 0 {
				require.NoError(t, os.Mkdir(p, 0o750))
				dirs = append(dirs, p)
			} else {
				n := 0
				if data {
					n = rng.IntN(3) * rng.IntN(9000)
				}
				require.NoError(t, os.WriteFile(p, bytesOf(n), 0o640))
				files = append(files, p)
			}
		case op == 1:
			p := fresh()
			require.NoError(t, os.Symlink(fmt.Sprintf("target-%d", rng.IntN(100)), p))
		case op == 2:
			p := fresh()
			if err := os.Link(pick(files), p); err == nil {
				files = append(files, p)
			}
		case op == 3:
			i := rng.IntN(len(files))
			os.Remove(files[i])
			files = append(files[:i], files[i+1:]...)
		case op == 4:
			// A move, onto an existing file now and then.
			i := rng.IntN(len(files))
			to := fresh()
			if rng.IntN(2) == 0 {
				to = pick(files)
			}
			if os.Rename(files[i], to) == nil {
				files[i] = to
			}
		case op == 5 && len(dirs) > 1:
			// A directory moves (not below itself); an empty one may go.
			i := 1 + rng.IntN(len(dirs)-1)
			if rng.IntN(2) == 0 {
				if os.Remove(dirs[i]) == nil {
					dirs = append(dirs[:i], dirs[i+1:]...)
				}
				continue
			}
			to := fresh()
			if os.Rename(dirs[i], to) == nil {
				old := dirs[i]
				for j, d := range dirs {
					if d == old || strings.HasPrefix(d, old+"/") {
						dirs[j] = to + strings.TrimPrefix(d, old)
					}
				}
				for j, f := range files {
					if strings.HasPrefix(f, old+"/") {
						files[j] = to + strings.TrimPrefix(f, old)
					}
				}
			}
		case op == 6:
			// An exchange: of two files, or of a file or directory with
			// a directory (whose parent changes, and the kernel sends no
			// times for it).
			a, b := rng.IntN(len(files)), rng.IntN(len(files))
			if rng.IntN(2) == 0 || len(dirs) < 3 {
				if unix.Renameat2(unix.AT_FDCWD, files[a], unix.AT_FDCWD, files[b], unix.RENAME_EXCHANGE) == nil {
					files[a], files[b] = files[b], files[a]
				}
				continue
			}
			// Directories keep their names in the lists: only leaves,
			// so that no listed path runs through one that moved.
			x, y := 1+rng.IntN(len(dirs)-1), 1+rng.IntN(len(dirs)-1)
			if leaf(dirs, x) && leaf(dirs, y) && unix.Renameat2(unix.AT_FDCWD, dirs[x], unix.AT_FDCWD, dirs[y], unix.RENAME_EXCHANGE) == nil {
				for j, f := range files {
					if strings.HasPrefix(f, dirs[x]+"/") {
						files[j] = dirs[y] + strings.TrimPrefix(f, dirs[x])
					} else if strings.HasPrefix(f, dirs[y]+"/") {
						files[j] = dirs[x] + strings.TrimPrefix(f, dirs[y])
					}
				}
			}
		case op == 7 && data:
			ok(os.Truncate(pick(files), int64(rng.IntN(20000))))
		case op == 8:
			ok(os.Chmod(pick(files), os.FileMode(0o600|rng.IntN(0o100))))
		case op == 9:
			p := pick(files)
			if rng.IntN(3) == 0 {
				unix.Removexattr(p, "user.a")
			} else {
				ok(unix.Setxattr(p, fmt.Sprintf("user.%c", 'a'+rng.IntN(2)), bytesOf(rng.IntN(20)), 0))
			}
		case op == 10 && data:
			f, err := os.OpenFile(pick(files), os.O_WRONLY, 0)
			if ok(err); err != nil {
				continue
			}
			_, err = f.WriteAt(bytesOf(1+rng.IntN(6000)), int64(rng.IntN(30000)))
			require.NoError(t, err)
			require.NoError(t, f.Close())
		case op == 11:
			p := pick(dirs)
			if data && rng.IntN(2) == 0 {
				p = pick(files)
			}
			f, err := os.Open(p)
			if ok(err); err != nil {
				continue
			}
			require.NoError(t, f.Sync())
			require.NoError(t, f.Close())
		}
	}
}

// leaf reports whether no other listed directory lies below dirs[i].
func leaf(dirs []string, i int) bool {
	for _, d := range dirs {
		if strings.HasPrefix(d, dirs[i]+"/") {
			return false
		}
	}
	return true
}

// syncAll fsyncs every file under dir (its bytes), then dir (the
// metadata).
func syncAll(t *testing.T, dir string) {
	t.Helper()
	require.NoError(t, filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		require.NoError(t, err)
		if fi.IsDir() && strings.HasSuffix(p, "/volumes") {
			return filepath.SkipDir
		}
		if fi.Mode().IsRegular() {
			f, err := os.Open(p)
			require.NoError(t, err)
			require.NoError(t, f.Sync())
			require.NoError(t, f.Close())
		}
		return nil
	}))
	syncDir(t, dir)
}

// syncDir fsyncs dir: the metadata only.
func syncDir(t *testing.T, dir string) {
	t.Helper()
	f, err := os.Open(dir)
	require.NoError(t, err)
	require.NoError(t, f.Sync())
	require.NoError(t, f.Close())
}

// TestJournalKeepsEveryChange: random changes of every kind, recorded by
// fsyncs as journal records on top of a snapshot, survive a crash, a
// clean remount (which goes on appending to the same journal) and a
// compaction: the tree is the same, down to inode numbers, modes, link
// counts and xattrs. Each round ends with changes to metadata alone and
// a directory's fsync.
func TestJournalKeepsEveryChange(t *testing.T) {
	addr := startNode(t, 0)
	rng := rand.New(rand.NewPCG(testutil.Seed(t), 2))
	e := mount(t, addr, "", 4<<20)
	dir := e.dir

	churn(t, rng, dir, 400, true)
	syncAll(t, dir)
	churn(t, rng, dir, 200, false)
	syncDir(t, dir)
	want := statTree(t, dir)
	e.crash()
	e = mount(t, addr, dir, 4<<20)
	require.Equal(t, want, statTree(t, dir), "after a crash")

	churn(t, rng, dir, 300, true)
	want = statTree(t, dir)
	e.unmount()
	e = mount(t, addr, dir, 4<<20)
	require.Equal(t, want, statTree(t, dir), "after a clean remount")

	churn(t, rng, dir, 200, true)
	syncAll(t, dir)
	require.NoError(t, e.fs.Compact(context.Background()))
	churn(t, rng, dir, 200, false)
	syncDir(t, dir)
	want = statTree(t, dir)
	e.crash()
	e = mount(t, addr, dir, 4<<20)
	assert.Equal(t, want, statTree(t, dir), "after a compaction and a crash")
}

// TestJournalRecordsEachChange: one change of each kind, each in
// directories of its own, made after everything was fsynced and
// recorded only by a directory's fsync, survives a crash. The random
// test above cannot tell when a change forgets to record an inode if a
// later change (or the kernel's SETATTR of a file's times) records it
// anyway; here nothing else touches those directories.
func TestJournalRecordsEachChange(t *testing.T) {
	addr := startNode(t, 0)
	e := mount(t, addr, "", 4<<20)
	dir := e.dir
	p := e.path
	for _, d := range []string{"link/to", "unlink", "move/to", "over", "mvdir/from/d", "mvdir/to",
		"xdirs/a/y", "xdirs/b/n", "xmixed/a/f", "xmixed/b/z", "rmdir/gone", "mkdir", "symlink", "create", "attrs", "open"} {
		require.NoError(t, os.MkdirAll(p(d), 0o755))
	}
	for _, f := range []string{"link/f", "unlink/f", "move/f", "over/f", "over/victim", "xmixed/a/f/g",
		"attrs/chmod", "attrs/xattr", "attrs/noxattr", "attrs/trunc", "open/f"} {
		require.NoError(t, os.WriteFile(p(f), []byte("some bytes of "+f), 0o644))
	}
	require.NoError(t, os.Remove(p("xmixed/a/f/g")))
	require.NoError(t, os.Remove(p("xmixed/a/f")))
	require.NoError(t, os.WriteFile(p("xmixed/a/f"), []byte("a file"), 0o644))
	require.NoError(t, unix.Setxattr(p("attrs/noxattr"), "user.k", []byte("v"), 0))
	syncAll(t, dir)

	open, err := os.Open(p("open/f"))
	require.NoError(t, err)
	defer open.Close()
	require.NoError(t, os.Link(p("link/f"), p("link/to/linked")))
	require.NoError(t, os.Remove(p("unlink/f")))
	require.NoError(t, os.Rename(p("move/f"), p("move/to/moved")))
	require.NoError(t, os.Rename(p("over/f"), p("over/victim")))
	require.NoError(t, os.Rename(p("mvdir/from/d"), p("mvdir/to/d")))
	require.NoError(t, unix.Renameat2(unix.AT_FDCWD, p("xdirs/a/y"), unix.AT_FDCWD, p("xdirs/b/n"), unix.RENAME_EXCHANGE))
	require.NoError(t, unix.Renameat2(unix.AT_FDCWD, p("xmixed/a/f"), unix.AT_FDCWD, p("xmixed/b/z"), unix.RENAME_EXCHANGE))
	require.NoError(t, os.Remove(p("rmdir/gone")))
	require.NoError(t, os.Mkdir(p("mkdir/new"), 0o700))
	require.NoError(t, os.Symlink("somewhere", p("symlink/new")))
	require.NoError(t, os.WriteFile(p("create/new"), nil, 0o600))
	require.NoError(t, os.Chmod(p("attrs/chmod"), 0o601))
	require.NoError(t, unix.Setxattr(p("attrs/xattr"), "user.k", []byte("value"), 0))
	require.NoError(t, unix.Removexattr(p("attrs/noxattr"), "user.k"))
	require.NoError(t, os.Truncate(p("attrs/trunc"), 4))
	require.NoError(t, os.Remove(p("open/f")))
	syncDir(t, dir)
	want := statTree(t, dir)
	open.Close()
	e.crash()

	e = mount(t, addr, dir, 4<<20)
	assert.Equal(t, want, statTree(t, dir))
}
