package fs_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/pd3-go/pd3/internal/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fileVolumes counts the file volumes at the memory node (the metadata
// and volumes made ahead not counted).
func fileVolumes(t *testing.T, e *env) int {
	t.Helper()
	vols, err := e.c.List(context.Background())
	require.NoError(t, err)
	n := 0
	for _, v := range vols {
		if v.Name != "fs.pd3.meta" && v.Stored > 0 {
			n++
		}
	}
	return n
}

// TestSmallFilesLiveInTheInode: a file of a page or less takes no volume
// (nor the node's memory); written past a page it moves to a volume with
// its bytes; truncation keeps what is past the new size zero; fsynced
// small files, and a fsynced small file that grew since (its bytes moved
// but never written back), survive a crash.
func TestSmallFilesLiveInTheInode(t *testing.T) {
	addr := startNode(t, 0)
	e := mount(t, addr, "", 4<<20)
	small := bytes.Repeat([]byte("small "), 170) // 1020 bytes
	for _, name := range []string{"a", "b", "grows", "shrinks"} {
		require.NoError(t, os.WriteFile(e.path(name), small, 0o644))
	}
	var st syscall.Stat_t
	require.NoError(t, syscall.Stat(e.path("a"), &st))
	assert.Equal(t, int64(8), st.Blocks, "du counts a page")
	assert.Zero(t, fileVolumes(t, e), "no volume holds a small file")

	// shrinks: cut, then grown again: the cut bytes read as zeroes.
	require.NoError(t, os.Truncate(e.path("shrinks"), 10))
	require.NoError(t, os.Truncate(e.path("shrinks"), 3000))
	want := append(append([]byte{}, small[:10]...), make([]byte, 2990)...)
	got, err := os.ReadFile(e.path("shrinks"))
	require.NoError(t, err)
	assert.Equal(t, want, got)

	syncAll(t, e.dir)
	// grows: fsynced small, then written past a page and never fsynced:
	// its first bytes were acknowledged and must survive.
	f, err := os.OpenFile(e.path("grows"), os.O_WRONLY, 0)
	require.NoError(t, err)
	_, err = f.WriteAt(bytes.Repeat([]byte{7}, 10000), 5000)
	require.NoError(t, err)
	require.NoError(t, f.Close())
	syncDir(t, e.dir) // the metadata now names the volume, not the bytes
	assert.Equal(t, 1, fileVolumes(t, e), "the grown file moved to a volume with its first bytes")
	dir := e.dir
	e.crash()

	e = mount(t, addr, dir, 4<<20)
	for _, name := range []string{"a", "b"} {
		got, err := os.ReadFile(e.path(name))
		require.NoError(t, err)
		assert.Equal(t, small, got, name)
	}
	got, err = os.ReadFile(e.path("shrinks"))
	require.NoError(t, err)
	assert.Equal(t, want, got)
	got, err = os.ReadFile(e.path("grows"))
	require.NoError(t, err)
	require.Len(t, got, 15000)
	assert.Equal(t, small, got[:len(small)], "the fsynced bytes of a file that grew past its inode")
}

// TestManySmallFiles: tar x of 10,000 small files and cp -r of this
// repository onto the mount read back the same (diff -r) after a clean
// remount, and after a crash once every file was fsynced; the node holds
// no more than a volume per file past a page.
func TestManySmallFiles(t *testing.T) {
	if testing.Short() {
		t.Skip("thousands of files")
	}
	need(t, "tar")
	need(t, "diff")
	src := t.TempDir()
	testutil.SmallFiles(t, src, testutil.Soak(t, 3000, 10000))
	run := func(name string, args ...string) {
		t.Helper()
		out, err := exec.Command(name, args...).CombinedOutput()
		require.NoError(t, err, "%s %v: %s", name, args, out)
	}
	run("tar", "-C", src, "-cf", src+"/tree.tar", "tree")
	// The repository's sources as they are now, without .git: a tree of
	// real files of every size that does not change under the test.
	cwd, err := os.Getwd()
	require.NoError(t, err)
	repo := filepath.Join(src, "repo")
	require.NoError(t, os.Mkdir(repo, 0o755))
	run("sh", "-c", "tar -C "+cwd+"/.. --exclude=.git --exclude=bin -cf - . | tar -C "+repo+" -xf -")

	addr := startNode(t, 0)
	e := mount(t, addr, "", 16<<20)
	dir := e.dir
	run("tar", "-C", dir, "-xf", src+"/tree.tar")
	run("cp", "-r", repo, dir+"/repo")
	e.unmount()
	e = mount(t, addr, dir, 16<<20)
	run("diff", "-r", src+"/tree", dir+"/tree")
	run("diff", "-r", repo, dir+"/repo")

	// Again, fsynced file by file, and the host killed.
	run("rm", "-rf", dir+"/tree", dir+"/repo")
	run("tar", "-C", dir, "-xf", src+"/tree.tar")
	run("cp", "-r", repo, dir+"/repo")
	testutil.FsyncTree(t, dir+"/tree")
	testutil.FsyncTree(t, dir+"/repo")
	e.crash()
	e = mount(t, addr, dir, 16<<20)
	run("diff", "-r", src+"/tree", dir+"/tree")
	run("diff", "-r", repo, dir+"/repo")
	var large int
	require.NoError(t, filepath.Walk(dir+"/repo", func(_ string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() && fi.Size() > 4096 {
			large++
		}
		return err
	}))
	assert.LessOrEqual(t, fileVolumes(t, e), large, "a volume only for files past a page")
}

// TestAppendsReadNothingBack: a file grown by unaligned appends, each
// written back (fsync), past a cache too small to keep its pages, never
// reads a page from the memory node: the page past the file's end that a
// write covers in part was never written, so it starts from zeroes. The
// bytes are all there after a remount.
func TestAppendsReadNothingBack(t *testing.T) {
	// The kernel's copy of the page at the file's end spares the host a
	// read of it: a page-cache drop (another package's benchmark test)
	// midway would make the kernel read it back.
	testutil.LockPageCache(t)
	addr := startNode(t, 0)
	e := mount(t, addr, "", 1<<20)
	path := e.path("log")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	require.NoError(t, err)
	var want []byte
	chunk := bytes.Repeat([]byte("0123456789abcdef"), 1000/16+1)[:1000]
	reads := e.st.Stats().RemoteReads
	for i := range 40 {
		chunk[0] = byte(i)
		_, err := f.Write(chunk)
		require.NoError(t, err)
		want = append(want, chunk...)
		require.NoError(t, f.Sync())
		// Other files' pages push this one's out of the 1 MiB cache.
		writeSynced(t, e.path("filler"), make([]byte, 2<<20))
	}
	require.NoError(t, f.Close())
	assert.Equal(t, reads, e.st.Stats().RemoteReads, "pages read back from the memory node")
	assert.Positive(t, e.st.Stats().FreshWrites)

	e.unmount()
	e = mount(t, addr, e.dir, 1<<20)
	got, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.True(t, bytes.Equal(want, got), "the file's bytes after a remount")
}

// writeSynced writes path as os.WriteFile does, and fsyncs it.
func writeSynced(t *testing.T, path string, data []byte) {
	t.Helper()
	f, err := os.Create(path)
	require.NoError(t, err)
	_, err = f.Write(data)
	require.NoError(t, err)
	require.NoError(t, f.Sync())
	require.NoError(t, f.Close())
}
