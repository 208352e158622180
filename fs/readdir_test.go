package fs_test

import (
	"encoding/binary"
	"fmt"
	"os"
	"slices"
	"syscall"
	"testing"

	"github.com/pd3-go/pd3/fs"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// dirents lists dir with getdents64 as ls -a does, "." and ".." included,
// name → inode number.
func dirents(t *testing.T, dir string) map[string]uint64 {
	t.Helper()
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	require.NoError(t, err)
	defer unix.Close(fd)
	out := map[string]uint64{}
	buf := make([]byte, 8192)
	for {
		n, err := unix.Getdents(fd, buf)
		require.NoError(t, err)
		if n == 0 {
			return out
		}
		// struct linux_dirent64: ino u64, off s64, reclen u16, type u8, name.
		for b := buf[:n]; len(b) > 0; {
			reclen := binary.NativeEndian.Uint16(b[16:])
			name := b[19:reclen]
			out[string(name[:slices.Index(name, 0)])] = binary.NativeEndian.Uint64(b)
			b = b[reclen:]
		}
	}
}

func names(m map[string]uint64) []string {
	var s []string
	for n := range m {
		if n != "." && n != ".." {
			s = append(s, n)
		}
	}
	slices.Sort(s)
	return s
}

// TestListingsFollowEveryChange: the kernel keeps directory listings
// between opens (OpendirHandle), so a listing read after each kind of
// change must show it — the directory's own entries, and the ".." of a
// directory moved to another parent, which no entry of the directory
// changes.
func TestListingsFollowEveryChange(t *testing.T) {
	e := mount(t, startNode(t, 0), "", 0)
	d := e.path("d")
	require.NoError(t, os.MkdirAll(d, 0o755))
	require.NoError(t, os.MkdirAll(e.path("other"), 0o755))
	list := func() []string { return names(dirents(t, d)) }

	steps := []struct {
		name string
		op   func() error
		want []string
	}{
		{"create", func() error { return os.WriteFile(d+"/a", []byte("a"), 0o644) }, []string{"a"}},
		{"mkdir", func() error { return os.Mkdir(d+"/sub", 0o755) }, []string{"a", "sub"}},
		{"symlink", func() error { return os.Symlink("a", d+"/s") }, []string{"a", "s", "sub"}},
		{"link", func() error { return os.Link(d+"/a", d+"/h") }, []string{"a", "h", "s", "sub"}},
		{"unlink", func() error { return os.Remove(d + "/h") }, []string{"a", "s", "sub"}},
		{"rename within", func() error { return os.Rename(d+"/a", d+"/b") }, []string{"b", "s", "sub"}},
		{"rename in", func() error {
			if err := os.WriteFile(e.path("other/x"), nil, 0o644); err != nil {
				return err
			}
			return os.Rename(e.path("other/x"), d+"/x")
		}, []string{"b", "s", "sub", "x"}},
		{"rename out", func() error { return os.Rename(d+"/x", e.path("other/x")) }, []string{"b", "s", "sub"}},
		{"rename over", func() error { return os.Rename(d+"/s", d+"/b") }, []string{"b", "sub"}},
		{"rmdir", func() error { return syscall.Rmdir(d + "/sub") }, []string{"b"}},
	}
	for _, s := range steps {
		list() // the listing before the change, which the kernel may keep
		require.NoError(t, s.op(), s.name)
		assert.Equal(t, s.want, list(), "after %s", s.name)
		assert.Equal(t, s.want, list(), "after %s, listed again", s.name)
	}

	// A directory moved to another parent: its ".." is the new parent.
	require.NoError(t, os.MkdirAll(d+"/m", 0o755))
	require.NoError(t, os.MkdirAll(e.path("other/n"), 0o755))
	assert.Equal(t, inode(t, d), dirents(t, d+"/m")[".."])
	require.NoError(t, os.Rename(d+"/m", e.path("other/m")))
	assert.Equal(t, inode(t, e.path("other")), dirents(t, e.path("other/m"))[".."], "moved")

	// Two directories exchanged between parents: both lists change.
	assert.Equal(t, inode(t, e.path("other")), dirents(t, e.path("other/n"))[".."])
	require.NoError(t, os.MkdirAll(d+"/k", 0o755))
	assert.Equal(t, inode(t, d), dirents(t, d+"/k")[".."])
	require.NoError(t, unix.Renameat2(unix.AT_FDCWD, d+"/k", unix.AT_FDCWD, e.path("other/n"), unix.RENAME_EXCHANGE))
	// The names stay; the directories behind them swap parents.
	assert.Equal(t, inode(t, d), dirents(t, d+"/k")[".."], "exchanged into d")
	assert.Equal(t, inode(t, e.path("other")), dirents(t, e.path("other/n"))[".."], "exchanged into other")
}

// TestListingSurvivesRemovalsWhileRead: a directory read in several
// getdents calls, with half its files removed between them (as rm -r
// does), still yields every file that stayed exactly once. Offsets are
// cookies of the names: with positions, a removal shifts the entries
// after it and the reader skips as many.
func TestListingSurvivesRemovalsWhileRead(t *testing.T) {
	e := mount(t, startNode(t, 0), "", 0)
	d := e.path("d")
	require.NoError(t, os.Mkdir(d, 0o755))
	const files = 600
	name := func(i int) string { return fmt.Sprintf("file-with-a-longish-name-%04d", i) }
	for i := range files {
		require.NoError(t, os.WriteFile(d+"/"+name(i), nil, 0o644))
	}

	for round, remove := range []func(i int) bool{
		func(i int) bool { return i%2 == 0 },          // every other file
		func(i int) bool { return i < files/2 },       // the first half by name
		func(i int) bool { return i%3 != 0 && i > 0 }, // most of them
	} {
		fd, err := unix.Open(d, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		require.NoError(t, err)
		seen := map[string]int{}
		read := func(buf []byte) int {
			n, err := unix.Getdents(fd, buf)
			require.NoError(t, err)
			for b := buf[:n]; len(b) > 0; {
				reclen := binary.NativeEndian.Uint16(b[16:])
				nm := b[19:reclen]
				seen[string(nm[:slices.Index(nm, 0)])]++
				b = b[reclen:]
			}
			return n
		}
		read(make([]byte, 2048)) // some entries, not all
		require.Less(t, len(seen), files/4, "round %d: the first read must leave most unread", round)
		var removed []string
		for i := range files {
			if _, err := os.Stat(d + "/" + name(i)); err == nil && remove(i) {
				require.NoError(t, os.Remove(d+"/"+name(i)))
				removed = append(removed, name(i))
			}
		}
		for read(make([]byte, 2048)) > 0 {
		}
		unix.Close(fd)

		left, err := os.ReadDir(d)
		require.NoError(t, err)
		for _, de := range left {
			assert.Equal(t, 1, seen[de.Name()], "round %d: %s seen %d times", round, de.Name(), seen[de.Name()])
		}
		for nm, n := range seen {
			assert.LessOrEqual(t, n, 1, "round %d: %s listed twice", round, nm)
		}
		// Put the removed files back for the next round.
		for _, nm := range removed {
			require.NoError(t, os.WriteFile(d+"/"+nm, nil, 0o644))
		}
	}
}

// TestDirectoriesOpenWithoutOpendir: after the first OPENDIR (answered
// ENOSYS) the kernel opens directories itself, so listing, walking and
// reopening directories sends no more, and listings are still right.
func TestDirectoriesOpenWithoutOpendir(t *testing.T) {
	e := mount(t, startNode(t, 0), "", 0)
	require.NoError(t, os.MkdirAll(e.path("a/b/c"), 0o755))
	require.NoError(t, os.WriteFile(e.path("a/f"), []byte("x"), 0o644))
	for range 5 {
		assert.Equal(t, []string{"b", "f"}, names(dirents(t, e.path("a"))))
		assert.Equal(t, []string{"c"}, names(dirents(t, e.path("a/b"))))
		assert.Equal(t, []string{"a", "volumes"}, names(dirents(t, e.dir)))
	}
	n, kernelOpens := fs.Opendirs(e.m)
	if !kernelOpens {
		t.Skip("this kernel does not open directories itself (FUSE_NO_OPENDIR_SUPPORT)")
	}
	assert.LessOrEqual(t, n, uint64(1), "OPENDIRs after the first")
}
