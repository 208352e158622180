package fs_test

import (
	"bytes"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/pd3-go/pd3/fs"
	"github.com/pd3-go/pd3/pageid"
)

// TestErrno: each failure through the real mount gives the errno a local
// filesystem gives. Renames onto directories use syscall.Rename: os.Rename
// answers EEXIST itself without asking the filesystem.
func TestErrno(t *testing.T) {
	e := mount(t, startNode(t, 0), "", 0)
	d := e.dir
	require.NoError(t, os.MkdirAll(d+"/a/b/c", 0o755))
	require.NoError(t, os.WriteFile(d+"/a/f", []byte("x"), 0o644))
	require.NoError(t, os.WriteFile(d+"/g", []byte("y"), 0o644))
	require.NoError(t, os.Mkdir(d+"/empty", 0o755))
	require.NoError(t, os.Mkdir(d+"/full", 0o755))
	require.NoError(t, os.WriteFile(d+"/full/x", nil, 0o644))

	cases := []struct {
		name string
		op   func() error
		want syscall.Errno
	}{
		{"open missing", func() error { _, err := os.Open(d + "/nope"); return err }, syscall.ENOENT},
		{"mkdir existing", func() error { return os.Mkdir(d+"/a", 0o755) }, syscall.EEXIST},
		{"create O_EXCL existing", func() error {
			_, err := os.OpenFile(d+"/g", os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
			return err
		}, syscall.EEXIST},
		{"rmdir non-empty", func() error { return syscall.Rmdir(d + "/a") }, syscall.ENOTEMPTY},
		{"rmdir file", func() error { return syscall.Rmdir(d + "/g") }, syscall.ENOTDIR},
		{"unlink dir", func() error { return syscall.Unlink(d + "/empty") }, syscall.EISDIR},
		{"name too long", func() error { return os.WriteFile(d+"/"+strings.Repeat("n", 256), nil, 0o644) }, syscall.ENAMETOOLONG},
		{"path through a file", func() error { _, err := os.Stat(d + "/g/x"); return err }, syscall.ENOTDIR},
		{"rename dir into itself", func() error { return os.Rename(d+"/a", d+"/a/b/c/a") }, syscall.EINVAL},
		{"rename NOREPLACE onto existing", func() error {
			return unix.Renameat2(unix.AT_FDCWD, d+"/g", unix.AT_FDCWD, d+"/a/f", unix.RENAME_NOREPLACE)
		}, syscall.EEXIST},
		{"rename file onto dir", func() error { return syscall.Rename(d+"/g", d+"/empty") }, syscall.EISDIR},
		{"rename dir onto file", func() error { return os.Rename(d+"/empty", d+"/g") }, syscall.ENOTDIR},
		{"rename dir onto non-empty dir", func() error { return syscall.Rename(d+"/empty", d+"/full") }, syscall.ENOTEMPTY},
		{"rename missing", func() error { return os.Rename(d+"/nope", d+"/nope2") }, syscall.ENOENT},
		{"link to dir", func() error { return os.Link(d+"/a", d+"/alink") }, syscall.EPERM},
		{"link onto existing", func() error { return os.Link(d+"/g", d+"/a/f") }, syscall.EEXIST},
		{"readlink of a file", func() error { _, err := os.Readlink(d + "/g"); return err }, syscall.EINVAL},
		{"open dir for writing", func() error { _, err := os.OpenFile(d+"/a", os.O_WRONLY, 0); return err }, syscall.EISDIR},
		{"getxattr missing", func() error {
			_, err := unix.Getxattr(d+"/g", "user.nope", make([]byte, 16))
			return err
		}, syscall.ENODATA},
		{"setxattr XATTR_CREATE twice", func() error {
			if err := unix.Setxattr(d+"/g", "user.once", []byte("1"), unix.XATTR_CREATE); err != nil {
				return err
			}
			return unix.Setxattr(d+"/g", "user.once", []byte("2"), unix.XATTR_CREATE)
		}, syscall.EEXIST},
		{"truncate past the maximum size", func() error { return os.Truncate(d+"/g", fs.MaxFileSize+1) }, syscall.EFBIG},
		{"fallocate collapse range", func() error {
			f, err := os.OpenFile(d+"/g", os.O_RDWR, 0)
			if err != nil {
				return err
			}
			defer f.Close()
			return unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_COLLAPSE_RANGE, 0, 4096)
		}, syscall.EOPNOTSUPP},
		{"rmdir volumes", func() error { return syscall.Rmdir(d + "/volumes") }, syscall.EBUSY},
		{"mkdir volumes", func() error { return os.Mkdir(d+"/volumes", 0o755) }, syscall.EEXIST},
		{"create in volumes", func() error { return os.WriteFile(d+"/volumes/new", nil, 0o644) }, syscall.EPERM},
		{"rename into volumes", func() error { return os.Rename(d+"/g", d+"/volumes/g") }, syscall.EXDEV},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.op()
			require.Error(t, err)
			assert.ErrorIs(t, err, tc.want, "%v", err)
		})
	}
}

// TestSemantics: the successful behaviours programs rely on.
func TestSemantics(t *testing.T) {
	e := mount(t, startNode(t, 0), "", 0)
	d := e.dir
	read := func(p string) string {
		t.Helper()
		b, err := os.ReadFile(p)
		require.NoError(t, err)
		return string(b)
	}

	t.Run("rename replaces atomically", func(t *testing.T) {
		require.NoError(t, os.WriteFile(d+"/new", []byte("new"), 0o644))
		require.NoError(t, os.WriteFile(d+"/old", []byte("old contents"), 0o644))
		f, err := os.Open(d + "/old") // the replaced file stays readable while open
		require.NoError(t, err)
		require.NoError(t, os.Rename(d+"/new", d+"/old"))
		assert.Equal(t, "new", read(d+"/old"))
		_, err = os.Stat(d + "/new")
		assert.ErrorIs(t, err, os.ErrNotExist)
		b := make([]byte, 64)
		n, err := f.ReadAt(b, 0)
		assert.Equal(t, "old contents", string(b[:n]))
		require.NoError(t, f.Close())
	})
	t.Run("rename exchange", func(t *testing.T) {
		require.NoError(t, os.WriteFile(d+"/x1", []byte("one"), 0o644))
		require.NoError(t, os.Mkdir(d+"/x2", 0o755))
		require.NoError(t, unix.Renameat2(unix.AT_FDCWD, d+"/x1", unix.AT_FDCWD, d+"/x2", unix.RENAME_EXCHANGE))
		assert.Equal(t, "one", read(d+"/x2"))
		fi, err := os.Stat(d + "/x1")
		require.NoError(t, err)
		assert.True(t, fi.IsDir())
	})
	t.Run("rename a directory across parents", func(t *testing.T) {
		require.NoError(t, os.MkdirAll(d+"/p1/sub", 0o755))
		require.NoError(t, os.WriteFile(d+"/p1/sub/f", []byte("deep"), 0o644))
		require.NoError(t, os.Mkdir(d+"/p2", 0o755))
		require.NoError(t, os.Rename(d+"/p1/sub", d+"/p2/sub"))
		assert.Equal(t, "deep", read(d+"/p2/sub/f"))
		assert.Equal(t, uint64(2), nlink(t, d+"/p1"))
		assert.Equal(t, uint64(3), nlink(t, d+"/p2"))
	})
	t.Run("hard link", func(t *testing.T) {
		require.NoError(t, os.WriteFile(d+"/h1", []byte("shared"), 0o644))
		require.NoError(t, os.Link(d+"/h1", d+"/h2"))
		assert.Equal(t, uint64(2), nlink(t, d+"/h1"))
		require.NoError(t, os.WriteFile(d+"/h2", []byte("SHARED"), 0o644))
		assert.Equal(t, "SHARED", read(d+"/h1"))
		require.NoError(t, os.Remove(d+"/h1"))
		assert.Equal(t, "SHARED", read(d+"/h2"))
		assert.Equal(t, uint64(1), nlink(t, d+"/h2"))
	})
	t.Run("symlink", func(t *testing.T) {
		require.NoError(t, os.Symlink("h2", d+"/sl"))
		target, err := os.Readlink(d + "/sl")
		require.NoError(t, err)
		assert.Equal(t, "h2", target)
		assert.Equal(t, "SHARED", read(d+"/sl"))
	})
	t.Run("truncate keeps zeroes past the end", func(t *testing.T) {
		p := d + "/tr"
		require.NoError(t, os.WriteFile(p, bytes.Repeat([]byte{0xEE}, 10000), 0o644))
		require.NoError(t, os.Truncate(p, 5000))
		require.NoError(t, os.Truncate(p, 12000))
		b := []byte(read(p))
		require.Len(t, b, 12000)
		assert.Equal(t, bytes.Repeat([]byte{0xEE}, 5000), b[:5000])
		assert.Equal(t, make([]byte, 7000), b[5000:])
	})
	t.Run("sparse terabyte file", func(t *testing.T) {
		f, err := os.Create(d + "/sparse")
		require.NoError(t, err)
		defer f.Close()
		_, err = f.WriteAt([]byte("far"), 2<<40)
		require.NoError(t, err)
		fi, err := f.Stat()
		require.NoError(t, err)
		assert.Equal(t, int64(2<<40+3), fi.Size())
		b := make([]byte, 3)
		_, err = f.ReadAt(b, 1<<40)
		require.NoError(t, err)
		assert.Equal(t, make([]byte, 3), b)
		_, err = f.ReadAt(b, 2<<40)
		require.NoError(t, err)
		assert.Equal(t, "far", string(b))
	})
	t.Run("fallocate punch hole and zero range", func(t *testing.T) {
		p := d + "/fa"
		require.NoError(t, os.WriteFile(p, bytes.Repeat([]byte{1}, 5*4096), 0o644))
		f, err := os.OpenFile(p, os.O_RDWR, 0)
		require.NoError(t, err)
		require.NoError(t, unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, 4096, 2*4096))
		require.NoError(t, unix.Fallocate(int(f.Fd()), unix.FALLOC_FL_ZERO_RANGE, 4*4096+100, 4096))
		require.NoError(t, unix.Fallocate(int(f.Fd()), 0, 0, 8*4096))
		require.NoError(t, f.Close())
		b := []byte(read(p))
		require.Len(t, b, 8*4096)
		assert.Equal(t, bytes.Repeat([]byte{1}, 4096), b[:4096])
		assert.Equal(t, make([]byte, 2*4096), b[4096:3*4096])
		assert.Equal(t, bytes.Repeat([]byte{1}, 4096+100), b[3*4096:4*4096+100])
		assert.Equal(t, make([]byte, len(b)-(4*4096+100)), b[4*4096+100:])
	})
	t.Run("attributes", func(t *testing.T) {
		p := d + "/attr"
		require.NoError(t, os.WriteFile(p, nil, 0o600))
		require.NoError(t, os.Chmod(p, 0o640))
		require.NoError(t, os.Chown(p, 1234, 5678))
		mt := int64(1_700_000_000)
		require.NoError(t, syscall.Utime(p, &syscall.Utimbuf{Actime: mt, Modtime: mt}))
		var st syscall.Stat_t
		require.NoError(t, syscall.Stat(p, &st))
		assert.Equal(t, uint32(syscall.S_IFREG|0o640), st.Mode)
		assert.Equal(t, uint32(1234), st.Uid)
		assert.Equal(t, uint32(5678), st.Gid)
		assert.Equal(t, mt, st.Mtim.Sec)
		require.NoError(t, unix.Setxattr(p, "user.k", []byte("v"), 0))
		buf := make([]byte, 16)
		n, err := unix.Getxattr(p, "user.k", buf)
		require.NoError(t, err)
		assert.Equal(t, "v", string(buf[:n]))
		n, err = unix.Listxattr(p, buf)
		require.NoError(t, err)
		assert.Equal(t, "user.k\x00", string(buf[:n]))
		require.NoError(t, unix.Removexattr(p, "user.k"))
	})
	t.Run("readdir and statfs", func(t *testing.T) {
		require.NoError(t, os.Mkdir(d+"/ls", 0o755))
		for _, n := range []string{"b", "a", "c"} {
			require.NoError(t, os.WriteFile(d+"/ls/"+n, nil, 0o644))
		}
		ents, err := os.ReadDir(d + "/ls")
		require.NoError(t, err)
		var names []string
		for _, de := range ents {
			names = append(names, de.Name())
		}
		assert.Equal(t, []string{"a", "b", "c"}, names)
		root, err := os.ReadDir(d)
		require.NoError(t, err)
		dirs := 0
		for _, de := range root {
			if de.IsDir() {
				dirs++
			}
		}
		assert.Equal(t, uint64(2+dirs), nlink(t, d), "root nlink counts volumes/ too")
		var sf unix.Statfs_t
		require.NoError(t, unix.Statfs(d, &sf))
		assert.Equal(t, int64(4096), sf.Bsize)
		assert.Positive(t, sf.Bavail)
	})
	t.Run("unlinked file readable until closed", func(t *testing.T) {
		p := d + "/gone"
		require.NoError(t, os.WriteFile(p, []byte("still here"), 0o644))
		f, err := os.Open(p)
		require.NoError(t, err)
		require.NoError(t, os.Remove(p))
		b := make([]byte, 32)
		n, _ := f.ReadAt(b, 0)
		assert.Equal(t, "still here", string(b[:n]))
		require.NoError(t, f.Close())
		_, err = os.Stat(p)
		assert.ErrorIs(t, err, os.ErrNotExist)
	})
}

func nlink(t *testing.T, p string) uint64 {
	t.Helper()
	var st syscall.Stat_t
	require.NoError(t, syscall.Stat(p, &st))
	return st.Nlink
}

// TestAttributesAsToolsExpect: st_blocks counts what the memory node
// stores (du of a sparse file), statfs counts stored memory (df), the root
// has real times, and readdir lists "." and "..", as ls -a expects.
func TestAttributesAsToolsExpect(t *testing.T) {
	start := time.Now()
	e := mount(t, startNode(t, 0), "", 0)
	d := e.dir
	const chunk = 1 << 20

	f, err := os.Create(d + "/sparse")
	require.NoError(t, err)
	require.NoError(t, f.Truncate(5<<30))
	data := bytes.Repeat([]byte{7}, 4<<20)
	_, err = f.WriteAt(data, 3<<30)
	require.NoError(t, err)
	require.NoError(t, f.Sync())
	var st syscall.Stat_t
	require.NoError(t, syscall.Fstat(int(f.Fd()), &st))
	require.NoError(t, f.Close())
	assert.Equal(t, int64(5<<30), st.Size)
	assert.InDelta(t, 4<<20, st.Blocks*512, chunk, "du counts the 4 MiB stored, not the 5 GiB size")
	out, err := exec.Command("du", "-B1", d+"/sparse").Output()
	require.NoError(t, err)
	used, _ := strconv.ParseInt(strings.Fields(string(out))[0], 10, 64)
	assert.InDelta(t, 4<<20, used, chunk, "du: %s", out)

	var fsst syscall.Statfs_t
	require.NoError(t, syscall.Statfs(d, &fsst))
	assert.InDelta(t, 4<<20, float64((fsst.Blocks-fsst.Bfree)*uint64(fsst.Bsize)), 2*chunk, "df counts stored memory (and the metadata)")

	require.NoError(t, syscall.Stat(d, &st))
	assert.WithinDuration(t, start, time.Unix(st.Mtim.Unix()), time.Minute, "the root has real times")
	assert.NotZero(t, st.Ctim.Sec)

	require.NoError(t, os.Mkdir(d+"/dir", 0o755))
	out, err = exec.Command("ls", "-a", d+"/dir").Output()
	require.NoError(t, err)
	assert.Equal(t, []string{".", ".."}, strings.Fields(string(out)))
	var dst, pst syscall.Stat_t
	require.NoError(t, syscall.Stat(d+"/dir/.", &dst))
	require.NoError(t, syscall.Stat(d+"/dir/..", &pst))
	require.NoError(t, syscall.Stat(d, &st))
	assert.Equal(t, st.Ino, pst.Ino, "dir/.. is the root")
}

// TestUnlinkDropsEveryCachedPage: freeing a file drops its pages from the
// host cache by looking up the pages below its size (a truncation drops
// those past the new size itself), so that a file given the recycled
// volume id never sees them.
func TestUnlinkDropsEveryCachedPage(t *testing.T) {
	e := mount(t, startNode(t, 0), "", 0)
	p := e.path("shrunk")
	require.NoError(t, os.WriteFile(p, bytes.Repeat([]byte{9}, 8*4096), 0o644))
	f, err := os.OpenFile(p, os.O_RDWR, 0)
	require.NoError(t, err)
	require.NoError(t, f.Sync()) // the kernel's dirty pages reach the host cache
	var st syscall.Stat_t
	require.NoError(t, syscall.Fstat(int(f.Fd()), &st))
	k, ok := e.fs.KeyOf(st.Ino, 0)
	require.True(t, ok)
	vol := k.Volume()
	require.True(t, e.st.Resident(pageid.MakeKey(vol, 7)), "the last page is cached")
	require.NoError(t, f.Truncate(4096))
	require.NoError(t, f.Close())
	require.NoError(t, os.Remove(p))
	// The kernel sends the file's RELEASE after close returns: the file
	// is freed when it arrives, before or after the unlink.
	require.Eventually(t, func() bool {
		for i := range uint64(8) {
			if e.st.Resident(pageid.MakeKey(vol, i)) {
				return false
			}
		}
		return true
	}, 5*time.Second, 10*time.Millisecond, "pages of the freed file are still cached")
}

// The kernel keeps entries, attributes and names that do not exist for
// 30 s: a name looked up and missing, then made, renamed, linked,
// changed and removed through the mount, is seen as it is at each step
// (the kernel updates or drops what it cached), and so after a remount.
func TestKernelCachesFollowChanges(t *testing.T) {
	addr := startNode(t, 0)
	e := mount(t, addr, "", 0)
	p := e.path
	_, err := os.Stat(p("later"))
	require.ErrorIs(t, err, os.ErrNotExist)
	require.NoError(t, os.WriteFile(p("later"), []byte("now"), 0o600))
	st, err := os.Stat(p("later"))
	require.NoError(t, err, "a name cached as missing, made")
	assert.Equal(t, int64(3), st.Size())
	require.NoError(t, os.Chmod(p("later"), 0o640))
	require.NoError(t, os.Link(p("later"), p("again")))
	st, err = os.Stat(p("again"))
	require.NoError(t, err)
	assert.Equal(t, os.FileMode(0o640), st.Mode().Perm())
	assert.Equal(t, uint64(2), st.Sys().(*syscall.Stat_t).Nlink)
	require.NoError(t, os.Rename(p("later"), p("moved")))
	_, err = os.Stat(p("later"))
	assert.ErrorIs(t, err, os.ErrNotExist)
	require.NoError(t, os.Truncate(p("moved"), 10))
	st, err = os.Stat(p("again"))
	require.NoError(t, err)
	assert.Equal(t, int64(10), st.Size(), "the other name of the file")
	require.NoError(t, os.Remove(p("again")))
	st, err = os.Stat(p("moved"))
	require.NoError(t, err)
	assert.Equal(t, uint64(1), st.Sys().(*syscall.Stat_t).Nlink)
	e.unmount()

	e = mount(t, addr, "", 0)
	_, err = os.Stat(e.path("again"))
	assert.ErrorIs(t, err, os.ErrNotExist)
	got, err := os.ReadFile(e.path("moved"))
	require.NoError(t, err)
	assert.Equal(t, append([]byte("now"), make([]byte, 7)...), got)
}
